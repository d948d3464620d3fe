package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// TestDeadLettersListReplayDiscard: on RabbitMQ and on the database bus
// (PostgreSQL and SQLite), two events whose handler
// fails for good are dead-lettered with their cause, error, attempts and
// time; listing leaves them in place; after the fix, replaying one applies
// it exactly once (a second replay of a copy is skipped by the inbox) and
// removes it; discarding the other removes it without applying it.
func TestDeadLettersListReplayDiscard(t *testing.T) {
	forEachDeadHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		cfg := s.config()
		cfg.Partitions, cfg.DisableHoldBack = 4, true
		var fixed atomic.Bool
		c := s.newConsumer(t, cfg)
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			if !fixed.Load() {
				return consumer.Permanent(errors.New("no such sku: " + e.SKU))
			}
			return tx.Create(&Effect{MessageID: env.ID}).Error
		}))
		run(t, c)
		first := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o1", SKU: "kiwi"}, nil)
		second := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o2", SKU: "fig"}, nil)
		second.Metadata.Set(messaging.MetaAggregateID, "other")
		s.publish(t, "order.placed", first)
		s.publish(t, "order.placed", second)
		ctx := t.Context()
		var dead []consumer.DeadLetter
		testenv.WaitFor(t, 20*time.Second, "two dead letters", func() bool {
			var err error
			dead, err = h.deadOps().List(ctx, s.group, consumer.DeadFilter{}, 10)
			require.NoError(t, err)
			return len(dead) == 2
		})
		byID := map[string]consumer.DeadLetter{dead[0].MessageID: dead[0], dead[1].MessageID: dead[1]}
		d := byID[first.UUID]
		assert.Equal(t, consumer.CausePermanent, d.Cause)
		assert.Contains(t, d.Error, "no such sku: kiwi")
		assert.Equal(t, "order.placed", d.EventType)
		assert.Equal(t, 1, d.Attempts)
		assert.WithinDuration(t, time.Now(), d.DeadAt, time.Minute)
		assert.Zero(t, d.Replays)
		only, err := h.deadOps().List(ctx, s.group, consumer.DeadFilter{AggregateID: "other"}, 10)
		require.NoError(t, err)
		require.Len(t, only, 1)
		assert.Equal(t, second.UUID, only[0].MessageID)
		none, err := h.deadOps().List(ctx, s.group, consumer.DeadFilter{OlderThan: time.Hour}, 10)
		require.NoError(t, err)
		assert.Empty(t, none)
		assert.Zero(t, s.effects(t))

		fixed.Store(true)
		replayed, err := h.deadOps().Replay(ctx, s.group, consumer.DeadFilter{IDs: []string{first.UUID}})
		require.NoError(t, err)
		require.Len(t, replayed, 1)
		testenv.WaitFor(t, 20*time.Second, "the replayed event applied", func() bool { return s.effects(t) == 1 })
		s.publish(t, "order.placed", first) // a late copy of it: the inbox skips it
		left, err := h.deadOps().List(ctx, s.group, consumer.DeadFilter{}, 10)
		require.NoError(t, err)
		require.Len(t, left, 1, "the replayed one left the queue")
		assert.Equal(t, second.UUID, left[0].MessageID)

		discarded, err := h.deadOps().Discard(ctx, s.group, consumer.DeadFilter{Cause: consumer.CausePermanent})
		require.NoError(t, err)
		require.Len(t, discarded, 1)
		left, err = h.deadOps().List(ctx, s.group, consumer.DeadFilter{}, 10)
		require.NoError(t, err)
		assert.Empty(t, left)
		time.Sleep(300 * time.Millisecond)
		assert.Equal(t, int64(1), s.effects(t), "applied once; the discarded one never")
	})
}

