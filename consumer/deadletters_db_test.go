package consumer_test

import (
	"context"
	"fmt"
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

// dbDead is a consumer group on the database bus whose dead-letter queue
// holds dead letters, as the group's consumer leaves them.
type dbDead struct {
	db    *gorm.DB
	bus   *dbbus.Bus
	group string
	dead  *consumer.DeadLetters
	// ids are the dead letters' message ids, oldest first; the even ones
	// are of tenant acme, the odd ones of globex.
	ids  []string
	msgs []*message.Message
}

// newDBDead migrates db and fills the dead-letter queue of a new group
// with n dead letters of order.placed, given up two hours ago. The group
// itself is not declared: the consumer declares it.
func newDBDead(t *testing.T, db *gorm.DB, n int) *dbDead {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, outbox.Migrate(ctx, db))
	require.NoError(t, inbox.Migrate(ctx, db))
	require.NoError(t, dbbus.Migrate(ctx, db))
	require.NoError(t, db.AutoMigrate(&Effect{}))
	bus, err := dbbus.New(db, &dbbus.Config{PollInterval: 20 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { _ = bus.Close() })
	e := &dbDead{db: db, bus: bus, group: "g" + aggregate.NewID()[16:], dead: consumer.DatabaseDeadLetters(db)}
	require.NoError(t, dbbus.DeclareGroup(ctx, db, consumer.DeadLetterQueue(e.group), consumer.DeadLetterTopic(e.group)))
	msgs := make([]*message.Message, n)
	for i := range n {
		m := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: fmt.Sprint(i), SKU: "kiwi", Qty: 1}, nil)
		m.Metadata.Set(messaging.MetaAggregateID, fmt.Sprintf("o-%d", i))
		m.Metadata.Set(messaging.MetaTenantID, []string{"acme", "globex"}[i%2])
		delete(m.Metadata, messaging.MetaPartitionKey) // the key of the tenant and aggregate set here
		m.Metadata.Set(consumer.MetaDeadCause, consumer.CausePermanent)
		m.Metadata.Set(consumer.MetaDeadReason, "no such sku: kiwi")
		m.Metadata.Set(consumer.MetaDeadAttempts, "3")
		m.Metadata.Set(consumer.MetaDeadAt, time.Now().Add(-2*time.Hour).UTC().Format(time.RFC3339Nano))
		m.Metadata.Set(messaging.MetaRedelivered, "true")
		msgs[i] = m
		e.ids = append(e.ids, m.UUID)
	}
	e.msgs = msgs
	require.NoError(t, bus.Publish(consumer.DeadLetterTopic(e.group), msgs...))
	return e
}

// applied records how often the group's handler ran per message id.
type applied struct {
	mu    sync.Mutex
	calls map[string]int
	first chan struct{} // closed at the first call
}

// runConsumer runs a consumer of the group (consumer.NewDatabase, with
// its default partitions) whose handler applies every order.placed, and
// returns what it applies.
func (e *dbDead) runConsumer(t *testing.T) *applied {
	t.Helper()
	cfg := consumer.DefaultConfig(e.group)
	cfg.Logger, cfg.Registerer, cfg.DisableHoldBack = quiet, prometheus.NewRegistry(), true
	c, err := consumer.NewDatabase(e.db, e.bus, cfg)
	require.NoError(t, err)
	a := &applied{calls: map[string]int{}, first: make(chan struct{})}
	require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, ev OrderPlaced, env *messaging.Envelope) error {
		a.mu.Lock()
		a.calls[env.ID]++
		if len(a.calls) == 1 && a.calls[env.ID] == 1 {
			close(a.first)
		}
		a.mu.Unlock()
		return tx.Create(&Effect{MessageID: env.ID}).Error
	}))
	run(t, c)
	return a
}

// waitApplied waits until the handler ran for want (each once) and
// checks that it ran for nothing else, nor twice for anything.
func (a *applied) waitApplied(t *testing.T, want []string) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("%d replayed dead letters applied", len(want)), func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.calls) >= len(want)
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	got := make([]string, 0, len(a.calls))
	for id, n := range a.calls {
		assert.Equal(t, 1, n, "message %s handled %d times", id, n)
		got = append(got, id)
	}
	assert.ElementsMatch(t, want, got)
}

func messageIDs(dead []consumer.DeadLetter) []string {
	out := make([]string, len(dead))
	for i, d := range dead {
		out[i] = d.MessageID
	}
	return out
}

