package consumer_test

import "github.com/bentoevents/bento/aggregate"

// Effect is the row a handler writes: counting them counts applications.
type Effect struct {
	ID        uint `gorm:"primaryKey"`
	MessageID string
}

// Stock is the aggregate a chained handler changes.
type Stock struct {
	aggregate.Base
	Reserved int
}

func (*Stock) AggregateType() string { return "stock" }

type StockReserved struct {
	SKU     string `json:"sku"`
	OrderID string `json:"order_id"`
}

func (StockReserved) EventType() string { return "stock.reserved" }
