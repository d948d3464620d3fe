package health_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/health"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// TestDatabaseBusCheck: the check of a partitioned group on the database
// bus passes while its ready messages are within the limit, fails with
// ErrBusBacklog naming the ready, leased and dead counts once they are
// over it, and fails for a group never declared.
func TestDatabaseBusCheck(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := t.Context()
		require.NoError(t, dbbus.Migrate(ctx, db))
		require.NoError(t, dbbus.DeclarePartitions(ctx, db, "billing", 2, "order.*"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, consumer.DeadLetterQueue("billing"), consumer.DeadLetterTopic("billing")))
		bus, err := dbbus.New(db, &dbbus.Config{NoListen: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = bus.Close() })
		publish := func(topic string) {
			m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			m.Metadata.Set(messaging.MetaAggregateID, m.UUID)
			require.NoError(t, bus.Publish(topic, m))
		}
		check := health.DatabaseBus(db, "billing", 2)
		assert.Equal(t, "bus billing", check.Name)
		publish("order.placed")
		publish("order.placed")
		publish(consumer.DeadLetterTopic("billing"))
		require.NoError(t, check.Run(ctx))
		publish("order.placed")
		err = check.Run(ctx)
		require.ErrorIs(t, err, health.ErrBusBacklog)
		assert.Contains(t, err.Error(), "3 ready (limit 2), 0 leased, 1 dead")
		require.ErrorIs(t, health.DatabaseBus(db, "nobody", 2).Run(ctx), messaging.ErrQueueNotFound)
	})
}
