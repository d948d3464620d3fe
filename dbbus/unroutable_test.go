package dbbus_test

import (
	"fmt"
	"sync"
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

// keep publishes n messages of event type topic, tenant acme or globex in
// turn, while no group is bound to topic, and returns them in order.
func keep(t *testing.T, bus *dbbus.Bus, topic string, n int) []*message.Message {
	t.Helper()
	msgs := make([]*message.Message, n)
	for i := range msgs {
		m := newMessage(fmt.Sprintf(`{"n":%d}`, i))
		m.Metadata.Set(messaging.MetaEventType, topic)
		m.Metadata.Set(messaging.MetaTenantID, []string{"acme", "globex"}[i%2])
		m.Metadata.Set(messaging.MetaAggregateType, "stock")
		m.Metadata.Set(messaging.MetaAggregateID, fmt.Sprintf("s-%d", i))
		msgs[i] = m
	}
	require.NoError(t, bus.Publish(topic, msgs...))
	return msgs
}

// uuids returns the UUIDs of msgs.
func uuids(msgs []*message.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.UUID
	}
	return out
}

// keptIDs returns the message ids of kept.
func keptIDs(kept []dbbus.Kept) []string {
	out := make([]string, len(kept))
	for i, k := range kept {
		out[i] = k.Message.UUID
	}
	return out
}

// TestReplayUnroutableFansOut keeps three stock.reserved messages and one
// invoice.sent, then binds two groups to stock.* (one of them
// partitioned): the list must show the four, oldest first, with their
// age; a replay of stock.reserved must deliver each of the three once to
// both groups (the partitioned one in the partition of its key), with
// its metadata and payload, and take them out of the unroutable group;
// invoice.sent, replayed with no group bound, stays kept and is reported
// so. A second replay delivers nothing more.
func TestReplayUnroutableFansOut(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{PollInterval: 20 * time.Millisecond})
		ctx := t.Context()
		stock := keep(t, bus, "stock.reserved", 3)
		invoice := keep(t, bus, "invoice.sent", 1)
		require.NoError(t, db.Exec(`UPDATE dbbus_messages SET created_at = ?`, createdAt(db, time.Now().Add(-time.Hour))).Error)

		listed, err := dbbus.ListUnroutable(ctx, db, dbbus.UnroutableFilter{}, 100)
		require.NoError(t, err)
		assert.Equal(t, append(uuids(stock), invoice[0].UUID), keptIDs(listed))
		for _, k := range listed {
			assert.InDelta(t, time.Hour.Seconds(), k.Age.Seconds(), 120, "the age of %s", k.Message.UUID)
		}
		limited, err := dbbus.ListUnroutable(ctx, db, dbbus.UnroutableFilter{EventTypes: []string{"stock.reserved"}}, 2)
		require.NoError(t, err)
		assert.Equal(t, uuids(stock[:2]), keptIDs(limited))
		_, err = dbbus.ListUnroutable(ctx, db, dbbus.UnroutableFilter{}, 0)
		require.ErrorIs(t, err, dbbus.ErrInvalidArgument)

		require.NoError(t, dbbus.DeclareGroup(ctx, db, "audit", "stock.*"))
		require.NoError(t, dbbus.DeclarePartitions(ctx, db, "stock", 4, "stock.#"))
		_, auditCh := subscribe(t, bus, "audit")

		got, err := dbbus.ReplayUnroutable(ctx, db, dbbus.UnroutableFilter{EventTypes: []string{"stock.reserved", "invoice.sent"}})
		require.NoError(t, err)
		require.Len(t, got.Delivered, 3)
		for i, r := range got.Delivered {
			assert.Equal(t, stock[i].UUID, r.Message.UUID)
			part := messaging.PartitionQueue("stock", messaging.PartitionOf(messaging.PartitionKey(stock[i]), 4))
			assert.ElementsMatch(t, []string{"audit", part}, r.Queues, "message %d", i)
			assert.Contains(t, groupIDs(t, db, part), stock[i].UUID, "message %d is not in its partition", i)
		}
		assert.Equal(t, []string{invoice[0].UUID}, keptIDs(got.Kept), "invoice.sent is bound to no group")
		assert.Equal(t, []string{invoice[0].UUID}, groupIDs(t, db, dbbus.UnroutableGroup))
		assert.Equal(t, uuids(stock), groupIDs(t, db, "audit"))
		partitioned := 0
		for p := range 4 {
			partitioned += len(groupIDs(t, db, messaging.PartitionQueue("stock", p)))
		}
		assert.Equal(t, 3, partitioned, "each message once in the partitioned group")

		for i := range stock {
			m := receive(t, auditCh, 5*time.Second)
			assert.Equal(t, stock[i].UUID, m.UUID)
			assert.Equal(t, fmt.Sprintf(`{"n":%d}`, i), string(m.Payload))
			assert.Equal(t, stock[i].Metadata.Get(messaging.MetaTenantID), m.Metadata.Get(messaging.MetaTenantID))
			m.Ack()
		}

		again, err := dbbus.ReplayUnroutable(ctx, db, dbbus.UnroutableFilter{})
		require.NoError(t, err)
		assert.Empty(t, again.Delivered)
		assert.Equal(t, []string{invoice[0].UUID}, keptIDs(again.Kept))
		testenv.WaitFor(t, 5*time.Second, "the acks of audit", func() bool { return depth(t, db, "audit") == 0 })
		assert.Equal(t, 4, countBodies(t, db), "the partitioned group's copies and the kept message keep their bodies")
	})
}

