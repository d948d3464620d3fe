// Package order is minishop's Order aggregate: a customer's order, priced
// from the catalog, that is placed, then paid or cancelled. Each change is
// validated by a method and recorded as a past-tense event.
package order

import (
	"errors"
	"fmt"
	"math"
	"unicode"
	"unicode/utf8"

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
	ErrTooManyItems  = fmt.Errorf("order: an order has at most %d items", MaxItems)
	ErrBadQuantity   = fmt.Errorf("order: quantity must be from 1 to %d", MaxQty)
	ErrUnknownSKU    = errors.New("order: unknown sku")
	ErrNoCustomer    = errors.New("order: customer id is required")
	ErrBadCustomer   = fmt.Errorf("order: customer id must be at most %d bytes of printable UTF-8", MaxCustomerIDLen)
	ErrOverflow      = errors.New("order: amount out of range")
	ErrNotPayable    = errors.New("order: only a placed order can be paid")
	ErrNotCancelable = errors.New("order: only a placed order can be cancelled")
)

// Bounds of an order, documented in the API: at most MaxItems lines, each
// of 1 to MaxQty units, for a customer id of 1 to MaxCustomerIDLen bytes of
// printable UTF-8.
const (
	MaxItems         = 100
	MaxQty           = 1000
	MaxCustomerIDLen = 64
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
	// CancelReason says why the shop cancelled the order ("" when the
	// customer did).
	CancelReason string `gorm:"size:200;not null;default:''"`
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

// OrderPaymentFailed is recorded when a payment of a placed order is
// declined; the order stays placed and can be paid again. Wire:
// {"order_id","amount_cents","reason"}.
type OrderPaymentFailed struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Reason      string `json:"reason"`
}

// EventType implements aggregate.Event.
func (OrderPaymentFailed) EventType() string { return "order.payment_failed" }

// OrderCancelled is recorded when an order is cancelled. Wire:
// {"order_id","reason"}, reason omitted when the customer cancelled.
type OrderCancelled struct {
	OrderID string `json:"order_id"`
	Reason  string `json:"reason,omitempty"`
}

// EventType implements aggregate.Event.
func (OrderCancelled) EventType() string { return "order.cancelled" }

// Place prices the items from the catalog and returns a new order with the
// given id, recording OrderPlaced.
func Place(id, customerID string, lines []Item, catalog Catalog) (*Order, error) {
	if err := checkCustomerID(customerID); err != nil {
		return nil, err
	}
	switch {
	case len(lines) == 0:
		return nil, ErrNoItems
	case len(lines) > MaxItems:
		return nil, fmt.Errorf("%w: it has %d", ErrTooManyItems, len(lines))
	}
	o := &Order{CustomerID: customerID, Status: StatusPlaced}
	o.ID = id
	for _, l := range lines {
		if l.Qty < 1 || l.Qty > MaxQty {
			return nil, fmt.Errorf("%w: %q has quantity %d", ErrBadQuantity, l.SKU, l.Qty)
		}
		price, ok := catalog[l.SKU]
		if !ok {
			return nil, fmt.Errorf("%w: %q", ErrUnknownSKU, l.SKU)
		}
		line, err := mulCents(price, int64(l.Qty))
		if err == nil {
			o.TotalCents, err = addCents(o.TotalCents, line)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: the total of %q", err, l.SKU)
		}
		o.Items = append(o.Items, Item{SKU: l.SKU, Qty: l.Qty, PriceCents: price})
	}
	o.Record(OrderPlaced{OrderID: id, CustomerID: customerID, Items: o.Items, TotalCents: o.TotalCents})
	return o, nil
}

// checkCustomerID returns ErrNoCustomer or ErrBadCustomer for an id that
// is empty, too long, not UTF-8 or holds a control or invisible format
// character: two ids that print alike must be the same id.
func checkCustomerID(id string) error {
	switch {
	case id == "":
		return ErrNoCustomer
	case len(id) > MaxCustomerIDLen:
		return fmt.Errorf("%w: it is %d bytes", ErrBadCustomer, len(id))
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: it is not valid UTF-8", ErrBadCustomer)
	}
	for _, r := range id {
		if !unicode.IsPrint(r) && r != ' ' {
			return fmt.Errorf("%w: it holds %U", ErrBadCustomer, r)
		}
	}
	return nil
}

// mulCents returns a*b, or ErrOverflow when it does not fit an int64.
// Amounts here are never negative.
func mulCents(a, b int64) (int64, error) {
	if a < 0 || b < 0 || (b != 0 && a > math.MaxInt64/b) {
		return 0, ErrOverflow
	}
	return a * b, nil
}

// addCents returns a+b, or ErrOverflow when it does not fit an int64.
func addCents(a, b int64) (int64, error) {
	if a < 0 || b < 0 || a > math.MaxInt64-b {
		return 0, ErrOverflow
	}
	return a + b, nil
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

// PaymentFailed records that paying a placed order was declined for
// reason. The order stays placed, so it can be paid again.
func (o *Order) PaymentFailed(reason string) error {
	if o.Status != StatusPlaced {
		return fmt.Errorf("%w (status %s)", ErrNotPayable, o.Status)
	}
	o.Record(OrderPaymentFailed{OrderID: o.ID, AmountCents: o.TotalCents, Reason: reason})
	return nil
}

// Cancel cancels a placed order at the customer's request, recording
// OrderCancelled.
func (o *Order) Cancel() error { return o.CancelBecause("") }

// CancelBecause cancels a placed order for reason (the shop's, such as
// stock it does not have), recording OrderCancelled with the reason.
func (o *Order) CancelBecause(reason string) error {
	if o.Status != StatusPlaced {
		return fmt.Errorf("%w (status %s)", ErrNotCancelable, o.Status)
	}
	o.Status = StatusCancelled
	o.CancelReason = reason
	o.Record(OrderCancelled{OrderID: o.ID, Reason: reason})
	return nil
}
