package dbbus_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// countBodies counts the message bodies the bus holds.
func countBodies(t *testing.T, db *gorm.DB) int {
	t.Helper()
	return int(rows(t, db, "dbbus_messages"))
}

// createdAt is at as the bus stores dbbus_messages.created_at: a
// timestamptz on PostgreSQL, CURRENT_TIMESTAMP's UTC text on SQLite.
func createdAt(db *gorm.DB, at time.Time) any {
	if db.Dialector.Name() == "sqlite" {
		return at.UTC().Format("2006-01-02 15:04:05")
	}
	return at
}

// TestPurgeUnroutable keeps unroutable messages of two ages: a purge by
// age must delete only the old ones, with their bodies, and leave a
// routed message alone; a purge of all must delete the rest.
func TestPurgeUnroutable(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{})
		ctx := t.Context()
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing", "order.*"))
		for range 3 {
			require.NoError(t, bus.Publish("stock.reserved", newMessage(`{}`)))
		}
		// Age the three by an hour.
		require.NoError(t, db.Exec(`UPDATE dbbus_messages SET created_at = ? WHERE topic = 'stock.reserved'`,
			createdAt(db, time.Now().Add(-time.Hour))).Error)
		require.NoError(t, bus.Publish("stock.released", newMessage(`{}`)))
		require.NoError(t, bus.Publish("order.paid", newMessage(`{}`)))
		st, err := dbbus.Stats(ctx, db, dbbus.UnroutableGroup)
		require.NoError(t, err)
		assert.Equal(t, dbbus.QueueStats{Ready: 4, Queues: []string{dbbus.UnroutableGroup}}, st)

		n, err := dbbus.PurgeUnroutable(ctx, db, 30*time.Minute)
		require.NoError(t, err)
		assert.Equal(t, 3, n)
		assert.Equal(t, 1, depth(t, db, dbbus.UnroutableGroup))
		assert.Equal(t, 1, depth(t, db, "billing"))
		assert.Equal(t, 2, countBodies(t, db))

		n, err = dbbus.PurgeUnroutable(ctx, db, 0)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		assert.Equal(t, 0, depth(t, db, dbbus.UnroutableGroup))
		assert.Equal(t, 1, depth(t, db, "billing"), "a routed message must stay")
		assert.Equal(t, 1, countBodies(t, db))
	})
}

// TestDeleteGroup retires a partitioned group that holds ready and leased
// deliveries, beside a group bound to the same topic: the retired group's
// deliveries, bindings, partitions and owners must go, the other group's
// copy and its body must stay, and a message published afterwards must
// reach only the other group (the retired one no longer collects copies).
func TestDeleteGroup(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{})
		ctx := t.Context()
		require.NoError(t, dbbus.DeclarePartitions(ctx, db, "shipping", 2, "order.*"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing", "order.*"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "shipping.dead", "dead.shipping"))
		for range 4 {
			require.NoError(t, bus.Publish("order.paid", newMessage(`{}`)))
		}
		require.NoError(t, bus.Publish("dead.shipping", newMessage(`{}`)))
		// Lease one delivery of a partition, as a subscriber that still
		// runs would hold it, and own the queue.
		require.NoError(t, db.Exec(`UPDATE dbbus_deliveries SET lease_token = 'tok'
			WHERE id = (SELECT min(id) FROM dbbus_deliveries WHERE group_name LIKE 'shipping.p%')`).Error)
		var until any = time.Now().Add(time.Hour)
		if db.Dialector.Name() == "sqlite" {
			until = time.Now().Add(time.Hour).UnixMilli()
		}
		require.NoError(t, db.Exec(`INSERT INTO dbbus_queue_owners (queue, owner, leased_until) VALUES (?, 'tok', ?)`,
			messaging.PartitionQueue("shipping", 0), until).Error)
		st, err := dbbus.Stats(ctx, db, "shipping")
		require.NoError(t, err)
		assert.Equal(t, 3, st.Ready)
		assert.Equal(t, 1, st.Leased)
		assert.Equal(t, []string{messaging.PartitionQueue("shipping", 0), messaging.PartitionQueue("shipping", 1)}, st.Queues)

		del, err := dbbus.DeleteGroup(ctx, db, "shipping")
		require.NoError(t, err)
		assert.Equal(t, 4, del.Messages)
		assert.Equal(t, []string{messaging.PartitionQueue("shipping", 0), messaging.PartitionQueue("shipping", 1)}, del.Queues)
		_, err = dbbus.Stats(ctx, db, "shipping")
		require.ErrorIs(t, err, messaging.ErrQueueNotFound)
		var owners int64
		require.NoError(t, db.Raw(`SELECT count(*) FROM dbbus_queue_owners`).Scan(&owners).Error)
		assert.Zero(t, owners)
		assert.Equal(t, 4, depth(t, db, "billing"))
		assert.Equal(t, 5, countBodies(t, db), "billing's copies and the dead letter keep their bodies")

		del, err = dbbus.DeleteGroup(ctx, db, "shipping.dead")
		require.NoError(t, err)
		assert.Equal(t, 1, del.Messages)
		assert.Equal(t, 4, countBodies(t, db))

		require.NoError(t, bus.Publish("order.shipped", newMessage(`{}`)))
		assert.Equal(t, 5, depth(t, db, "billing"))
		assert.Equal(t, 0, depth(t, db, dbbus.UnroutableGroup))

		// Deleting it again removes nothing; the unroutable group is reserved.
		del, err = dbbus.DeleteGroup(ctx, db, "shipping")
		require.NoError(t, err)
		assert.Zero(t, del.Messages)
		_, err = dbbus.DeleteGroup(ctx, db, dbbus.UnroutableGroup)
		require.ErrorIs(t, err, messaging.ErrInvalidName)
	})
}

