package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

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
)

// Notification is what the notification group records for a paid order: the
// example's stand-in for the e-mail of seed 002.
type Notification struct {
	EventID    string    `gorm:"primaryKey;size:26" json:"event_id"`
	OrderID    string    `gorm:"size:64;index" json:"order_id"`
	CustomerID string    `gorm:"size:64" json:"customer_id"`
	Text       string    `json:"text"`
	CreatedAt  time.Time `json:"created_at"`
}

func (a *App) consumerConfig(group string) *inbox.ConsumerConfig {
	cfg := inbox.DefaultConsumerConfig(group)
	cfg.MaxRetries = 10 // optimistic conflicts on hot skus are retried here
	cfg.Logger = a.log
	cfg.Registerer = a.metrics
	return cfg
}

// inventoryConsumer reserves stock on order.placed and releases it on
// order.cancelled, emitting stock.reserved and stock.released. Everything it
// changes commits with its inbox record.
func (a *App) inventoryConsumer() (*inbox.Consumer, error) {
	c, err := a.bus.newConsumer(a.db, a.consumerConfig(inventoryGroup))
	if err != nil {
		return nil, err
	}
	if err := inbox.Handle(c, func(ctx context.Context, e order.OrderPlaced, env *messaging.Envelope) error {
		return a.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			items := mergeItems(e.Items)
			stocks, err := a.loadStocks(ctx, u, items)
			if err != nil {
				return err
			}
			r, err := inventory.Reserve(e.OrderID, items, stocks)
			if err != nil {
				return inbox.Permanent(err)
			}
			return u.Add(r)
		})
	}); err != nil {
		return nil, err
	}
	if err := inbox.Handle(c, func(ctx context.Context, e order.OrderCancelled, env *messaging.Envelope) error {
		return a.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			r, err := uow.Get[inventory.Reservation](ctx, u, e.OrderID)
			if errors.Is(err, uow.ErrNotFound) {
				// order.placed is still being applied by another worker:
				// fail, and the retry finds the reservation.
				return fmt.Errorf("no reservation for order %s yet: %w", e.OrderID, err)
			}
			if err != nil {
				return err
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

// notificationConsumer records one notification per paid order.
func (a *App) notificationConsumer() (*inbox.Consumer, error) {
	c, err := a.bus.newConsumer(a.db, a.consumerConfig(notificationGroup))
	if err != nil {
		return nil, err
	}
	if err := inbox.Handle(c, func(ctx context.Context, e order.OrderPaid, env *messaging.Envelope) error {
		db := uow.DB(ctx, a.db) // the inbox transaction
		var o order.Order
		if err := db.Take(&o, "id = ?", e.OrderID).Error; err != nil {
			return fmt.Errorf("order %s: %w", e.OrderID, err)
		}
		return db.Create(&Notification{
			EventID:    env.ID,
			OrderID:    e.OrderID,
			CustomerID: o.CustomerID,
			Text:       fmt.Sprintf("Payment of %d cents received for order %s; we are packing it.", e.AmountCents, e.OrderID),
		}).Error
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
	return runner{name: inventoryGroup, run: c.Run}, nil
}

func (a *App) notificationRunner() (runner, error) {
	c, err := a.notificationConsumer()
	if err != nil {
		return runner{}, err
	}
	return runner{name: notificationGroup, run: c.Run}, nil
}