// TestConcurrentDeadLetterOperationsMissNothing: 20 aggregates of a group
// with hold-back have one event each dead-lettered; then 20 goroutines act
// at once on one aggregate each, as a console, the command and the API
// would: a third replay its dead letter, a third list it and then replay
// it, a third discard it, while console pages list them all. Every
// operation finds its dead letter, the dead-letter queue ends empty, and
// every replayed aggregate is applied and no longer held.
func TestConcurrentDeadLetterOperationsMissNothing(t *testing.T) {
	forEachDeadHarness(t, func(t *testing.T, h *harness) {
		const aggregates, pageViews = 20, 4
		s := buildHoldSuite(t, h, nil, func(s *holdSuite, _ *consumer.Config) {
			s.fail = func(*messaging.Envelope) error {
				if !s.fixed.Load() {
					return consumer.Permanent(errors.New("the handler cannot apply this yet"))
				}
				return nil
			}
		})
		ctx := t.Context()
		for a := range aggregates {
			s.publish(t, Step{}.EventType(), stepMsg(t, a, 1))
		}
		testenv.WaitFor(t, 60*time.Second, "every aggregate dead-lettered and held", func() bool {
			dead, err := h.deadOps().List(ctx, s.group, consumer.DeadFilter{}, 2*aggregates)
			require.NoError(t, err)
			return len(dead) == aggregates && s.held(t, nil) == aggregates
		})
		s.fixed.Store(true)

		var (
			start          = make(chan struct{})
			wg             sync.WaitGroup
			ops, misses    atomic.Int32
			mu             sync.Mutex
			errs           []error
			replayed       []string
			replay, listed = 0, 0
		)
		for a := range aggregates {
			agg := fmt.Sprintf("a%03d", a)
			f := consumer.DeadFilter{AggregateID: agg}
			found := func(n int, err error) {
				ops.Add(1)
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s: %w", agg, err))
					mu.Unlock()
				} else if n != 1 {
					misses.Add(1)
				}
			}
			var act func()
			switch a % 3 {
			case 0, 1:
				list := a%3 == 1
				if list {
					listed++
				} else {
					replay++
				}
				replayed = append(replayed, agg)
				act = func() {
					if list {
						d, err := h.deadOps().List(ctx, s.group, f, 1)
						found(len(d), err)
					}
					d, err := h.deadOps().Replay(ctx, s.group, f)
					found(len(d), err)
				}
			default:
				act = func() {
					d, err := h.deadOps().Discard(ctx, s.group, f)
					found(len(d), err)
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				act()
			}()
		}
		for range pageViews { // the console's group page, listing them all
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if _, err := h.deadOps().List(ctx, s.group, consumer.DeadFilter{}, 100); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("page view: %w", err))
					mu.Unlock()
				}
			}()
		}
		close(start)
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		t.Logf("%d operations on %d aggregates (%d replays, %d lists then replays, %d discards; %d page views besides): %d found nothing",
			ops.Load(), aggregates, replay, listed, aggregates-replay-listed, pageViews, misses.Load())

		left, err := h.deadOps().List(ctx, s.group, consumer.DeadFilter{}, 2*aggregates)
		require.NoError(t, err)
		testenv.Poll(30*time.Second, func() bool { return s.held(t, replayed) == 0 })
		held := s.held(t, replayed)
		t.Logf("%d of %d replayed aggregates still held; %d dead letters left", held, len(replayed), len(left))
		assert.Zero(t, misses.Load(), "operations that found no dead letter")
		assert.Empty(t, left, "dead letters neither replayed nor discarded")
		assert.Zero(t, held, "replayed aggregates still held")
		for _, agg := range replayed {
			assert.Equal(t, []int64{1}, s.applied(t, agg), "versions of %s applied", agg)
		}
	})
}

// held counts the suite's held aggregates among aggs (all when nil).
func (s *holdSuite) held(t *testing.T, aggs []string) int {
	t.Helper()
	q := s.db.Table("inbox_holds").Where("consumer = ?", s.group)
	if aggs != nil {
		q = q.Where("aggregate_id IN ?", aggs)
	}
	var n int64
	require.NoError(t, q.Count(&n).Error)
	return int(n)
}

// TestReplayReachesOnlyTheReplayedGroup: groups A and B consume the same
// event type; A's handler fails its first attempt for good, so the event
// is dead-lettered in A while B applies it. B's inbox records are purged
// (as retention does), then A's dead letter is replayed, and the
// aggregate's next version published: A applies the event and then the
// next version; B applies the next version only, never the replayed event
// again. Both for partitioned groups and for groups of one queue.
func TestReplayReachesOnlyTheReplayedGroup(t *testing.T) {
	for hname, mk := range deadHarnesses() {
		for name, partitions := range map[string]int{"partitioned": 4, "one queue": 0} {
			t.Run(hname+"/"+name, func(t *testing.T) {
				t.Parallel()
				h := mk(t)
				a, b := newSuite(t, h), newSuite(t, h)
				ctx := t.Context()
				var failed atomic.Bool
				start := func(s *suite, fail bool) {
					cfg := s.config()
					cfg.Partitions = partitions
					c := s.newConsumer(t, cfg)
					require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
						if fail && failed.CompareAndSwap(false, true) {
							return consumer.Permanent(errors.New("the handler cannot apply this yet"))
						}
						return tx.Create(&Effect{MessageID: s.group + "/" + env.ID}).Error
					}))
					run(t, c)
				}
				start(a, true)
				start(b, false)
				applied := func(s *suite, id string) int64 {
					var n int64
					require.NoError(t, s.db.Model(&Effect{}).Where("message_id = ?", s.group+"/"+id).Count(&n).Error)
					return n
				}
				first := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o1"}, nil)
				a.publish(t, "order.placed", first)
				testenv.WaitFor(t, 20*time.Second, "the event dead-lettered in A and applied by B", func() bool {
					dead, err := h.deadOps().List(ctx, a.group, consumer.DeadFilter{}, 10)
					require.NoError(t, err)
					return len(dead) == 1 && applied(b, first.UUID) == 1
				})
				purged, err := inbox.Purge(ctx, h.db, time.Hour, &inbox.PurgeOpts{Consumer: b.group,
					Clock: testenv.NewClock(time.Now().Add(2 * time.Hour))})
				require.NoError(t, err)
				require.Equal(t, int64(1), purged, "B's inbox record purged")

				replayed, err := h.deadOps().Replay(ctx, a.group, consumer.DeadFilter{})
				require.NoError(t, err)
				require.Len(t, replayed, 1)
				next := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o1"}, nil)
				next.Metadata.Set(messaging.MetaAggregateVersion, "2")
				a.publish(t, "order.placed", next) // behind the replay, if it reached B
				testenv.WaitFor(t, 20*time.Second, "the replay applied by A and the next version by both", func() bool {
					return applied(a, first.UUID) == 1 && applied(a, next.UUID) == 1 && applied(b, next.UUID) == 1
				})
				n := applied(b, first.UUID)
				t.Logf("B applied the event replayed in A %d time(s)", n)
				assert.Equal(t, int64(1), n, "B applies the event once: the replay is A's only")
			})
		}
	}
}
