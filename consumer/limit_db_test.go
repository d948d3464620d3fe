package consumer_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// orderMsg is an order.placed event of aggregate order/id at version v.
func orderMsg(t *testing.T, id string, v int64) *message.Message {
	t.Helper()
	body, err := json.Marshal(OrderPlaced{OrderID: id, SKU: "kiwi", Qty: 1})
	require.NoError(t, err)
	m, err := messaging.NewMessage(&outbox.Message{
		ID: aggregate.NewID(), TenantID: "default", Topic: "order.placed", AggregateType: "order",
		AggregateID: id, AggregateVersion: v, SchemaVersion: 2, Payload: body, OccurredAt: time.Now().UTC(),
	})
	require.NoError(t, err)
	return m
}

// TestDatabaseBusLimitDeadLettersFirstWithAHold: on the database bus
// (delivery limit 5), a consumer whose own DeliveryLimit is 3 and whose
// crash counting is off receives a message the bus delivered twice
// before (two processes died holding it, as messaging.MetaDeliveryCount
// says): at its last delivery below the limit the consumer dead-letters
// it itself, as poison, without running the handler, and holds its
// aggregate back, so the aggregate's next version is parked, not applied;
// the bus dead-letters nothing, and a healthy neighbour is applied once.
// NewDatabase takes the bus's limit by default and never goes above it.
func TestDatabaseBusLimitDeadLettersFirstWithAHold(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := t.Context()
		require.NoError(t, outbox.Migrate(ctx, db))
		require.NoError(t, inbox.Migrate(ctx, db))
		require.NoError(t, dbbus.Migrate(ctx, db))
		bus, err := dbbus.New(db, &dbbus.Config{PollInterval: 20 * time.Millisecond, DeliveryLimit: 5, Logger: quiet})
		require.NoError(t, err)
		t.Cleanup(func() { _ = bus.Close() })
		group := "g" + aggregate.NewID()[16:]

		for own, want := range map[int]int{0: 5, 9: 5, 3: 3} {
			cfg := consumer.DefaultConfig(group + "x")
			cfg.Logger, cfg.Registerer, cfg.DeliveryLimit = quiet, prometheus.NewRegistry(), own
			c, err := consumer.NewDatabase(db, bus, cfg)
			require.NoError(t, err)
			assert.Equal(t, want, c.Config().DeliveryLimit, "DeliveryLimit %d on a bus whose limit is 5", own)
		}

		require.NoError(t, dbbus.DeclarePartitions(ctx, db, group, 2, "order.placed"))
		poison, next, neighbour := orderMsg(t, "o-1", 1), orderMsg(t, "o-1", 2), orderMsg(t, "o-2", 1)
		require.NoError(t, bus.Publish("order.placed", poison, next, neighbour))
		require.NoError(t, db.Exec(`UPDATE dbbus_deliveries SET attempts = 2 WHERE message_id = ?`, poison.UUID).Error)

		cfg := consumer.DefaultConfig(group)
		cfg.Partitions, cfg.DeliveryLimit, cfg.MaxCrashes = 2, 3, -1
		cfg.Logger, cfg.Registerer = quiet, prometheus.NewRegistry()
		c, err := consumer.NewDatabase(db, bus, cfg)
		require.NoError(t, err)
		var mu sync.Mutex
		calls := map[string]int{}
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, ev OrderPlaced, env *messaging.Envelope) error {
			mu.Lock()
			calls[env.ID]++
			mu.Unlock()
			return tx.Create(&Effect{MessageID: env.ID}).Error
		}))
		require.NoError(t, db.AutoMigrate(&Effect{}))
		run(t, c)

		dead := consumer.DatabaseDeadLetters(db)
		var got []consumer.DeadLetter
		testenv.WaitFor(t, 20*time.Second, "the poison dead-lettered and the neighbour applied", func() bool {
			got, err = dead.List(ctx, group, consumer.DeadFilter{}, 10)
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			return len(got) == 1 && calls[neighbour.UUID] == 1
		})
		assert.Equal(t, poison.UUID, got[0].MessageID)
		assert.Equal(t, consumer.CausePoison, got[0].Cause)
		assert.Contains(t, got[0].Error, consumer.ErrCrashed.Error(), "dead-lettered by the consumer, not by the bus")
		assert.NotContains(t, got[0].Error, "dbbus:")
		var holds []string
		require.NoError(t, db.Raw(`SELECT message_id FROM inbox_holds WHERE consumer = ? AND aggregate_id = 'o-1'`, group).
			Scan(&holds).Error)
		assert.Equal(t, []string{poison.UUID}, holds, "the poison holds its aggregate back")
		testenv.WaitFor(t, 10*time.Second, "the next version parked", func() bool {
			var n int64
			require.NoError(t, db.Raw(`SELECT count(*) FROM inbox_parked WHERE consumer = ? AND message_id = ?`, group, next.UUID).
				Scan(&n).Error)
			return n == 1
		})
		mu.Lock()
		assert.Zero(t, calls[poison.UUID], "the handler ran the poison")
		assert.Zero(t, calls[next.UUID], "the held aggregate's next version was applied")
		assert.Equal(t, 1, calls[neighbour.UUID])
		mu.Unlock()
		n, err := dbbus.Depth(ctx, db, dbbus.UnroutableGroup)
		require.NoError(t, err)
		assert.Zero(t, n)
	})
}