// TestReplayUnroutableByTenant keeps four messages of two tenants: a
// replay for acme must list and deliver acme's two only, globex's stay
// kept and are not reported (they were not selected).
func TestReplayUnroutableByTenant(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{})
		ctx := t.Context()
		msgs := keep(t, bus, "stock.reserved", 4)
		acme := dbbus.UnroutableFilter{TenantID: "acme"}
		listed, err := dbbus.ListUnroutable(ctx, db, acme, 100)
		require.NoError(t, err)
		assert.Equal(t, []string{msgs[0].UUID, msgs[2].UUID}, keptIDs(listed))

		require.NoError(t, dbbus.DeclareGroup(ctx, db, "audit", "stock.*"))
		got, err := dbbus.ReplayUnroutable(ctx, db, acme)
		require.NoError(t, err)
		assert.Len(t, got.Delivered, 2)
		assert.Empty(t, got.Kept)
		assert.Equal(t, []string{msgs[0].UUID, msgs[2].UUID}, groupIDs(t, db, "audit"))
		assert.Equal(t, []string{msgs[1].UUID, msgs[3].UUID}, groupIDs(t, db, dbbus.UnroutableGroup))
	})
}

// TestConcurrentUnroutableReplaysActOnce keeps 250 messages (three
// transactions of a replay), binds a group, and runs two replays at once:
// every message must be delivered by exactly one of them, once, and none
// left kept.
func TestConcurrentUnroutableReplaysActOnce(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		const total = 250
		bus := setup(t, db, dbbus.Config{})
		ctx := t.Context()
		msgs := keep(t, bus, "stock.reserved", total)
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "audit", "stock.*"))
		var (
			wg   sync.WaitGroup
			got  [2]dbbus.UnroutableReplay
			errs [2]error
		)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i], errs[i] = dbbus.ReplayUnroutable(ctx, db, dbbus.UnroutableFilter{})
			}()
		}
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		var delivered []string
		for _, g := range got {
			assert.Empty(t, g.Kept)
			for _, r := range g.Delivered {
				delivered = append(delivered, r.Message.UUID)
			}
		}
		assert.ElementsMatch(t, uuids(msgs), delivered, "a message was delivered twice or not at all")
		assert.ElementsMatch(t, uuids(msgs), groupIDs(t, db, "audit"), "the group holds a message twice or misses one")
		assert.Empty(t, groupIDs(t, db, dbbus.UnroutableGroup))
	})
}
