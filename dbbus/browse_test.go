package dbbus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// deadSetup declares group billing (topic order.paid) and its dead queue
// billing.dead (topic dead.billing), publishes n messages to the dead
// queue and returns the bus and their ids, in publish order.
func deadSetup(t *testing.T, db *gorm.DB, n int) (*dbbus.Bus, []string) {
	t.Helper()
	bus := setup(t, db, dbbus.Config{PollInterval: 20 * time.Millisecond})
	ctx := t.Context()
	require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing", "order.paid"))
	require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing.dead", "dead.billing"))
	ids := make([]string, n)
	msgs := make([]*message.Message, n)
	for i := range n {
		msgs[i] = newMessage(fmt.Sprintf(`{"n":%d}`, i))
		msgs[i].Metadata.Set("dead_reason", "boom")
		ids[i] = msgs[i].UUID
	}
	require.NoError(t, bus.Publish("dead.billing", msgs...))
	return bus, ids
}

// moveAll is a Browse function that moves every delivery to billing,
// dropping its dead_reason and marking it replayed, and records the ids.
func moveAll(mu *sync.Mutex, got *[]string) func(dbbus.Browsed) (dbbus.BrowseAction, error) {
	return func(b dbbus.Browsed) (dbbus.BrowseAction, error) {
		delete(b.Message.Metadata, "dead_reason")
		b.Message.Metadata.Set("replayed", "1")
		mu.Lock()
		*got = append(*got, b.Message.UUID)
		mu.Unlock()
		return dbbus.BrowseAction{MoveTo: "billing"}, nil
	}
}

// groupIDs returns the message ids of group's deliveries, in id order.
func groupIDs(t *testing.T, db *gorm.DB, group string) []string {
	t.Helper()
	var ids []string
	require.NoError(t, db.Raw(`SELECT message_id FROM dbbus_deliveries WHERE group_name = ? ORDER BY id`, group).
		Scan(&ids).Error)
	return ids
}

// TestBrowseRemovesMovesAndLeaves browses a dead queue of five: it
// removes the first, moves the second with new metadata, leaves the rest
// and stops after the fourth. The moved message must reach a subscriber
// of the target group with the new metadata, the removed one's body must
// be gone, and Peek must show the three left in order.
func TestBrowseRemovesMovesAndLeaves(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus, ids := deadSetup(t, db, 5)
		ctx := t.Context()
		_, ch := subscribe(t, bus, "billing")
		var seen []string
		n, err := dbbus.Browse(ctx, db, "billing.dead", 100, func(b dbbus.Browsed) (dbbus.BrowseAction, error) {
			seen = append(seen, b.Message.UUID)
			switch len(seen) {
			case 1:
				return dbbus.BrowseAction{Remove: true}, nil
			case 2:
				delete(b.Message.Metadata, "dead_reason")
				b.Message.Metadata.Set("replayed", "1")
				return dbbus.BrowseAction{MoveTo: "billing"}, nil
			case 4:
				return dbbus.BrowseAction{Stop: true}, nil
			}
			return dbbus.BrowseAction{}, nil
		})
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		assert.Equal(t, ids[:4], seen, "oldest first, stopping after the fourth")

		got := receive(t, ch, 5*time.Second)
		assert.Equal(t, ids[1], got.UUID)
		assert.Equal(t, "1", got.Metadata.Get("replayed"))
		assert.Empty(t, got.Metadata.Get("dead_reason"))
		assert.Equal(t, `{"n":1}`, string(got.Payload))
		got.Ack()

		var bodies int64
		require.NoError(t, db.Raw(`SELECT count(*) FROM dbbus_messages WHERE id = ?`, ids[0]).Scan(&bodies).Error)
		assert.Zero(t, bodies, "the removed message's body is left")
		var left []string
		require.NoError(t, dbbus.Peek(ctx, db, "billing.dead", 100, func(b dbbus.Browsed) bool {
			left = append(left, b.Message.UUID)
			assert.Equal(t, "boom", b.Message.Metadata.Get("dead_reason"))
			return true
		}))
		assert.Equal(t, ids[2:], left)
	})
}

// TestBrowseErrors: an undeclared group or target, a bad limit, and fn's
// error, which keeps what fn said before it in the same transaction.
func TestBrowseErrors(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	_, ids := deadSetup(t, db, 3)
	ctx := t.Context()
	keep := func(dbbus.Browsed) (dbbus.BrowseAction, error) { return dbbus.BrowseAction{}, nil }
	_, err := dbbus.Browse(ctx, db, "nobody.dead", 10, keep)
	require.ErrorIs(t, err, messaging.ErrQueueNotFound)
	require.ErrorIs(t, dbbus.Peek(ctx, db, "billing.dead", 0, func(dbbus.Browsed) bool { return true }), dbbus.ErrInvalidArgument)
	_, err = dbbus.Browse(ctx, db, "bad group", 10, keep)
	require.ErrorIs(t, err, messaging.ErrInvalidName)
	n, err := dbbus.Browse(ctx, db, "billing.dead", 10, func(dbbus.Browsed) (dbbus.BrowseAction, error) {
		return dbbus.BrowseAction{MoveTo: "nobody"}, nil
	})
	require.ErrorIs(t, err, messaging.ErrQueueNotFound)
	assert.Zero(t, n)
	assert.Equal(t, ids, groupIDs(t, db, "billing.dead"), "a failed move changed the queue")

	boom := errors.New("boom")
	calls := 0
	n, err = dbbus.Browse(ctx, db, "billing.dead", 10, func(dbbus.Browsed) (dbbus.BrowseAction, error) {
		calls++
		if calls == 2 {
			return dbbus.BrowseAction{}, boom
		}
		return dbbus.BrowseAction{Remove: true}, nil
	})
	require.ErrorIs(t, err, boom)
	assert.Equal(t, 1, n)
	assert.Equal(t, ids[1:], groupIDs(t, db, "billing.dead"), "the removal before fn's error was not kept")
}

