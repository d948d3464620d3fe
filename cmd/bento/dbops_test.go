package main

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/messaging"
)

// TestDatabaseBusDeleteAndPurgeThroughTheBinary runs, with no broker, on
// PostgreSQL and on SQLite: "bento consumer delete --bus database" refuses
// while the group has a dead letter, deletes nothing on a dry run, and
// with --force removes the group and its dead-letter queue, so that a new
// event for it is kept as unroutable; "bento unroutable purge" then
// deletes nothing younger than --older-than and everything with --all.
func TestDatabaseBusDeleteAndPurgeThroughTheBinary(t *testing.T) {
	t.Parallel()
	onBusDatabases(t, func(t *testing.T, db *gorm.DB, dsn string) {
		ctx := t.Context()
		group := "billing"
		require.NoError(t, dbbus.Migrate(ctx, db))
		require.NoError(t, dbbus.DeclarePartitions(ctx, db, group, 2, "sku.*"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, consumer.DeadLetterQueue(group), consumer.DeadLetterTopic(group)))
		bus, err := dbbus.New(db, &dbbus.Config{NoListen: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = bus.Close() })
		publish := func(topic, id string) {
			m := message.NewMessage(id, []byte(`{}`))
			m.Metadata.Set(messaging.MetaAggregateID, id)
			require.NoError(t, bus.Publish(topic, m))
		}
		publish("sku.ordered", "e1")
		publish(consumer.DeadLetterTopic(group), "d1")
		depth := func(q string) int {
			st, err := dbbus.Stats(ctx, db, q)
			require.NoError(t, err)
			return st.Ready + st.Leased
		}

		env := []string{"DATABASE_URL=" + dsn, "AMQP_URL="}
		r := bentoEnv(t, env, "", "consumer", "delete", "--group", group, "--yes")
		assert.Equal(t, 1, r.code, "a dead letter is left")
		assert.Contains(t, r.stderr, "--force")
		r = bentoEnv(t, env, "", "consumer", "delete", "--group", group, "--force", "--dry-run")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "would delete 3 queue(s) with 2 message(s) from the database bus: billing.p0, billing.p1, billing.dead")
		assert.Equal(t, 1, depth(group))
		r = bentoEnv(t, env, "", "consumer", "delete", "--group", group, "--topology")
		assert.Equal(t, 2, r.code, "--topology is RabbitMQ's")
		r = bentoEnv(t, env, "", "consumer", "delete", "--group", group, "--force", "--yes")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "deleted 3 queue(s) with 2 message(s) from the database bus: billing.p0, billing.p1, billing.dead")
		_, err = dbbus.Stats(ctx, db, group)
		require.ErrorIs(t, err, messaging.ErrQueueNotFound)

		publish("sku.ordered", "e2")
		assert.Equal(t, 1, depth(dbbus.UnroutableGroup), "the deleted group no longer collects copies")
		r = bentoEnv(t, env, "", "unroutable", "purge")
		assert.Equal(t, 2, r.code, "neither --older-than nor --all")
		r = bentoEnv(t, env, "", "unroutable", "purge", "--older-than", "1h", "--yes")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "deleted 0 unroutable event(s)")
		r = bentoEnv(t, env, "", "unroutable", "purge", "--all", "--yes")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "deleted 1 unroutable event(s)")
		assert.Zero(t, depth(dbbus.UnroutableGroup))
	})
}