// TestDatabaseDeadLetters checks List, Replay and Discard on the database
// bus with the semantics they have on RabbitMQ: the dead letters' fields
// and filters; a replay to a group not declared changes nothing; a
// replayed message reaches the group alone, without the dead-letter and
// delivery headers, its replays counted; a discard removes what it
// selects only.
func TestDatabaseDeadLetters(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := newDBDead(t, db, 4)
		ctx := t.Context()
		all, err := e.dead.List(ctx, e.group, consumer.DeadFilter{}, 10)
		require.NoError(t, err)
		require.Equal(t, e.ids, messageIDs(all), "oldest first")
		d := all[0]
		assert.Equal(t, consumer.CausePermanent, d.Cause)
		assert.Equal(t, "no such sku: kiwi", d.Error)
		assert.Equal(t, 3, d.Attempts)
		assert.Equal(t, "acme", d.TenantID)
		assert.Equal(t, "order.placed", d.EventType)
		assert.Equal(t, "o-0", d.AggregateID)
		assert.WithinDuration(t, time.Now().Add(-2*time.Hour), d.DeadAt, time.Minute)
		assert.Zero(t, d.Replays)
		assert.JSONEq(t, `{"order_id":"0","sku":"kiwi","qty":1}`, string(d.Payload))

		acme, err := e.dead.List(ctx, e.group, consumer.DeadFilter{TenantID: "acme"}, 10)
		require.NoError(t, err)
		assert.Equal(t, []string{e.ids[0], e.ids[2]}, messageIDs(acme))
		first, err := e.dead.List(ctx, e.group, consumer.DeadFilter{OlderThan: time.Hour}, 1)
		require.NoError(t, err)
		assert.Equal(t, e.ids[:1], messageIDs(first), "the limit")
		none, err := e.dead.List(ctx, e.group, consumer.DeadFilter{OlderThan: 3 * time.Hour}, 10)
		require.NoError(t, err)
		assert.Empty(t, none)
		_, err = e.dead.List(ctx, "nobody", consumer.DeadFilter{}, 10)
		require.ErrorIs(t, err, messaging.ErrQueueNotFound)
		_, err = consumer.DatabaseDeadLetters(nil).List(ctx, e.group, consumer.DeadFilter{}, 10)
		require.ErrorIs(t, err, consumer.ErrInvalidConfig)

		// The group is not declared yet: nowhere to replay to.
		_, err = e.dead.Replay(ctx, e.group, consumer.DeadFilter{})
		require.ErrorIs(t, err, messaging.ErrQueueNotFound)
		left, err := e.dead.List(ctx, e.group, consumer.DeadFilter{}, 10)
		require.NoError(t, err)
		assert.Len(t, left, 4, "a failed replay took dead letters out")

		require.NoError(t, dbbus.DeclareGroup(ctx, db, e.group, "order.placed"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "bystander", "order.placed", "#"))
		replayed, err := e.dead.Replay(ctx, e.group, consumer.DeadFilter{IDs: []string{e.ids[1]}})
		require.NoError(t, err)
		assert.Equal(t, e.ids[1:2], messageIDs(replayed))
		var back []*message.Message
		require.NoError(t, dbbus.Peek(ctx, db, e.group, 10, func(b dbbus.Browsed) bool {
			back = append(back, b.Message)
			return true
		}))
		require.Len(t, back, 1)
		md := back[0].Metadata
		assert.Equal(t, e.ids[1], back[0].UUID)
		assert.Equal(t, "1", md.Get(consumer.MetaReplays))
		assert.Equal(t, "globex", md.Get(messaging.MetaTenantID))
		for _, k := range []string{consumer.MetaDeadCause, consumer.MetaDeadReason, consumer.MetaDeadAt,
			consumer.MetaDeadAttempts, messaging.MetaRedelivered} {
			assert.Empty(t, md.Get(k), "header %s kept", k)
		}
		n, err := dbbus.Depth(ctx, db, "bystander")
		require.NoError(t, err)
		assert.Zero(t, n, "another group bound to the event type received the replay")

		discarded, err := e.dead.Discard(ctx, e.group, consumer.DeadFilter{TenantID: "acme", AggregateID: "o-2"})
		require.NoError(t, err)
		assert.Equal(t, e.ids[2:3], messageIDs(discarded))
		left, err = e.dead.List(ctx, e.group, consumer.DeadFilter{}, 10)
		require.NoError(t, err)
		assert.Equal(t, []string{e.ids[0], e.ids[3]}, messageIDs(left))
	})
}

