package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// holdSuite runs an order-recording consumer of Steps whose handler refuses
// (permanently) the versions listed in broken until fixed is set.
type holdSuite struct {
	*suite
	c      *consumer.Consumer
	fixed  atomic.Bool
	broken map[int64]bool
	// fail, when set before the consumer runs, may fail a message first.
	fail func(env *messaging.Envelope) error
}

func newHoldSuite(t *testing.T, h *harness, cfg func(*consumer.Config), broken ...int64) *holdSuite {
	return buildHoldSuite(t, h, cfg, nil, broken...)
}

// buildHoldSuite is newHoldSuite with before, when not nil, called after
// the consumer is built and before it runs.
func buildHoldSuite(t *testing.T, h *harness, cfg func(*consumer.Config), before func(*holdSuite, *consumer.Config),
	broken ...int64) *holdSuite {
	s := &holdSuite{suite: newSuite(t, h), broken: map[int64]bool{}}
	for _, v := range broken {
		s.broken[v] = true
	}
	require.NoError(t, s.db.AutoMigrate(&Applied{}))
	c := s.config()
	c.Partitions = 4
	if cfg != nil {
		cfg(c)
	}
	s.c = s.newConsumer(t, c)
	check := checkOrder("w")
	require.NoError(t, consumer.Handle(s.c, func(ctx context.Context, tx *gorm.DB, e Step, env *messaging.Envelope) error {
		if s.fail != nil {
			if err := s.fail(env); err != nil {
				return err
			}
		}
		if env.AggregateID == "a000" && s.broken[env.AggregateVersion] && !s.fixed.Load() {
			return consumer.Permanent(errors.New("the handler cannot apply this yet"))
		}
		return check(ctx, tx, e, env)
	}))
	if before != nil {
		before(s, c)
	}
	run(t, s.c)
	return s
}

// applied returns the versions of agg committed, in the order they were
// applied (rows, not calls: a batch applied again calls handlers twice).
func (s *holdSuite) applied(t *testing.T, agg string) []int64 {
	t.Helper()
	var vs []int64
	require.NoError(t, s.db.Model(&Applied{}).Where("aggregate_id = ?", agg).Order("id").Pluck("version", &vs).Error)
	return vs
}

func (s *holdSuite) waitApplied(t *testing.T, agg string, want ...int64) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, "events applied", func() bool { return len(s.applied(t, agg)) >= len(want) })
	assert.Equal(t, want, s.applied(t, agg), "versions of %s applied, in order", agg)
}

// causes returns the dead letters' causes by message id.
func causes(dead []*message.Message) map[string]string {
	out := map[string]string{}
	for _, m := range dead {
		out[m.UUID] = m.Metadata.Get(consumer.MetaDeadCause)
	}
	return out
}

// parked returns the reasons of the suite's parked events by message id.
func (s *holdSuite) parked(t *testing.T) map[string]string {
	t.Helper()
	ps, err := s.c.Parked(t.Context(), 100)
	require.NoError(t, err)
	out := map[string]string{}
	for _, p := range ps {
		out[p.MessageID] = p.Reason
	}
	return out
}

// waitParked waits until the suite's parked events are want.
func (s *holdSuite) waitParked(t *testing.T, want map[string]string) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, "parked events", func() bool { return maps.Equal(s.parked(t), want) })
}

// TestDeadLetterHoldsBackItsAggregate: once an event of an aggregate is
// dead-lettered, the aggregate's later events are parked instead of being
// applied out of order, while other aggregates flow; replaying the dead
// letter after the fix applies it and then the parked events, in order.
func TestDeadLetterHoldsBackItsAggregate(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newHoldSuite(t, h, nil, 2)
		for v := int64(1); v <= 4; v++ {
			s.publish(t, Step{}.EventType(), stepMsg(t, 0, v))
			s.publish(t, Step{}.EventType(), stepMsg(t, 1, v))
		}
		dead := s.deadLetters(t, s.group, 1)
		assert.Equal(t, map[string]string{"a000-002": consumer.CausePermanent}, causes(dead))
		s.waitParked(t, map[string]string{"a000-003": inbox.ParkedHeld, "a000-004": inbox.ParkedHeld})
		s.waitApplied(t, "a001", 1, 2, 3, 4)
		assert.Equal(t, []int64{1}, s.applied(t, "a000"), "nothing after the dead letter is applied")

		s.fixed.Store(true)
		s.released(t, dead[0].UUID)               // else the database bus drops the copy
		s.publish(t, Step{}.EventType(), dead[0]) // the operator replays it
		s.waitApplied(t, "a000", 1, 2, 3, 4)
		assert.Empty(t, s.parked(t))
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 5))
		s.waitApplied(t, "a000", 1, 2, 3, 4, 5)
		assert.Empty(t, s.deadLetters(t, s.group, 0), "no other dead letter")
	})
}

