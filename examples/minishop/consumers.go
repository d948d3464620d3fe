package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/examples/minishop/inventory"
	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/uow"
)

// The consumer groups.
const (
	inventoryGroup    = "inventory"
	notificationGroup = "notification"
	orderingGroup     = "ordering"
)

// Notification is what the notification group records for a paid order or
// one the shop cancelled: the example's stand-in for an e-mail.
type Notification struct {
	EventID    string    `gorm:"primaryKey;size:26" json:"event_id"`
	OrderID    string    `gorm:"size:64;index" json:"order_id"`
	CustomerID string    `gorm:"size:64" json:"customer_id"`
	Text       string    `json:"text"`
	CreatedAt  time.Time `json:"created_at"`
}

func (a *App) consumerConfig(group string) *consumer.Config {
	return &consumer.Config{
		Group:      group,
		MaxRetries: 10, // optimistic conflicts on hot skus are retried here
		// Partitioned (the default): each order's events reach a group in
		// version order, so the watermark also skips duplicates of events
		// whose inbox records were purged.
		Versions:   inbox.VersionsIncreasing,
		Logger:     a.log,
		Registerer: a.metrics,
	}
}

// inventoryConsumer reserves stock on order.placed and releases it on
// order.cancelled, emitting stock.reserved and stock.released; an order that
// asks for more than is available reserves nothing and emits
// stock.rejected. Everything it changes commits with its inbox record.
func (a *App) inventoryConsumer() (*consumer.Consumer, error) {
	c, err := a.bus.newConsumer(a.db, a.consumerConfig(inventoryGroup))
	if err != nil {
		return nil, err
	}
	if err := consumer.Handle(c, func(ctx context.Context, _ *gorm.DB, e order.OrderPlaced, _ *messaging.Envelope) error {
		// A unit of work begun with ctx joins the inbox transaction.
		return a.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			items := mergeItems(e.Items)
			stocks, err := a.loadStocks(ctx, u, items)
			if err != nil {
				return err
			}
			r, err := inventory.Reserve(e.OrderID, items, stocks)
			if errors.Is(err, inventory.ErrInsufficientStock) {
				// A fact, not a failure: the ordering group cancels the order.
				return u.Add(inventory.Reject(e.OrderID, items, err.Error()))
			}
			if err != nil {
				return consumer.Permanent(err)
			}
			return u.Add(r)
		})
	}); err != nil {
		return nil, err
	}
	if err := consumer.Handle(c, func(ctx context.Context, _ *gorm.DB, e order.OrderCancelled, _ *messaging.Envelope) error {
		return a.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			r, err := uow.Get[inventory.Reservation](ctx, u, e.OrderID)
			if errors.Is(err, uow.ErrNotFound) {
				// The group is partitioned: an order's events arrive in
				// version order, so its order.placed was applied first
				// and a missing reservation is a bug, not a race.
				return consumer.Permanent(fmt.Errorf("no reservation for cancelled order %s: %w", e.OrderID, err))
			}
			if err != nil {
				return err
			}
			if r.Status == inventory.StatusRejected {
				return nil // cancelled because nothing could be reserved
			}
			stocks, err := a.loadStocks(ctx, u, r.Items)
			if err != nil {
				return err
			}
			return r.Release(stocks)
		})
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// loadStocks loads the stock of each item (sorted by sku, so concurrent
// units lock rows in one order).
func (a *App) loadStocks(ctx context.Context, u *uow.UnitOfWork, items inventory.Items) ([]*inventory.Stock, error) {
	stocks := make([]*inventory.Stock, len(items))
	for i, it := range items {
		s, err := uow.Get[inventory.Stock](ctx, u, it.SKU)
		if err != nil {
			return nil, err
		}
		stocks[i] = s
	}
	return stocks, nil
}

// mergeItems sums the quantities of an order's lines per sku, sorted by sku.
func mergeItems(lines order.Items) inventory.Items {
	qty := map[string]int{}
	for _, l := range lines {
		qty[l.SKU] += l.Qty
	}
	out := make(inventory.Items, 0, len(qty))
	for sku, q := range qty {
		out = append(out, inventory.Item{SKU: sku, Qty: q})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SKU < out[j].SKU })
	return out
}

