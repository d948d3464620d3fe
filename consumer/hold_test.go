package consumer_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
)

// holdSuite runs an order-recording consumer of Steps whose handler refuses
// (permanently) the versions listed in broken until fixed is set.
type holdSuite struct {
	*suite
	c      *consumer.Consumer
	fixed  atomic.Bool
	mu     sync.Mutex
	seen   map[string][]int64 // aggregate -> versions applied, in order
	broken map[int64]bool
}

func newHoldSuite(t *testing.T, h *harness, cfg func(*consumer.Config), broken ...int64) *holdSuite {
	s := &holdSuite{suite: newSuite(t, h), seen: map[string][]int64{}, broken: map[int64]bool{}}
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
	require.NoError(t, consumer.Handle(s.c, func(ctx context.Context, e Step, env *messaging.Envelope) error {
		if env.AggregateID == "a000" && s.broken[env.AggregateVersion] && !s.fixed.Load() {
			return consumer.Permanent(errors.New("the handler cannot apply this yet"))
		}
		if err := check(ctx, e, env); err != nil {
			return err
		}
		s.mu.Lock()
		s.seen[env.AggregateID] = append(s.seen[env.AggregateID], env.AggregateVersion)
		s.mu.Unlock()
		return nil
	}))
	run(t, s.c)
	return s
}

func (s *holdSuite) applied(agg string) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.seen[agg]...)
}

func (s *holdSuite) waitApplied(t *testing.T, agg string, want ...int64) {
	t.Helper()
	waitFor(t, 20*time.Second, "events applied", func() bool { return len(s.applied(agg)) >= len(want) })
	assert.Equal(t, want, s.applied(agg), "versions of %s applied, in order", agg)
}

// inOrder sorts dead letters by id, which is their aggregate's version
// order in these tests.
func inOrder(dead []*message.Message) []*message.Message {
	slices.SortFunc(dead, func(a, b *message.Message) int { return strings.Compare(a.UUID, b.UUID) })
	return dead
}

// causes returns the dead letters' causes by message id.
func causes(dead []*message.Message) map[string]string {
	out := map[string]string{}
	for _, m := range dead {
		out[m.UUID] = m.Metadata.Get(consumer.MetaDeadCause)
	}
	return out
}

// TestDeadLetterHoldsBackItsAggregate: once an event of an aggregate is
// dead-lettered, the aggregate's later events are dead-lettered as held
// instead of being applied out of order, while other aggregates flow;
// replaying the dead letters in order after the fix applies them in order.
func TestDeadLetterHoldsBackItsAggregate(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newHoldSuite(t, h, nil, 2)
		for v := int64(1); v <= 4; v++ {
			s.publish(t, Step{}.EventType(), stepMsg(t, 0, v))
			s.publish(t, Step{}.EventType(), stepMsg(t, 1, v))
		}
		dead := inOrder(s.deadLetters(t, s.group, 3))
		assert.Equal(t, map[string]string{"a000-002": consumer.CausePermanent, "a000-003": consumer.CauseHeld,
			"a000-004": consumer.CauseHeld}, causes(dead))
		s.waitApplied(t, "a001", 1, 2, 3, 4)
		assert.Equal(t, []int64{1}, s.applied("a000"), "nothing after the dead letter is applied")

		s.fixed.Store(true)
		for _, m := range dead { // the operator replays them, in order
			s.publish(t, Step{}.EventType(), m)
		}
		s.waitApplied(t, "a000", 1, 2, 3, 4)
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 5))
		s.waitApplied(t, "a000", 1, 2, 3, 4, 5)
	})
}

// TestReleaseLetsAHeldAggregateFlow: the operator discards the dead letter
// an aggregate is held behind and releases the hold; the aggregate's next
// events are applied.
func TestReleaseLetsAHeldAggregateFlow(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newHoldSuite(t, h, nil, 2)
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 1))
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 2))
		s.deadLetters(t, s.group, 1)
		held, err := s.c.Release(t.Context(), "", "thing", "a000")
		require.NoError(t, err)
		assert.True(t, held)
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 3))
		s.waitApplied(t, "a000", 1, 3)
		held, err = s.c.Release(t.Context(), "", "thing", "a000")
		require.NoError(t, err)
		assert.False(t, held, "nothing left to release")
	})
}

// TestGapWaitsThenHoldsItsAggregate: under contiguous versions an event
// whose predecessor never arrives waits, then is dead-lettered with the
// cause gap after GapTimeout; the aggregate's later events are held behind
// it; once the missing predecessor arrives, replaying the dead letters
// applies everything in order.
func TestGapWaitsThenHoldsItsAggregate(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		const gapTimeout = 500 * time.Millisecond
		s := newHoldSuite(t, h, func(c *consumer.Config) {
			c.Versions, c.GapTimeout = inbox.VersionsContiguous, gapTimeout
		})
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 1))
		s.waitApplied(t, "a000", 1)
		start := time.Now()
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 3)) // version 2 is lost
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 4))
		dead := inOrder(s.deadLetters(t, s.group, 2))
		assert.GreaterOrEqual(t, time.Since(start), gapTimeout, "the event waited for its predecessor")
		assert.Equal(t, map[string]string{"a000-003": consumer.CauseGap, "a000-004": consumer.CauseHeld}, causes(dead))
		assert.Equal(t, []int64{1}, s.applied("a000"))

		s.publish(t, Step{}.EventType(), stepMsg(t, 0, 2)) // the predecessor, republished
		s.waitApplied(t, "a000", 1, 2)
		for _, m := range dead {
			s.publish(t, Step{}.EventType(), m)
		}
		s.waitApplied(t, "a000", 1, 2, 3, 4)
	})
}