// TestReleaseLetsAHeldAggregateFlow: the operator discards the dead letter
// an aggregate is held behind and releases the hold; the event parked
// behind it and the aggregate's next events are applied.
func TestReleaseLetsAHeldAggregateFlow(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newHoldSuite(t, h, nil, 2)
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 1))
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 2))
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 3))
		s.deadLetters(t, s.group, 1)
		s.waitParked(t, map[string]string{"a000-003": inbox.ParkedHeld})
		a000 := inbox.Aggregate{Type: "thing", ID: "a000"}
		require.NoError(t, s.c.Release(t.Context(), a000, "a000-002"))
		s.waitApplied(t, "a000", 1, 3)
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 4))
		s.waitApplied(t, "a000", 1, 3, 4)
		assert.ErrorIs(t, s.c.Release(t.Context(), a000, "a000-002"), consumer.ErrStaleRelease, "nothing left to release")
	})
}

// gapSuite is a hold suite under contiguous versions, with one partition
// so that every aggregate shares it.
func gapSuite(t *testing.T, h *harness, gapTimeout time.Duration) *holdSuite {
	return newHoldSuite(t, h, func(c *consumer.Config) {
		c.Versions, c.GapTimeout, c.Partitions = inbox.VersionsContiguous, gapTimeout, 1
	})
}

// TestGapParksItsAggregateUntilThePredecessorArrives: under contiguous
// versions an event whose predecessor has not arrived is parked, and the
// partition moves on to other aggregates; after GapTimeout it becomes a
// gap dead letter; the aggregate's later events wait behind it; when the
// missing predecessor is replayed, it and the parked events are applied in
// order.
func TestGapParksItsAggregateUntilThePredecessorArrives(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		const gapTimeout = time.Second
		s := gapSuite(t, h, gapTimeout)
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 1))
		s.waitApplied(t, "a000", 1)
		start := time.Now()
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 3)) // version 2 is lost
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 4))
		s.publish(t, Step{}.EventType(), stepMsg(t, 1, 1))
		s.waitApplied(t, "a001", 1) // the partition did not wait
		s.waitParked(t, map[string]string{"a000-003": inbox.ParkedWaiting, "a000-004": inbox.ParkedHeld})
		assert.Less(t, time.Since(start), gapTimeout, "the partition moved on before the gap timed out")

		s.waitParked(t, map[string]string{"a000-003": inbox.ParkedGap, "a000-004": inbox.ParkedHeld})
		assert.GreaterOrEqual(t, time.Since(start), gapTimeout, "the event waited GapTimeout before it was given up")
		assert.Equal(t, []int64{1}, s.applied(t, "a000"))

		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 2)) // the predecessor, replayed
		s.waitApplied(t, "a000", 1, 2, 3, 4)
		assert.Empty(t, s.parked(t))
		assert.Empty(t, s.deadLetters(t, s.group, 0), "nothing went to the dead-letter queue")
	})
}

// TestReleaseGivesUpAGap: releasing an aggregate whose parked events wait
// for a version that will never arrive skips that version and applies
// them, in order.
func TestReleaseGivesUpAGap(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := gapSuite(t, h, time.Hour)
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 1))
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 4)) // 2 and 3 are lost
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 5))
		s.waitParked(t, map[string]string{"a000-004": inbox.ParkedWaiting, "a000-005": inbox.ParkedHeld})
		ps, err := s.c.Parked(t.Context(), 10)
		require.NoError(t, err)
		require.Equal(t, inbox.ParkedWaiting, ps[0].Reason)
		assert.ErrorIs(t, s.c.Release(t.Context(), ps[1].Aggregate(), ps[1].MessageID), consumer.ErrStaleRelease,
			"version 5 does not wait for a gap")
		require.NoError(t, s.c.Release(t.Context(), ps[0].Aggregate(), ps[0].MessageID)) // 2 and 3 are given up
		s.waitApplied(t, "a000", 1, 4, 5)
		assert.Empty(t, s.parked(t))
	})
}