// TestDatabaseReplayToPartitions replays eight dead letters of eight
// aggregates to a partitioned group on the database bus: each must land
// in the partition its partition key chooses, the one a publish of it
// reaches, and they must spread over more than one partition.
func TestDatabaseReplayToPartitions(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		const partitions = 4
		e := newDBDead(t, db, 8)
		ctx := t.Context()
		require.NoError(t, dbbus.DeclarePartitions(ctx, db, e.group, partitions, "order.placed"))
		replayed, err := e.dead.Replay(ctx, e.group, consumer.DeadFilter{})
		require.NoError(t, err)
		require.Equal(t, e.ids, messageIDs(replayed))
		used := map[string]bool{}
		for _, m := range e.msgs {
			var q []string
			require.NoError(t, db.Raw(`SELECT group_name FROM dbbus_deliveries WHERE message_id = ?`, m.UUID).Scan(&q).Error)
			require.Len(t, q, 1)
			want := messaging.PartitionQueue(e.group, messaging.PartitionOf(messaging.PartitionKey(m), partitions))
			assert.Equal(t, want, q[0], "%s replayed to another partition than its key's", m.UUID)
			used[q[0]] = true
		}
		assert.Greater(t, len(used), 1, "every aggregate in one partition: the test proves nothing")
	})
}

// TestDatabaseConcurrentReplaysWhileConsumerRuns runs two replays of
// every dead letter of a group at the same time, then a replay beside a
// discard, then two discards, while the group's consumer runs: each dead
// letter must be returned by exactly one of them, every replayed one
// applied exactly once, no discarded one applied, and none left in the
// queue.
func TestDatabaseConcurrentReplaysWhileConsumerRuns(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		for _, verbs := range [][2]string{{"replay", "replay"}, {"replay", "discard"}, {"discard", "discard"}} {
			t.Run(verbs[0]+"+"+verbs[1], func(t *testing.T) {
				const total = 250
				e := newDBDead(t, db, total)
				a := e.runConsumer(t)
				var (
					wg   sync.WaitGroup
					done [2][]consumer.DeadLetter
					errs [2]error
				)
				for i, verb := range verbs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if verb == "replay" {
							done[i], errs[i] = e.dead.Replay(t.Context(), e.group, consumer.DeadFilter{})
						} else {
							done[i], errs[i] = e.dead.Discard(t.Context(), e.group, consumer.DeadFilter{})
						}
					}()
				}
				wg.Wait()
				require.NoError(t, errs[0])
				require.NoError(t, errs[1])
				assert.ElementsMatch(t, e.ids, append(messageIDs(done[0]), messageIDs(done[1])...),
					"a dead letter was handled twice or not at all")
				left, err := e.dead.List(t.Context(), e.group, consumer.DeadFilter{}, total)
				require.NoError(t, err)
				assert.Empty(t, left)
				var want []string
				for i, verb := range verbs {
					if verb == "replay" {
						want = append(want, messageIDs(done[i])...)
					}
				}
				if len(want) > 0 {
					a.waitApplied(t, want)
				} else {
					var moved int64
					require.NoError(t, db.Raw(`SELECT count(*) FROM dbbus_deliveries WHERE group_name = ?`, e.group).Scan(&moved).Error)
					assert.Zero(t, moved, "a discarded dead letter went to the group")
					// Checked after: one moved and applied already was
					// handled before its row went.
					a.mu.Lock()
					assert.Empty(t, a.calls, "a discarded dead letter was applied")
					a.mu.Unlock()
				}
			})
		}
	})
}

// TestDatabaseReplayCancelledLosesNothing cancels a replay of 300 dead
// letters in its second transaction (at the 150th), while the group's
// consumer runs: the first transaction's 100 must be replayed (returned,
// and applied once), the other 200 still in the queue, in order; a second
// replay then sends the rest, each applied once.
func TestDatabaseReplayCancelledLosesNothing(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		const total = 300
		e := newDBDead(t, db, total)
		a := e.runConsumer(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		replayed, err := consumer.CancelAfter(e.dead, 150, cancel).Replay(ctx, e.group, consumer.DeadFilter{})
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, e.ids[:100], messageIDs(replayed))
		left, err := e.dead.List(t.Context(), e.group, consumer.DeadFilter{}, total)
		require.NoError(t, err)
		assert.Equal(t, e.ids[100:], messageIDs(left), "the cancelled transaction's dead letters are not back in place")
		a.waitApplied(t, e.ids[:100])

		rest, err := e.dead.Replay(t.Context(), e.group, consumer.DeadFilter{})
		require.NoError(t, err)
		assert.Equal(t, e.ids[100:], messageIDs(rest))
		a.waitApplied(t, e.ids)
	})
}
