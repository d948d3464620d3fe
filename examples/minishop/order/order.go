// Package order is minishop's Order aggregate: a customer's order, priced
// from the catalog, that is placed, then paid or cancelled. Each change is
// validated by a method and recorded as a past-tense event.
package order

import (
	"errors"
	"fmt"

	"github.com/bentoevents/bento/aggregate"
)

// Statuses of an order.
const (
	StatusPlaced    = "placed"
	StatusPaid      = "paid"
	StatusCancelled = "cancelled"
)

// Errors returned by the order's methods.
var (
	ErrNoItems       = errors.New("order: an order needs at least one item")
	ErrBadQuantity   = errors.New("order: quantity must be at least 1")
	ErrUnknownSKU    = errors.New("order: unknown sku")
	ErrNoCustomer    = errors.New("order: customer id is required")
	ErrNotPayable    = errors.New("order: only a placed order can be paid")
	ErrNotCancelable = errors.New("order: only a placed order can be cancelled")
)

// Catalog maps a sku to its unit price in cents.
type Catalog map[string]int64

// DefaultCatalog is minishop's seeded catalog: unit prices in cents.
func DefaultCatalog() Catalog {
	return Catalog{"apple": 120, "banana": 80, "coffee": 950, "tea": 600}
}

// Item is one line of an order, priced from the catalog.
type Item struct {
	SKU        string `json:"sku"`
	Qty        int    `json:"qty"`
	PriceCents int64  `json:"price_cents"`
}

// Items is stored as a JSON column.
type Items []Item

// Order is the aggregate, stored in the orders table.
type Order struct {
	aggregate.Base
	CustomerID string `gorm:"size:64;not null"`
	Status     string `gorm:"size:16;not null"`
	Items      Items  `gorm:"serializer:json;not null"`
	TotalCents int64  `gorm:"not null"`
}

// AggregateType implements aggregate.Root.
func (*Order) AggregateType() string { return "order" }

// OrderPlaced is recorded when an order is placed. Wire:
// {"order_id","customer_id","items":[{"sku","qty","price_cents"}],"total_cents"}.
type OrderPlaced struct {
	OrderID    string `json:"order_id"`
	CustomerID string `json:"customer_id"`
	Items      Items  `json:"items"`
	TotalCents int64  `json:"total_cents"`
}

// EventType implements aggregate.Event.
func (OrderPlaced) EventType() string { return "order.placed" }

// OrderPaid is recorded when an order is paid. Wire: {"order_id","amount_cents"}.
type OrderPaid struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// EventType implements aggregate.Event.
func (OrderPaid) EventType() string { return "order.paid" }

// OrderCancelled is recorded when an order is cancelled. Wire: {"order_id"}.
type OrderCancelled struct {
	OrderID string `json:"order_id"`
}

// EventType implements aggregate.Event.
func (OrderCancelled) EventType() string { return "order.cancelled" }

// Place prices the items from the catalog and returns a new order with the
// given id, recording OrderPlaced. s may be nil for the system clock.
func Place(id, customerID string, lines []Item, catalog Catalog, s aggregate.Stamper) (*Order, error) {
	if customerID == "" {
		return nil, ErrNoCustomer
	}
	if len(lines) == 0 {
		return nil, ErrNoItems
	}
	o := &Order{CustomerID: customerID, Status: StatusPlaced}
	o.ID = id
	o.SetStamper(s)
	for _, l := range lines {
		if l.Qty < 1 {
			return nil, fmt.Errorf("%w: %s has quantity %d", ErrBadQuantity, l.SKU, l.Qty)
		}
		price, ok := catalog[l.SKU]
		if !ok {
			return nil, fmt.Errorf("%w: %q", ErrUnknownSKU, l.SKU)
		}
		o.Items = append(o.Items, Item{SKU: l.SKU, Qty: l.Qty, PriceCents: price})
		o.TotalCents += price * int64(l.Qty)
	}
	o.Record(OrderPlaced{OrderID: id, CustomerID: customerID, Items: o.Items, TotalCents: o.TotalCents})
	return o, nil
}

// Pay marks a placed order paid for its total, recording OrderPaid.
func (o *Order) Pay() error {
	if o.Status != StatusPlaced {
		return fmt.Errorf("%w (status %s)", ErrNotPayable, o.Status)
	}
	o.Status = StatusPaid
	o.Record(OrderPaid{OrderID: o.ID, AmountCents: o.TotalCents})
	return nil
}

// Cancel cancels a placed order, recording OrderCancelled.
func (o *Order) Cancel() error {
	if o.Status != StatusPlaced {
		return fmt.Errorf("%w (status %s)", ErrNotCancelable, o.Status)
	}
	o.Status = StatusCancelled
	o.Record(OrderCancelled{OrderID: o.ID})
	return nil
}