// TestStaleReplayIsDeadLetteredNotSkipped: under increasing versions, an
// aggregate released past its dead letter (version 2) applies version 3;
// replaying the dead letter then finds the watermark at 3. It was never
// applied, so it is no duplicate: it goes back to the dead letters with
// the cause "stale", logged at Warn and counted by the dead-letter metric,
// instead of being skipped without a word, and version 3 stays the last
// applied.
func TestStaleReplayIsDeadLetteredNotSkipped(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		logs := &recorder{}
		s := newHoldSuite(t, h, func(c *consumer.Config) {
			c.Versions = inbox.VersionsIncreasing
			c.Logger = slog.New(logs)
		}, 2)
		for v := int64(1); v <= 3; v++ {
			s.publish(t, Step{}.EventType(), stepMsg(t, 0, v))
		}
		dead := s.deadLetters(t, s.group, 1)
		s.waitParked(t, map[string]string{"a000-003": inbox.ParkedHeld})
		require.NoError(t, s.c.Release(t.Context(), inbox.Aggregate{Type: "thing", ID: "a000"}, "a000-002"))
		s.waitApplied(t, "a000", 1, 3)

		s.fixed.Store(true)
		replay := dead[0]
		replay.Metadata.Set(consumer.MetaReplays, "1") // as ReplayDeadLetters sends it
		s.publish(t, Step{}.EventType(), replay)
		again := s.deadLetters(t, s.group, 1)
		require.Len(t, again, 1)
		assert.Equal(t, "a000-002", again[0].UUID)
		assert.Equal(t, consumer.CauseStale, again[0].Metadata.Get(consumer.MetaDeadCause))
		// The counter moves once the broker confirmed the dead letter, which
		// may be after a browse already sees it.
		stale := func() float64 {
			n, _ := s.metric(t, "bento_consumer_dead_lettered_total", map[string]string{"cause": consumer.CauseStale})
			return n
		}
		testenv.Poll(5*time.Second, func() bool { return stale() >= 1 })
		assert.EqualValues(t, 1, stale(), "stale dead letters counted")
		warned := func() int {
			logs.mu.Lock()
			defer logs.mu.Unlock()
			k := 0
			for _, rec := range logs.records {
				rec.Attrs(func(a slog.Attr) bool {
					if a.Key == "cause" && a.Value.String() == consumer.CauseStale &&
						rec.Message == "consumer: dead letter" && rec.Level == slog.LevelWarn {
						k++
					}
					return true
				})
			}
			return k
		}
		testenv.Poll(5*time.Second, func() bool { return warned() >= 1 })
		t.Logf("%s: the stale replay: %v stale dead letters counted, %d Warn lines", h.name, stale(), warned())
		assert.Equal(t, 1, warned(), "the stale dead letter logged at Warn")
		assert.Equal(t, []int64{1, 3}, s.applied(t, "a000"))
	})
}

// TestSweeperReachesEveryReleasedAggregate: with 2,000 aggregates held
// behind dead letters, each with a parked later event, releasing 20 of
// them spread over the key space (all but one sort past the first 100)
// applies all 20 parked events within a bounded time, and nothing else.
func TestSweeperReachesEveryReleasedAggregate(t *testing.T) {
	testenv.Stress(t)
	forEachHarness(t, func(t *testing.T, h *harness) {
		const n, within = 2000, 15 * time.Second
		s := buildHoldSuite(t, h, nil, func(s *holdSuite, _ *consumer.Config) {
			s.fail = func(env *messaging.Envelope) error {
				if env.AggregateVersion == 1 {
					return consumer.Permanent(errors.New("version 1 cannot be applied"))
				}
				return nil
			}
		})
		for a := range n {
			s.publish(t, Step{}.EventType(), stepMsg(t, a, 1))
			s.publish(t, Step{}.EventType(), stepMsg(t, a, 2))
		}
		// Setting up is 4,000 deliveries and 2,000 dead letters: about a
		// minute alone on the database bus, over three minutes beside the
		// package's other stress tests under CI's load.
		testenv.WaitFor(t, 8*time.Minute, "every aggregate held with a parked event", func() bool {
			return s.countParked(t, inbox.ParkedHeld) == n
		})
		var released []string
		for a := 5; a < n; a += 100 { // a005, a105, ..., a1905
			agg := fmt.Sprintf("a%03d", a)
			require.NoError(t, s.c.Release(t.Context(), inbox.Aggregate{Type: "thing", ID: agg}, agg+"-001"))
			released = append(released, agg)
		}
		start := time.Now()
		applied := func() int {
			k := 0
			for _, agg := range released {
				if slices.Equal(s.applied(t, agg), []int64{2}) {
					k++
				}
			}
			return k
		}
		testenv.Poll(within, func() bool { return applied() == len(released) })
		got := applied()
		t.Logf("%s: %d of %d released aggregates applied within %v (%v), %d still parked",
			h.name, got, len(released), within, time.Since(start).Round(time.Millisecond), s.countParked(t, ""))
		assert.Equal(t, len(released), got, "released aggregates applied")
		var total int64
		require.NoError(t, s.db.Model(&Applied{}).Count(&total).Error)
		assert.EqualValues(t, len(released), total, "nothing but the released aggregates applied")
		assert.Equal(t, n-len(released), s.countParked(t, inbox.ParkedHeld), "the others still held")
	})
}

