package redisbus_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/examples/redisbus"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/uow"
)

// Notification is what the notification group records for a paid order.
type Notification struct {
	EventID     string `gorm:"primaryKey;size:26"`
	OrderID     string `gorm:"size:64;index"`
	CustomerID  string `gorm:"size:64"`
	AmountCents int64
	CreatedAt   time.Time
}

// notificationGroup is the consumer group of the test.
const notificationGroup = "notification"

// TestMinishopFlowOverRedis runs minishop's order flow with Redis Streams
// as the bus: orders are placed, paid and cancelled in units of work on
// SQLite, the projector relays the outbox to Redis, and a consumer group
// records one notification per paid order through the inbox. Some events
// are relayed before the group exists, some after, and every order.paid is
// published a second time, as a relay does when it loses its lease between
// publish and mark; the inbox absorbs the copies.
func TestMinishopFlowOverRedis(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t, requireRedis(t))
	ctx := context.Background()
	db := openSQLite(t)
	require.NoError(t, outbox.Migrate(ctx, db))
	require.NoError(t, inbox.Migrate(ctx, db))
	require.NoError(t, db.AutoMigrate(&order.Order{}, &Notification{}))
	units, err := uow.New(db, nil)
	require.NoError(t, err)

	pub, err := redisbus.NewPublisher(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	pcfg := projector.DefaultConfig()
	pcfg.Logger = testLogger()
	relay, err := projector.New(units.Outbox(), pub, pcfg)
	require.NoError(t, err)
	drain := func(want int) {
		t.Helper()
		r, err := relay.Drain(ctx)
		require.NoError(t, err)
		require.Equal(t, want, r.Published, "published by the relay: %+v", r)
		require.Zero(t, r.Failed, "failed publishes: %+v", r)
	}

	// Before the group exists: its streams start at their first entry, so
	// it still gets these events.
	var paid, cancelled []string
	paid = append(paid, placeAndPay(t, units, "alice"))
	cancelled = append(cancelled, placeAndCancel(t, units, "bob"))
	drain(4)

	reg := prometheus.NewRegistry()
	notifications := notificationConsumer(t, db, cfg, reg)
	runConsumer(t, notifications)

	// Once it exists.
	paid = append(paid, placeAndPay(t, units, "carol"), placeAndPay(t, units, "dave"))
	cancelled = append(cancelled, placeAndCancel(t, units, "erin"))
	drain(6)

	// Every order.paid a second time: same event id, new stream entry.
	var rows []outbox.Message
	require.NoError(t, db.Where("topic = ?", order.OrderPaid{}.EventType()).Order("id").Find(&rows).Error)
	require.Len(t, rows, len(paid))
	for i := range rows {
		m, err := messaging.NewMessage(&rows[i])
		require.NoError(t, err)
		require.NoError(t, pub.Publish(rows[i].Topic, m))
	}

	// Each paid and cancelled event applied once; each copy skipped.
	events := float64(len(paid) + len(cancelled))
	require.Eventually(t, func() bool {
		return counter(t, reg, "bento_inbox_processed_total") == events &&
			counter(t, reg, "bento_inbox_duplicates_total") >= float64(len(rows))
	}, 30*time.Second, 20*time.Millisecond, "the group did not apply %v events and skip %d copies", events, len(rows))

	var notes []Notification
	require.NoError(t, db.Order("order_id").Find(&notes).Error)
	perOrder := map[string]int{}
	for _, n := range notes {
		perOrder[n.OrderID]++
	}
	assert.Len(t, notes, len(paid), "one notification per paid order: %+v", notes)
	for _, id := range paid {
		assert.Equal(t, 1, perOrder[id], "notifications of paid order %s", id)
	}
	for _, id := range cancelled {
		assert.Zero(t, perOrder[id], "notifications of cancelled order %s", id)
	}
	assert.Equal(t, events, counter(t, reg, "bento_inbox_processed_total"))

	// Nothing was dead-lettered.
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	dead, err := rdb.XLen(ctx, cfg.StreamPrefix+consumer.DeadLetterTopic(notificationGroup)).Result()
	require.NoError(t, err)
	assert.Zero(t, dead, "dead letters")
}

// notificationConsumer is the notification group over Redis: a
// notification per paid order, written in the inbox transaction, and
// nothing for a cancelled one.
func notificationConsumer(t *testing.T, db *gorm.DB, cfg redisbus.Config, reg prometheus.Registerer) *consumer.Consumer {
	t.Helper()
	ccfg := consumer.DefaultConfig(notificationGroup)
	ccfg.RetryInitialInterval = 10 * time.Millisecond
	ccfg.RetryMaxInterval = 100 * time.Millisecond
	ccfg.Logger = testLogger()
	ccfg.Registerer = reg
	c, err := redisbus.NewConsumer(db, cfg, ccfg)
	require.NoError(t, err)
	require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e order.OrderPaid, env *messaging.Envelope) error {
		var o order.Order
		if err := tx.Take(&o, "id = ?", e.OrderID).Error; err != nil {
			return fmt.Errorf("order %s: %w", e.OrderID, err)
		}
		return tx.Create(&Notification{
			EventID: env.ID, OrderID: e.OrderID, CustomerID: o.CustomerID, AmountCents: e.AmountCents,
		}).Error
	}))
	require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e order.OrderCancelled, env *messaging.Envelope) error {
		return nil // a cancelled order notifies nobody
	}))
	return c
}

// runConsumer runs c until the test ends and waits until it reads.
func runConsumer(t *testing.T, c *consumer.Consumer) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			assert.NoError(t, err, "consumer Run")
		case <-time.After(30 * time.Second):
			t.Error("the consumer did not stop within 30s")
		}
	})
	select {
	case <-c.Running():
	case err := <-done:
		t.Fatalf("consumer Run returned before running: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the consumer did not start within 10s")
	}
}

// placeAndPay places an order for customer and pays it, in two units of
// work, and returns its id.
func placeAndPay(t *testing.T, units *uow.Manager, customer string) string {
	t.Helper()
	id := place(t, units, customer)
	require.NoError(t, units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error {
		o, err := uow.Get[order.Order](ctx, u, id)
		if err != nil {
			return err
		}
		return o.Pay()
	}))
	return id
}

// placeAndCancel places an order for customer and cancels it.
func placeAndCancel(t *testing.T, units *uow.Manager, customer string) string {
	t.Helper()
	id := place(t, units, customer)
	require.NoError(t, units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error {
		o, err := uow.Get[order.Order](ctx, u, id)
		if err != nil {
			return err
		}
		return o.Cancel()
	}))
	return id
}

func place(t *testing.T, units *uow.Manager, customer string) string {
	t.Helper()
	id := aggregate.NewID()
	require.NoError(t, units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error {
		o, err := order.Place(id, customer, []order.Item{{SKU: "apple", Qty: 2}, {SKU: "coffee", Qty: 1}},
			order.DefaultCatalog())
		if err != nil {
			return err
		}
		return u.Add(o)
	}))
	return id
}

// openSQLite opens a new SQLite file in a temporary directory.
func openSQLite(t *testing.T) *gorm.DB {
	t.Helper()
	db, err := embedded.OpenSQLite(filepath.Join(t.TempDir(), "shop.db"), nil)
	require.NoError(t, err)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })
	return db
}

// counter reads the inbox counter name of the test's registry.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Errorf("gather metrics: %v", err) // not FailNow: called from require.Eventually's goroutine
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	return 0
}