// TestConcurrentBrowsesActOnce runs two browses that move every delivery
// of a dead queue of 250 (three transactions each) at the same time, with
// a subscriber of the target group acking meanwhile: every message must be
// moved by exactly one of them and delivered exactly once, none left
// behind.
func TestConcurrentBrowsesActOnce(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		const total = 250
		bus, ids := deadSetup(t, db, total)
		ctx := t.Context()
		_, ch := subscribe(t, bus, "billing")
		var (
			mu       sync.Mutex
			moved    []string
			wg       sync.WaitGroup
			counts   [2]int
			errs     [2]error
			received []string
		)
		delivered := make(chan struct{})
		go func() {
			defer close(delivered)
			for len(received) < total {
				select {
				case m := <-ch:
					received = append(received, m.UUID)
					m.Ack()
				case <-time.After(20 * time.Second):
					return
				}
			}
		}()
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				counts[i], errs[i] = dbbus.Browse(ctx, db, "billing.dead", 100_000, moveAll(&mu, &moved))
			}()
		}
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		assert.Equal(t, total, counts[0]+counts[1], "moves counted")
		assert.ElementsMatch(t, ids, moved, "a message was moved twice or not at all")
		assert.Empty(t, groupIDs(t, db, "billing.dead"))
		<-delivered
		assert.ElementsMatch(t, ids, received, "a moved message was not delivered exactly once")
	})
}

// TestBrowseCancelledLosesNothing cancels the context in the middle of the
// second transaction of a browse moving 250 deliveries: the first
// transaction's moves stay, the second's roll back, and every message is
// in exactly one of the two groups. A second browse then moves the rest.
func TestBrowseCancelledLosesNothing(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		const total = 250
		_, ids := deadSetup(t, db, total)
		ctx, cancel := context.WithCancel(t.Context())
		calls := 0
		n, err := dbbus.Browse(ctx, db, "billing.dead", 100_000, func(b dbbus.Browsed) (dbbus.BrowseAction, error) {
			calls++
			if calls == 150 {
				cancel()
			}
			return dbbus.BrowseAction{MoveTo: "billing"}, nil
		})
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, 100, n, "only the first transaction's moves count")
		live, dead := groupIDs(t, db, "billing"), groupIDs(t, db, "billing.dead")
		assert.Equal(t, ids[:100], live)
		assert.Equal(t, ids[100:], dead)

		var mu sync.Mutex
		var moved []string
		n, err = dbbus.Browse(t.Context(), db, "billing.dead", 100_000, moveAll(&mu, &moved))
		require.NoError(t, err)
		assert.Equal(t, total-100, n)
		assert.Equal(t, ids, groupIDs(t, db, "billing"), "the moved messages are not in order, once each")
		assert.True(t, slices.Equal(ids[100:], moved))
	})
}

// TestBrowseMovesToAPartition moves eight dead letters of eight aggregates
// to a partitioned group: each must land in the partition queue a publish
// of the same message reaches (its partition key's), and they must spread
// over more than one partition.
func TestBrowseMovesToAPartition(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{})
		ctx := t.Context()
		require.NoError(t, dbbus.DeclarePartitions(ctx, db, "orders", 4, "order.paid"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "orders.dead", "dead.orders"))
		var dead, live []*message.Message
		for i := range 8 {
			for _, to := range []*[]*message.Message{&dead, &live} {
				m := newMessage(`{}`)
				m.Metadata.Set(messaging.MetaTenantID, "acme")
				m.Metadata.Set(messaging.MetaAggregateType, "order")
				m.Metadata.Set(messaging.MetaAggregateID, fmt.Sprintf("o-%d", i))
				*to = append(*to, m)
			}
		}
		require.NoError(t, bus.Publish("dead.orders", dead...))
		require.NoError(t, bus.Publish("order.paid", live...))
		n, err := dbbus.Browse(ctx, db, "orders.dead", 100, func(dbbus.Browsed) (dbbus.BrowseAction, error) {
			return dbbus.BrowseAction{MoveTo: "orders"}, nil
		})
		require.NoError(t, err)
		assert.Equal(t, 8, n)
		queueOf := func(id string) string {
			var q []string
			require.NoError(t, db.Raw(`SELECT group_name FROM dbbus_deliveries WHERE message_id = ?`, id).Scan(&q).Error)
			require.Len(t, q, 1, "message %s has %d deliveries", id, len(q))
			return q[0]
		}
		used := map[string]bool{}
		for i := range dead {
			q := queueOf(dead[i].UUID)
			assert.Equal(t, queueOf(live[i].UUID), q, "aggregate o-%d: moved to another partition than a publish reaches", i)
			used[q] = true
		}
		assert.Greater(t, len(used), 1, "every aggregate in one partition: the test proves nothing")
	})
}