// orderingConsumer cancels, with the reason, an order whose stock was
// rejected: the chained step after the inventory's. An order already paid
// or cancelled by then is left as it is.
func (a *App) orderingConsumer() (*consumer.Consumer, error) {
	c, err := a.bus.newConsumer(a.db, a.consumerConfig(orderingGroup))
	if err != nil {
		return nil, err
	}
	if err := consumer.Handle(c, func(ctx context.Context, _ *gorm.DB, e inventory.StockRejected, _ *messaging.Envelope) error {
		return a.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			o, err := uow.Get[order.Order](ctx, u, e.OrderID)
			if err != nil {
				return err
			}
			err = o.CancelBecause("out of stock: " + e.Reason)
			if errors.Is(err, order.ErrNotCancelable) {
				a.log.Warn("stock rejected for an order that is no longer placed", "order", e.OrderID, "status", o.Status)
				return nil
			}
			return err
		})
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// notificationConsumer records one notification per paid order, per
// declined payment, per payment reminder and per order the shop cancelled.
func (a *App) notificationConsumer() (*consumer.Consumer, error) {
	c, err := a.bus.newConsumer(a.db, a.consumerConfig(notificationGroup))
	if err != nil {
		return nil, err
	}
	// notify writes through tx, the inbox transaction the handler received.
	notify := func(tx *gorm.DB, env *messaging.Envelope, orderID, text string) error {
		var o order.Order
		if err := tx.Take(&o, "id = ?", orderID).Error; err != nil {
			return fmt.Errorf("order %s: %w", orderID, err)
		}
		return tx.Create(&Notification{EventID: env.ID, OrderID: orderID, CustomerID: o.CustomerID, Text: text}).Error
	}
	if err := consumer.Handle(c, func(_ context.Context, tx *gorm.DB, e order.OrderPaid, env *messaging.Envelope) error {
		return notify(tx, env, e.OrderID,
			fmt.Sprintf("Payment of %d cents received for order %s; we are packing it.", e.AmountCents, e.OrderID))
	}); err != nil {
		return nil, err
	}
	if err := consumer.Handle(c, func(_ context.Context, tx *gorm.DB, e order.OrderPaymentFailed, env *messaging.Envelope) error {
		return notify(tx, env, e.OrderID, fmt.Sprintf("Your payment of %d cents for order %s was declined (%s); the order waits for another payment.",
			e.AmountCents, e.OrderID, e.Reason))
	}); err != nil {
		return nil, err
	}
	if err := consumer.Handle(c, func(_ context.Context, tx *gorm.DB, e PaymentReminder, env *messaging.Envelope) error {
		return notify(tx, env, e.OrderID, fmt.Sprintf("Your card was declined: please pay order %s with another card (reminder %d of %d).",
			e.OrderID, e.Reminder, e.Of))
	}); err != nil {
		return nil, err
	}
	if err := consumer.Handle(c, func(_ context.Context, tx *gorm.DB, e order.OrderCancelled, env *messaging.Envelope) error {
		if e.Reason == "" {
			return nil // the customer cancelled: they know
		}
		return notify(tx, env, e.OrderID, fmt.Sprintf("We are sorry: order %s is cancelled (%s).", e.OrderID, e.Reason))
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// runner is a named part of the process.
type runner struct {
	name string
	run  func(context.Context) error
}

func (a *App) inventoryRunner() (runner, error) {
	c, err := a.inventoryConsumer()
	if err != nil {
		return runner{}, err
	}
	a.consumers = append(a.consumers, c)
	return runner{name: inventoryGroup, run: c.Run}, nil
}

func (a *App) orderingRunner() (runner, error) {
	c, err := a.orderingConsumer()
	if err != nil {
		return runner{}, err
	}
	a.consumers = append(a.consumers, c)
	return runner{name: orderingGroup, run: c.Run}, nil
}

func (a *App) notificationRunner() (runner, error) {
	c, err := a.notificationConsumer()
	if err != nil {
		return runner{}, err
	}
	a.consumers = append(a.consumers, c)
	return runner{name: notificationGroup, run: c.Run}, nil
}
