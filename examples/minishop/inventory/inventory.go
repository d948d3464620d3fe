// Package inventory is minishop's stock: a Stock row per sku (on hand and
// reserved) and a Reservation aggregate per order that holds the reserved
// items and records stock.reserved and stock.released, or stock.rejected
// when there is not enough available: stock never goes negative.
package inventory

import (
	"errors"
	"fmt"

	"github.com/bentoevents/bento/aggregate"
)

// SeedOnHand is the stock each catalog sku starts with.
const SeedOnHand = 1_000_000

// Errors returned by the inventory's methods.
var (
	ErrAlreadyReleased = errors.New("inventory: reservation already released")
	ErrBadQuantity     = errors.New("inventory: quantity must be at least 1")
	// ErrInsufficientStock is returned by Reserve when a sku has fewer
	// units on hand and not yet reserved than an order asks for.
	ErrInsufficientStock = errors.New("inventory: not enough stock")
)

// Stock is one sku's stock. It is an aggregate so concurrent reservations of
// the same sku are serialised by its version check; it records no events of
// its own (the Reservation does).
type Stock struct {
	aggregate.Base
	OnHand   int64 `gorm:"not null"`
	Reserved int64 `gorm:"not null"`
}

// AggregateType implements aggregate.Root.
func (*Stock) AggregateType() string { return "stock" }

// SKU returns the stock's sku (its id).
func (s *Stock) SKU() string { return s.ID }

// Item is a reserved line: a sku and a quantity.
type Item struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

// Items is stored as a JSON column.
type Items []Item

// Reservation statuses.
const (
	StatusReserved = "reserved"
	StatusReleased = "released"
	StatusRejected = "rejected" // nothing was reserved
)

// Reservation is the stock held for one order; its id is the order id.
type Reservation struct {
	aggregate.Base
	Status string `gorm:"size:16;not null"`
	Items  Items  `gorm:"serializer:json;not null"`
}

// AggregateType implements aggregate.Root.
func (*Reservation) AggregateType() string { return "reservation" }

// StockReserved is recorded when an order's items are reserved. Wire:
// {"order_id","items":[{"sku","qty"}]}.
type StockReserved struct {
	OrderID string `json:"order_id"`
	Items   Items  `json:"items"`
}

// EventType implements aggregate.Event.
func (StockReserved) EventType() string { return "stock.reserved" }

// StockReleased is recorded when an order's reservation is released. Wire:
// {"order_id","items":[{"sku","qty"}]}.
type StockReleased struct {
	OrderID string `json:"order_id"`
	Items   Items  `json:"items"`
}

// EventType implements aggregate.Event.
func (StockReleased) EventType() string { return "stock.released" }

// StockRejected is recorded when an order asks for more than is available;
// nothing is reserved. Wire: {"order_id","items":[{"sku","qty"}],"reason"}.
type StockRejected struct {
	OrderID string `json:"order_id"`
	Items   Items  `json:"items"`
	Reason  string `json:"reason"`
}

// EventType implements aggregate.Event.
func (StockRejected) EventType() string { return "stock.rejected" }

// Available is what can still be reserved: on hand and not reserved.
func (s *Stock) Available() int64 { return s.OnHand - s.Reserved }

// Reserve reserves items for orderID against stocks (one per sku, in items'
// order) and returns the new reservation, recording StockReserved.
func Reserve(orderID string, items Items, stocks []*Stock) (*Reservation, error) {
	if len(items) != len(stocks) {
		return nil, fmt.Errorf("inventory: %d items but %d stocks", len(items), len(stocks))
	}
	for i, it := range items {
		if it.Qty < 1 {
			return nil, fmt.Errorf("%w: %s has %d", ErrBadQuantity, it.SKU, it.Qty)
		}
		if int64(it.Qty) > stocks[i].Available() {
			return nil, fmt.Errorf("%w: %d %s asked, %d available", ErrInsufficientStock, it.Qty, it.SKU, stocks[i].Available())
		}
	}
	for i, it := range items { // all or nothing: checked above
		stocks[i].Reserved += int64(it.Qty)
	}
	r := &Reservation{Status: StatusReserved, Items: items}
	r.ID = orderID
	r.Record(StockReserved{OrderID: orderID, Items: items})
	return r, nil
}

// Reject returns the reservation of an order that could not be reserved,
// recording StockRejected with reason; it holds nothing.
func Reject(orderID string, items Items, reason string) *Reservation {
	r := &Reservation{Status: StatusRejected, Items: items}
	r.ID = orderID
	r.Record(StockRejected{OrderID: orderID, Items: items, Reason: reason})
	return r
}

// Release gives the reservation's items back to stocks (one per item, in
// order), recording StockReleased.
func (r *Reservation) Release(stocks []*Stock) error {
	if r.Status != StatusReserved {
		return fmt.Errorf("%w: order %s", ErrAlreadyReleased, r.ID)
	}
	if len(r.Items) != len(stocks) {
		return fmt.Errorf("inventory: %d items but %d stocks", len(r.Items), len(stocks))
	}
	for i, it := range r.Items {
		stocks[i].Reserved -= int64(it.Qty)
	}
	r.Status = StatusReleased
	r.Record(StockReleased{OrderID: r.ID, Items: r.Items})
	return nil
}