// countParked returns how many of the suite's events are parked for
// reason, or for any reason when reason is "".
func (s *holdSuite) countParked(t *testing.T, reason string) int {
	t.Helper()
	ps, err := s.c.Parked(t.Context(), 100_000)
	require.NoError(t, err)
	k := 0
	for _, p := range ps {
		if reason == "" || p.Reason == reason {
			k++
		}
	}
	return k
}

// TestStaleReleaseKeepsTheNewHold: an operator releases an aggregate held
// behind version 3's dead letter; the parked version 4 then fails and
// holds the aggregate anew; the same Release, retried, is stale: it fails
// and leaves the new hold in place, so version 5 waits for version 4 and
// the aggregate is never applied out of order.
func TestStaleReleaseKeepsTheNewHold(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newHoldSuite(t, h, nil, 3, 4)
		for v := int64(1); v <= 5; v++ {
			s.publish(t, Step{}.EventType(), stepMsg(t, 0, v))
		}
		assert.Equal(t, map[string]string{"a000-003": consumer.CausePermanent}, causes(s.deadLetters(t, s.group, 1)))
		s.waitParked(t, map[string]string{"a000-004": inbox.ParkedHeld, "a000-005": inbox.ParkedHeld})
		a000 := inbox.Aggregate{Type: "thing", ID: "a000"}
		// The operator discarded version 3; version 4 fails in its turn.
		require.NoError(t, s.c.Release(t.Context(), a000, "a000-003"))
		dead := s.deadLetters(t, s.group, 1)
		require.Equal(t, map[string]string{"a000-004": consumer.CausePermanent}, causes(dead))
		s.waitParked(t, map[string]string{"a000-005": inbox.ParkedHeld})

		err := s.c.Release(t.Context(), a000, "a000-003") // the same release, retried
		t.Logf("%s: retried release: %v", h.name, err)
		assert.ErrorIs(t, err, consumer.ErrStaleRelease)
		// Two sweeps and more: version 5 must still wait for version 4.
		testenv.Poll(3*time.Second, func() bool { return len(s.applied(t, "a000")) > 2 })
		assert.Equal(t, []int64{1, 2}, s.applied(t, "a000"), "version 5 waits for version 4")

		s.fixed.Store(true)
		s.released(t, dead[0].UUID)               // else the database bus drops the copy
		s.publish(t, Step{}.EventType(), dead[0]) // the operator replays version 4
		s.waitApplied(t, "a000", 1, 2, 4, 5)
		vs := s.applied(t, "a000")
		outOfOrder := 0
		for i := 1; i < len(vs); i++ {
			if vs[i] <= vs[i-1] {
				outOfOrder++
			}
		}
		t.Logf("%s: applied %v, %d out of order", h.name, vs, outOfOrder)
		assert.Zero(t, outOfOrder, "events applied out of order")
		assert.Empty(t, s.parked(t))
	})
}

// parkedCounter counts the sweep's statements: those that read or write
// inbox_parked.
type parkedCounter struct {
	logger.Interface
	n atomic.Int64
}

func (c *parkedCounter) LogMode(logger.LogLevel) logger.Interface { return c }

func (c *parkedCounter) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	// The gauges' counts (metricsEvery) are not the sweep's.
	if sql, _ := fc(); strings.Contains(sql, "inbox_parked") && !strings.Contains(sql, "count(*)") {
		c.n.Add(1)
	}
}

// TestQuietPartitionsAreSweptRarely: a partitioned consumer whose
// partitions have no parked event, after a sweep found none, does not
// sweep them every second (each sweep is one to two statements, most of
// an idle consumer's cost); TestReleaseLetsAHeldAggregateFlow and the
// other hold tests show that parked events are still swept every second.
func TestQuietPartitionsAreSweptRarely(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	require.NoError(t, inbox.Migrate(t.Context(), db))
	counter := &parkedCounter{Interface: logger.Discard}
	bus := messaging.NewMemoryBus()
	t.Cleanup(func() { _ = bus.Close() })
	cfg := consumer.DefaultConfig("quiet")
	cfg.Partitions, cfg.GapTimeout, cfg.Logger = 2, time.Minute, quiet
	c, err := consumer.NewMemory(db.Session(&gorm.Session{Logger: counter}), bus, cfg)
	require.NoError(t, err)
	require.NoError(t, consumer.Handle(c, func(context.Context, *gorm.DB, Step, *messaging.Envelope) error { return nil }))
	run(t, c)
	testenv.WaitFor(t, 10*time.Second, "the first sweep", func() bool { return counter.n.Load() > 0 })
	time.Sleep(1500 * time.Millisecond) // the sweep that finds the partitions quiet
	before := counter.n.Load()
	time.Sleep(4 * time.Second)
	assert.Zero(t, counter.n.Load()-before, "statements on inbox_parked in 4 s of a quiet consumer")
}
