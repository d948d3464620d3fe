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

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
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
	// AMQP is the broker configuration of the group's exchange.
	AMQP *rabbitmq.Config
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
	ex.Queues(consumer.DeadLetterQueue(f.Group))
	ex.Partitioned(f.Group, 2)
	c, err := consumer.NewAMQP(ctx, db, f.AMQP, &consumer.Config{Group: f.Group, Partitions: 2, DisableHoldBack: true})
	require.NoError(t, err)
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

	pub, err := rabbitmq.NewPublisher(ctx, f.AMQP)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
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
	return f
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
