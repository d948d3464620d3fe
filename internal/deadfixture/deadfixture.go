// Package deadfixture starts a consumer group whose handler fails for good
// until it is fixed, with two events already sent to it: the dead letters
// the command's and the console's dead-letter tests act on.
package deadfixture

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/rabbitmq"
)

// SKUOrdered is the event the fixture publishes, one per SKU.
type SKUOrdered struct {
	SKU string `json:"sku"`
}

// EventType names the event.
func (SKUOrdered) EventType() string { return "sku.ordered" }

// Applied is what the fixture's consumer writes per event it applies.
type Applied struct {
	MessageID string `gorm:"primaryKey"`
}

// Fixture is a running consumer group, two partitions, with a dead-letter
// queue, whose handler rejects every event as permanent ("unknown sku …")
// until Fix is called.
type Fixture struct {
	// Group is the consumer group.
	Group string
	// AMQP is the broker configuration of the group's exchange (nil on the
	// database bus).
	AMQP *rabbitmq.Config
	// Dead is the group's dead letters, on its bus.
	Dead *consumer.DeadLetters
	// IDs are the message ids of the two events published, for the SKUs
	// "kiwi" (aggregate sku/kiwi) and then "fig" (sku/fig).
	IDs []string

	db    *gorm.DB
	fixed atomic.Bool
}

// Start migrates the inbox and Applied in db, starts the group (named
// prefix and a random lower-case suffix) on ex, and publishes the two events. It does
// not wait for them to be dead-lettered. The consumer stops when the test
// ends.
func Start(t testing.TB, db *gorm.DB, ex *testenv.Exchange, prefix string) *Fixture {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, inbox.Migrate(ctx, db))
	require.NoError(t, db.AutoMigrate(&Applied{}))
	f := &Fixture{
		Group: prefix + strings.ToLower(aggregate.NewID()[18:]),
		AMQP:  &rabbitmq.Config{URL: ex.URL, Exchange: ex.Name},
		db:    db,
	}
	f.Dead = consumer.RabbitMQDeadLetters(f.AMQP)
	ex.Queues(consumer.DeadLetterQueue(f.Group))
	ex.Partitioned(f.Group, 2)
	c, err := consumer.NewAMQP(ctx, db, f.AMQP, f.config())
	require.NoError(t, err)
	pub, err := rabbitmq.NewPublisher(ctx, f.AMQP)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	f.run(t, c, pub)
	return f
}

// StartDatabase is Start on the database bus in db (which it migrates),
// with no broker: the group's consumer is consumer.NewDatabase's.
func StartDatabase(t testing.TB, db *gorm.DB, prefix string) *Fixture {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, inbox.Migrate(ctx, db))
	require.NoError(t, dbbus.Migrate(ctx, db))
	require.NoError(t, db.AutoMigrate(&Applied{}))
	f := &Fixture{Group: prefix + strings.ToLower(aggregate.NewID()[18:]), Dead: consumer.DatabaseDeadLetters(db), db: db}
	bus, err := dbbus.New(db, &dbbus.Config{PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = bus.Close() })
	c, err := consumer.NewDatabase(db, bus, f.config())
	require.NoError(t, err)
	f.run(t, c, bus)
	return f
}

// config is the group's consumer configuration.
func (f *Fixture) config() *consumer.Config {
	return &consumer.Config{Group: f.Group, Partitions: 2, DisableHoldBack: true}
}

// run adds the handler to c, runs it until the test ends and publishes
// the two events with pub.
func (f *Fixture) run(t testing.TB, c *consumer.Consumer, pub message.Publisher) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e SKUOrdered, env *messaging.Envelope) error {
		if !f.fixed.Load() {
			return consumer.Permanent(errors.New("unknown sku " + e.SKU))
		}
		return tx.Create(&Applied{MessageID: env.ID}).Error
	}))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	<-c.Running()

	for i, sku := range []string{"kiwi", "fig"} {
		body, err := json.Marshal(SKUOrdered{SKU: sku})
		require.NoError(t, err)
		m, err := messaging.NewMessage(&outbox.Message{ID: aggregate.NewID(), TenantID: "default", Topic: "sku.ordered",
			AggregateType: "sku", AggregateID: sku, AggregateVersion: int64(i + 1), SchemaVersion: 1, Payload: body,
			OccurredAt: time.Now().UTC()})
		require.NoError(t, err)
		require.NoError(t, pub.Publish("sku.ordered", m))
		f.IDs = append(f.IDs, m.UUID)
	}
}

// Fix makes the handler apply the events it receives from now on.
func (f *Fixture) Fix() { f.fixed.Store(true) }

// Applied counts the events the consumer applied.
func (f *Fixture) Applied(t testing.TB) int64 {
	t.Helper()
	var n int64
	require.NoError(t, f.db.Model(&Applied{}).Count(&n).Error)
	return n
}
