package consumer_test

import (
	"fmt"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// declareFirst declares the suite's partitions before the consumer runs,
// so that events published before it starts wait in their queues.
func declareFirst(t *testing.T, s *holdSuite, cfg *consumer.Config) {
	t.Helper()
	s.declarePartitions(t, cfg, Step{}.EventType())
}

// waitCommitted waits until every aggregate of aggs has versions 1..n
// committed, and checks they were committed in that order, once each.
func (s *holdSuite) waitCommitted(t *testing.T, aggs []int, n int64) {
	t.Helper()
	want := make([]int64, n)
	for i := range want {
		want[i] = int64(i + 1)
	}
	names := make([]string, len(aggs))
	for i, a := range aggs {
		names[i] = fmt.Sprintf("a%03d", a)
	}
	testenv.WaitFor(t, 90*time.Second, "every event committed", func() bool { // one message per transaction on a loaded SQLite can take a minute
		var c int64
		require.NoError(t, s.db.Model(&Applied{}).Where("aggregate_id IN ?", names).Count(&c).Error)
		return c >= int64(len(aggs))*n
	})
	for _, a := range aggs {
		assert.Equal(t, want, s.applied(t, fmt.Sprintf("a%03d", a)), "versions of a%03d", a)
	}
}

// batches returns how many batches the consumer applied and how many
// messages they held, from its bento_consumer_batch_size histogram.
func (s *holdSuite) batches(t *testing.T) (count uint64, sum float64) {
	t.Helper()
	mfs, err := s.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "bento_consumer_batch_size" {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

// publishSteps publishes versions 1..n of each aggregate of aggs, version
// by version.
func (s *holdSuite) publishSteps(t *testing.T, aggs []int, n int64) {
	t.Helper()
	for v := int64(1); v <= n; v++ {
		for _, a := range aggs {
			s.publish(t, Step{}.EventType(), stepMsg(t, a, v))
		}
	}
}

// TestBatchesApplyInOrderOncePerMessage: with BatchSize 50, events waiting
// in the partitions are applied many per transaction, each once, every
// aggregate's in version order; with BatchSize 1, each in a transaction
// of its own.
func TestBatchesApplyInOrderOncePerMessage(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		for _, size := range []int{50, 1} {
			t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) {
				aggs := make([]int, 20)
				for i := range aggs {
					aggs[i] = i + 1
				}
				const versions = 20
				s := buildHoldSuite(t, h, func(c *consumer.Config) { c.BatchSize = size }, func(s *holdSuite, c *consumer.Config) {
					require.NoError(t, s.db.Where("1 = 1").Delete(&Applied{}).Error) // the other size's
					declareFirst(t, s, c)
					s.publishSteps(t, aggs, versions)
				})
				s.waitCommitted(t, aggs, versions)
				// A batch is observed once its transaction has committed:
				// the last one may be counted a moment after it is seen.
				var count uint64
				var sum float64
				testenv.Poll(5*time.Second, func() bool {
					count, sum = s.batches(t)
					return sum >= float64(len(aggs)*versions)
				})
				assert.EqualValues(t, len(aggs)*versions, sum, "messages applied in batches")
				if size == 1 {
					assert.EqualValues(t, len(aggs)*versions, count, "one transaction per message")
				} else {
					assert.Less(t, count, uint64(len(aggs)*versions/4), "batches: most hold many messages")
				}
				t.Logf("%d messages in %d batches", int(sum), count)
			})
		}
	})
}

// TestPoisonInABatchAffectsOnlyItself: a message that fails permanently in
// the middle of batches is dead-lettered on its own; the events before it
// are applied once, its aggregate's later events wait behind it (held),
// and every other aggregate is applied in full, in order.
func TestPoisonInABatchAffectsOnlyItself(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		aggs := []int{1, 2, 3, 4, 5, 6, 7, 8}
		const versions = 10
		s := buildHoldSuite(t, h, func(c *consumer.Config) { c.BatchSize = 50 }, func(s *holdSuite, c *consumer.Config) {
			declareFirst(t, s, c)
			s.publishSteps(t, append([]int{0}, aggs...), versions)
		}, 5)
		s.waitCommitted(t, aggs, versions)
		dead := s.deadLetters(t, s.group, 1)
		assert.Equal(t, map[string]string{"a000-005": consumer.CausePermanent}, causes(dead))
		assert.Equal(t, []int64{1, 2, 3, 4}, s.applied(t, "a000"))
		testenv.WaitFor(t, 10*time.Second, "the later events parked", func() bool { return len(s.parked(t)) == versions-5 })
		_, sum := s.batches(t)
		assert.Greater(t, sum, float64(0), "batches applied")
	})
}

// TestTransientFailureInABatchKeepsOrder: one event fails as if its
// database were unreachable, several times; the events of its aggregate
// behind it do not overtake it, nothing is dead-lettered, and everything
// is applied once, in order.
func TestTransientFailureInABatchKeepsOrder(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		aggs := []int{0, 1, 2, 3, 4, 5}
		const versions = 10
		var failures atomic.Int32
		s := buildHoldSuite(t, h, func(c *consumer.Config) { c.BatchSize = 50 }, func(s *holdSuite, c *consumer.Config) {
			s.fail = func(env *messaging.Envelope) error {
				if env.AggregateID == "a000" && env.AggregateVersion == 3 && failures.Add(1) <= 4 {
					return fmt.Errorf("dial: %w", syscall.ECONNREFUSED)
				}
				return nil
			}
			declareFirst(t, s, c)
			s.publishSteps(t, aggs, versions)
		})
		s.waitCommitted(t, aggs, versions)
		assert.GreaterOrEqual(t, failures.Load(), int32(5), "the event failed, then succeeded")
		assert.Empty(t, s.deadLetters(t, s.group, 0), "nothing dead-lettered")
		assert.True(t, slices.Equal(s.applied(t, "a000"), []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}))
	})
}