// TestPostgresMaintainPlans pins the plans of PurgeUnroutable,
// ListUnroutable, ReplayUnroutable and DeleteGroup on a table where nearly
// every row is another group's or leased, analyzed or not: the walk of the
// unroutable group reads dbbus_deliveries_ready, a batch's delete goes by
// primary key, the ages of a batch's messages are read from
// dbbus_messages by primary key, and DeleteGroup reads a queue's ready
// and leased rows through their partial indexes, never by a sequential
// scan. (A replay's and a list's walk is the browse's and the peek's,
// pinned here and in TestPostgresClaimPlans.)
func TestPostgresMaintainPlans(t *testing.T) {
	t.Parallel()
	for _, analyzed := range []bool{false, true} {
		t.Run(fmt.Sprintf("analyzed=%v", analyzed), func(t *testing.T) {
			t.Parallel()
			db, _ := testenv.Postgres(t)
			require.NoError(t, dbbus.Migrate(t.Context(), db))
			skew(t, db)
			require.NoError(t, db.Exec(`INSERT INTO dbbus_deliveries (group_name, message_id)
				SELECT ?, 'lost-' || g FROM generate_series(1, 5) AS g`, dbbus.UnroutableGroup).Error)
			require.NoError(t, db.Exec(`INSERT INTO dbbus_messages (id, topic, metadata, payload)
				SELECT 'other-' || g, 'order.paid', '{}', '' FROM generate_series(1, 10000) AS g`).Error)
			if analyzed {
				require.NoError(t, db.Exec("ANALYZE dbbus_deliveries").Error)
				require.NoError(t, db.Exec("ANALYZE dbbus_messages").Error)
			}
			walk := explainPlan(t, db, dbbus.PeekSQL, map[string]any{"group": dbbus.UnroutableGroup, "after": 0, "limit": 500})
			assertIndexed(t, "the purge's walk", walk, "dbbus_deliveries_ready")
			ids := []int64{30001, 30002, 30003}
			lost := dbbus.UnroutableGroup
			aged := explainPlan(t, db, dbbus.PostgresPurgeUnroutableSQL, map[string]any{"group": lost, "ids": ids, "ms": 3600000})
			assertAnyIndex(t, "the purge by age", aged)
			ages := explainPlan(t, db, dbbus.PostgresAgeSQL, map[string]any{"ids": []string{"other-7", "lost-1"}})
			for _, n := range ages {
				assert.False(t, n.kind == "Seq Scan" && n.relation == "dbbus_messages", "the ages of kept messages scan dbbus_messages: %v", ages)
			}
			assert.Contains(t, fmt.Sprint(ages), "dbbus_messages_pkey", "the ages of kept messages are not read by primary key")
			all := explainPlan(t, db, dbbus.PurgeAllSQL, map[string]any{"group": lost, "ids": ids})
			assertAnyIndex(t, "the purge of all", all)
			ready := explainPlan(t, db, dbbus.PickReadySQL, map[string]any{"group": "billing", "limit": 500})
			assertIndexed(t, "a group's delete: its ready rows", ready, "dbbus_deliveries_ready")
			leased := explainPlan(t, db, dbbus.PickLeasedSQL, map[string]any{"group": "billing", "limit": 500})
			assertIndexed(t, "a group's delete: its leased rows", leased, "dbbus_deliveries_leased")
			del := explainPlan(t, db, dbbus.DeleteIDsSQL, map[string]any{"group": "billing", "ids": ids})
			assertAnyIndex(t, "a group's delete of a batch", del)
		})
	}
}

// assertAnyIndex checks that plan reads dbbus_deliveries through an index
// (a batch of ids given: its primary key, or the partial index of their
// group and state), never sequentially.
func assertAnyIndex(t *testing.T, what string, plan []planNode) {
	t.Helper()
	used := false
	for _, n := range plan {
		if n.kind == "Seq Scan" && n.relation == "dbbus_deliveries" {
			t.Errorf("%s scans dbbus_deliveries sequentially: %v", what, plan)
		}
		used = used || strings.HasPrefix(n.index, "dbbus_deliveries_")
	}
	assert.True(t, used, "%s reads dbbus_deliveries through no index: %v", what, plan)
}

// TestPurgeUnroutableInBatches keeps more unroutable messages than one
// batch holds, all old, then a young one: the purge by age must go on
// from batch to batch, delete every old one and stop at the young one.
func TestPurgeUnroutableInBatches(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{})
		ctx := t.Context()
		const n = 1234
		msgs := make([]*message.Message, n)
		for i := range msgs {
			msgs[i] = newMessage(`{}`)
		}
		require.NoError(t, bus.Publish("stock.reserved", msgs...))
		require.NoError(t, db.Exec(`UPDATE dbbus_messages SET created_at = ?`,
			createdAt(db, time.Now().Add(-time.Hour))).Error)
		require.NoError(t, bus.Publish("stock.released", newMessage(`{}`)))

		deleted, err := dbbus.PurgeUnroutable(ctx, db, time.Minute)
		require.NoError(t, err)
		assert.Equal(t, n, deleted)
		assert.Equal(t, 1, depth(t, db, dbbus.UnroutableGroup))
		assert.Equal(t, 1, countBodies(t, db))
	})
}
