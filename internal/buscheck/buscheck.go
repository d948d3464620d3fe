// Package buscheck holds the test helpers and the checks of partitioned
// queues that the tests of the memory bus (package messaging) and of
// RabbitMQ (package rabbitmq) share.
package buscheck

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/messaging"
)

// WaitFor bounds every wait of the buses' tests.
const WaitFor = 5 * time.Second

// Receive returns the next message of ch, failing the test after WaitFor.
func Receive(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		require.True(t, ok, "channel closed, want a message")
		return m
	case <-time.After(WaitFor):
		t.Fatal("no message within", WaitFor)
		return nil
	}
}

// RequireClosed waits for ch to be closed, failing on any message.
func RequireClosed(t *testing.T, ch <-chan *message.Message) {
	t.Helper()
	select {
	case m, ok := <-ch:
		require.False(t, ok, "want closed channel, got message %v", m)
	case <-time.After(WaitFor):
		t.Fatal("channel not closed within", WaitFor)
	}
}

// AggMsg is event n of aggregate agg, as NewMessage would key it.
func AggMsg(agg string, n int) *message.Message {
	m := message.NewMessage(fmt.Sprintf("%s-%03d", agg, n), []byte(`{}`))
	m.Metadata.Set(messaging.MetaTenantID, "t1")
	m.Metadata.Set(messaging.MetaAggregateType, "order")
	m.Metadata.Set(messaging.MetaAggregateID, agg)
	m.Metadata.Set(messaging.MetaAggregateVersion, strconv.Itoa(n))
	m.Metadata.Set(messaging.MetaPartitionKey, messaging.PartitionKey(m))
	return m
}

// Drain reads every partition queue of group until each has been
// quiet for a moment, and returns per partition the ids received in order.
func Drain(t *testing.T, sub message.Subscriber, group string, n int) [][]string {
	t.Helper()
	got := make([][]string, n)
	for p := range n {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		ch, err := sub.Subscribe(ctx, messaging.PartitionQueue(group, p))
		require.NoError(t, err)
		for done := false; !done; {
			select {
			case m := <-ch:
				got[p] = append(got[p], m.UUID)
				m.Ack()
			case <-time.After(300 * time.Millisecond):
				done = true
			}
		}
	}
	return got
}

// CheckPartitioned asserts that each aggregate's events are in one partition
// in publication order, that every event arrived once, and that the
// aggregates spread over every partition.
func CheckPartitioned(t *testing.T, got [][]string, aggs, events int) {
	t.Helper()
	where := map[string]int{}
	next := map[string]int{}
	total := 0
	for p, ids := range got {
		assert.NotEmpty(t, ids, "partition %d received nothing", p)
		for _, id := range ids {
			agg, n := id[:len(id)-4], id[len(id)-3:]
			if q, seen := where[agg]; seen {
				assert.Equal(t, q, p, "aggregate %s split between partitions", agg)
			}
			where[agg] = p
			assert.Equal(t, fmt.Sprintf("%03d", next[agg]), n, "aggregate %s out of order", agg)
			next[agg]++
			total++
		}
	}
	assert.Equal(t, aggs*events, total)
	assert.Len(t, where, aggs)
}

// CheckHandover subscribes first, then second, to partition queue q,
// publishes three events of one aggregate, and checks that only first
// receives while it is there, and that when it goes away holding the second
// event, second receives that event first, then the third.
func CheckHandover(t *testing.T, pub message.Publisher, q string, first, second message.Subscriber) {
	t.Helper()
	ctx1, stop1 := context.WithCancel(t.Context())
	defer stop1()
	active, err := first.Subscribe(ctx1, q)
	require.NoError(t, err)
	standby, err := second.Subscribe(t.Context(), q)
	require.NoError(t, err)
	for i := range 3 {
		require.NoError(t, pub.Publish("order.placed", AggMsg("a", i)))
	}
	m := Receive(t, active)
	require.Equal(t, "a-000", m.UUID)
	m.Ack()
	held := Receive(t, active)
	require.Equal(t, "a-001", held.UUID)
	select {
	case m := <-standby:
		t.Fatalf("the standby consumer received %s while the active one is there", m.UUID)
	case <-time.After(300 * time.Millisecond):
	}
	stop1() // the active consumer goes away and gives a-001 back
	held.Nack()
	for _, want := range []string{"a-001", "a-002"} {
		m := Receive(t, standby)
		assert.Equal(t, want, m.UUID, "the next consumer takes over, the unacked message first")
		m.Ack()
	}
}

// CheckPrefetch publishes six events of one aggregate to partition queue q
// and checks that a subscription of sub holds three at a time, acks them
// in order (one acked before those ahead of it lets nothing more in), and
// that a nack gives the nacked message and those after it back, in order,
// to the same subscription or, where a give-back ends it, to the next.
func CheckPrefetch(t *testing.T, pub message.Publisher, q string, sub message.Subscriber) {
	t.Helper()
	ch, err := sub.Subscribe(t.Context(), q)
	require.NoError(t, err)
	for i := range 6 {
		require.NoError(t, pub.Publish("order.placed", AggMsg("a", i)))
	}
	take := func(ids ...string) []*message.Message {
		t.Helper()
		var ms []*message.Message
		for _, id := range ids {
			m := Receive(t, ch)
			require.Equal(t, id, m.UUID)
			ms = append(ms, m)
		}
		return ms
	}
	none := func(why string) {
		t.Helper()
		select {
		case m := <-ch:
			t.Fatalf("received %s %s", m.UUID, why)
		case <-time.After(300 * time.Millisecond):
		}
	}
	first := take("a-000", "a-001", "a-002")
	none("with three in hand")
	first[2].Ack()
	first[1].Ack()
	none("before the oldest in hand was acked")
	first[0].Ack()
	second := take("a-003", "a-004", "a-005")
	second[2].Nack()
	second[1].Nack()
	none("before the oldest in hand was settled")
	second[0].Nack()
	// They come back to this subscription, or, where a give-back ends the
	// subscription (RabbitMQ), to the next one.
	var back *message.Message
	select {
	case m, ok := <-ch:
		if !ok {
			ch, err = sub.Subscribe(t.Context(), q)
			require.NoError(t, err)
			m = Receive(t, ch)
		}
		back = m
	case <-time.After(WaitFor):
		t.Fatal("the nacked messages did not come back")
	}
	require.Equal(t, "a-003", back.UUID)
	back.Ack()
	for _, m := range take("a-004", "a-005") {
		m.Ack()
	}
	none("after all six were acked")
}
