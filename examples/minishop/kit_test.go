package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/bentotest"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/examples/minishop/inventory"
	"github.com/bentoevents/bento/examples/minishop/order"
)

// These tests run minishop's commands and consumers in process with
// bentotest: no services, a few milliseconds each.

func newKitApp(t *testing.T) (*bentotest.Env, *App) {
	t.Helper()
	env := bentotest.New(t, nil)
	b := &bus{ // minishop's in-memory bus wiring, on the env's bus
		pub: env.Bus,
		newConsumer: func(db *gorm.DB, cfg *consumer.Config) (*consumer.Consumer, error) {
			cfg.RetryInitialInterval, cfg.RetryMaxInterval = time.Millisecond, 5*time.Millisecond
			return consumer.NewMemory(db, env.Bus, cfg)
		},
		close: func() {},
	}
	require.NoError(t, migrate(context.Background(), env.DB, order.DefaultCatalog()))
	a, err := newApp(env.DB, b, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	inv, err := a.inventoryConsumer()
	require.NoError(t, err)
	notif, err := a.notificationConsumer()
	require.NoError(t, err)
	ordering, err := a.orderingConsumer()
	require.NoError(t, err)
	env.Start(t, ordering)
	env.Start(t, inv)
	env.Start(t, notif)
	return env, a
}

func stock(t *testing.T, env *bentotest.Env, sku string) int64 {
	t.Helper()
	var s inventory.Stock
	require.NoError(t, env.DB.Take(&s, "id = ?", sku).Error)
	return s.Reserved
}

func TestOrderRecordsItsEvents(t *testing.T) {
	t.Parallel()
	o, err := order.Place("o-1", "c1", []order.Item{{SKU: "tea", Qty: 2}}, order.DefaultCatalog(), nil)
	require.NoError(t, err)
	require.NoError(t, o.Pay())
	bentotest.RequireRecorded(t, o,
		bentotest.Want{Topic: "order.placed", Payload: map[string]any{
			"order_id": "o-1", "customer_id": "c1", "total_cents": 1200,
			"items": []map[string]any{{"sku": "tea", "qty": 2, "price_cents": 600}},
		}},
		bentotest.Want{Topic: "order.paid", Payload: order.OrderPaid{OrderID: "o-1", AmountCents: 1200}},
	)
}

func TestInventoryReservesAndReleases(t *testing.T) {
	t.Parallel()
	env, a := newKitApp(t)
	ctx := context.Background()
	o, err := a.PlaceOrder(ctx, "c1", []order.Item{{SKU: "apple", Qty: 2}, {SKU: "apple", Qty: 1}, {SKU: "tea", Qty: 1}})
	require.NoError(t, err)
	env.Drain(t)
	assert.Equal(t, int64(3), stock(t, env, "apple"), "lines of one sku are summed")
	assert.Equal(t, int64(1), stock(t, env, "tea"))
	env.RequirePublished(t,
		bentotest.Want{Topic: "order.placed", AggregateID: o.ID},
		bentotest.Want{Topic: "stock.reserved", AggregateID: o.ID, Payload: inventory.StockReserved{
			OrderID: o.ID, Items: inventory.Items{{SKU: "apple", Qty: 3}, {SKU: "tea", Qty: 1}},
		}},
	)

	_, err = a.CancelOrder(ctx, o.ID)
	require.NoError(t, err)
	env.Drain(t)
	assert.Equal(t, int64(0), stock(t, env, "apple"))
	assert.Equal(t, int64(0), stock(t, env, "tea"))
	published := env.PublishedEvents(t)
	require.Len(t, published, 4)
	assert.Equal(t, "stock.released", published[3].Topic)
	assert.Equal(t, published[2].ID, published[3].Metadata["causation_id"], "released because of order.cancelled")
}

func TestNotificationOncePerPaidOrder(t *testing.T) {
	t.Parallel()
	env, a := newKitApp(t)
	ctx := context.Background()
	o, err := a.PlaceOrder(ctx, "c7", []order.Item{{SKU: "coffee", Qty: 1}})
	require.NoError(t, err)
	_, err = a.PayOrder(ctx, o.ID)
	require.NoError(t, err)
	env.Drain(t)
	count := func() int64 {
		var n int64
		require.NoError(t, env.DB.Model(&Notification{}).Where("order_id = ?", o.ID).Count(&n).Error)
		return n
	}
	require.Equal(t, int64(1), count())

	// A redelivered order.paid — here a message of its own, delivered six
	// times, in a row and at once — adds exactly one notification. It
	// carries the order's next version: the group's version watermark
	// skips an event at or below the last version it applied, whatever
	// its id.
	paid := env.Message(t, order.OrderPaid{OrderID: o.ID, AmountCents: 950}, &bentotest.MessageOpts{AggregateType: "order", AggregateID: o.ID, AggregateVersion: 3})
	env.RequireAppliedOnce(t, paid, count)

	var n Notification
	require.NoError(t, env.DB.Where("order_id = ?", o.ID).First(&n).Error)
	assert.Equal(t, "c7", n.CustomerID)
}
