package consumer_test

import (
	"io"
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/testenv"
)

// TestDeleteDatabase retires a partitioned group of the database bus
// whose dead-letter queue holds a dead letter: Delete must refuse without
// Force, a dry run must count and keep everything, and a forced delete
// must remove both queues, so that a new event matching the group's
// patterns is no longer copied to it (it is kept as unroutable).
func TestDeleteDatabase(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := t.Context()
		require.NoError(t, dbbus.Migrate(ctx, db))
		bus, err := dbbus.New(db, &dbbus.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		require.NoError(t, err)
		t.Cleanup(func() { _ = bus.Close() })
		const group = "bt.retired"
		require.NoError(t, dbbus.DeclarePartitions(ctx, db, group, 2, "order.*"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, consumer.DeadLetterQueue(group), consumer.DeadLetterTopic(group)))
		require.NoError(t, bus.Publish("order.placed", message.NewMessage(watermill.NewUUID(), []byte(`{}`))))
		require.NoError(t, bus.Publish(consumer.DeadLetterTopic(group), message.NewMessage(watermill.NewUUID(), []byte(`{}`))))

		_, err = consumer.DeleteDatabase(ctx, db, group, nil)
		require.ErrorIs(t, err, consumer.ErrDeadLettersLeft)
		found, err := consumer.DeleteDatabase(ctx, db, group, &consumer.DeleteOpts{DryRun: true, Force: true})
		require.NoError(t, err)
		assert.Equal(t, 2, found.Messages)
		st, err := dbbus.Stats(ctx, db, group)
		require.NoError(t, err)
		assert.Equal(t, 1, st.Ready, "a dry run deletes nothing")

		done, err := consumer.DeleteDatabase(ctx, db, group, &consumer.DeleteOpts{Force: true})
		require.NoError(t, err)
		assert.Equal(t, 2, done.Messages)
		require.NoError(t, bus.Publish("order.placed", message.NewMessage(watermill.NewUUID(), []byte(`{}`))))
		n, err := dbbus.Depth(ctx, db, dbbus.UnroutableGroup)
		require.NoError(t, err)
		assert.Equal(t, 1, n, "the retired group must no longer collect copies")
	})
}
