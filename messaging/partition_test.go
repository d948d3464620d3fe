package messaging_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/messaging"
)

// aggMsg is event n of aggregate agg, as NewMessage would key it.
func aggMsg(agg string, n int) *message.Message {
	m := message.NewMessage(fmt.Sprintf("%s-%03d", agg, n), []byte(`{}`))
	m.Metadata.Set(messaging.MetaTenantID, "t1")
	m.Metadata.Set(messaging.MetaAggregateType, "order")
	m.Metadata.Set(messaging.MetaAggregateID, agg)
	m.Metadata.Set(messaging.MetaAggregateVersion, strconv.Itoa(n))
	m.Metadata.Set(messaging.MetaPartitionKey, messaging.PartitionKey(m))
	return m
}

// drainPartitions reads every partition queue of group until each has been
// quiet for a moment, and returns per partition the ids received in order.
func drainPartitions(t *testing.T, sub message.Subscriber, group string, n int) [][]string {
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

// checkPartitioned asserts that each aggregate's events are in one partition
// in publication order, that every event arrived once, and that the
// aggregates spread over every partition.
func checkPartitioned(t *testing.T, got [][]string, aggs, events int) {
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

func TestMemoryBusPartitionsKeepAnAggregateInOneQueueInOrder(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	const n, aggs, events = 8, 100, 5
	require.NoError(t, b.DeclarePartitions("billing", n, "order.*"))
	require.NoError(t, b.DeclarePartitions("billing", n, "order.*"), "declaring again is idempotent")
	require.ErrorIs(t, b.DeclarePartitions("billing", n+1, "order.*"), messaging.ErrInvalidConfig)
	require.ErrorIs(t, b.DeclarePartitions("billing", 0, "order.*"), messaging.ErrInvalidConfig)
	for e := range events {
		for a := range aggs {
			require.NoError(t, b.Publish("order.placed", aggMsg(fmt.Sprintf("a%03d", a), e)))
		}
	}
	checkPartitioned(t, drainPartitions(t, b.PartitionSubscriber(0), "billing", n), aggs, events)
}

func TestMemoryBusPartitionHasOneActiveConsumer(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	require.NoError(t, b.DeclarePartitions("billing", 1, "order.*"))
	sub := b.PartitionSubscriber(0)
	checkHandover(t, b, messaging.PartitionQueue("billing", 0), sub, sub)
}

// checkHandover subscribes first, then second, to partition queue q,
// publishes three events of one aggregate, and checks that only first
// receives while it is there, and that when it goes away holding the second
// event, second receives that event first, then the third.
func checkHandover(t *testing.T, pub message.Publisher, q string, first, second message.Subscriber) {
	t.Helper()
	ctx1, stop1 := context.WithCancel(t.Context())
	defer stop1()
	active, err := first.Subscribe(ctx1, q)
	require.NoError(t, err)
	standby, err := second.Subscribe(t.Context(), q)
	require.NoError(t, err)
	for i := range 3 {
		require.NoError(t, pub.Publish("order.placed", aggMsg("a", i)))
	}
	m := receive(t, active)
	require.Equal(t, "a-000", m.UUID)
	m.Ack()
	held := receive(t, active)
	require.Equal(t, "a-001", held.UUID)
	select {
	case m := <-standby:
		t.Fatalf("the standby consumer received %s while the active one is there", m.UUID)
	case <-time.After(300 * time.Millisecond):
	}
	stop1() // the active consumer goes away and gives a-001 back
	held.Nack()
	for _, want := range []string{"a-001", "a-002"} {
		m := receive(t, standby)
		assert.Equal(t, want, m.UUID, "the next consumer takes over, the unacked message first")
		m.Ack()
	}
}

// checkPrefetch publishes six events of one aggregate to partition queue q
// and checks that a subscription of sub holds three at a time, acks them
// in order (one acked before those ahead of it lets nothing more in), and
// that a nack gives the nacked message and those after it back, in order.
func checkPrefetch(t *testing.T, pub message.Publisher, q string, sub message.Subscriber) {
	t.Helper()
	ch, err := sub.Subscribe(t.Context(), q)
	require.NoError(t, err)
	for i := range 6 {
		require.NoError(t, pub.Publish("order.placed", aggMsg("a", i)))
	}
	take := func(ids ...string) []*message.Message {
		t.Helper()
		var ms []*message.Message
		for _, id := range ids {
			m := receive(t, ch)
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
	for _, m := range take("a-003", "a-004", "a-005") {
		m.Ack()
	}
	none("after all six were acked")
}

func TestMemoryBusPartitionPrefetch(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	require.NoError(t, b.DeclarePartitions("billing", 1, "order.*"))
	checkPrefetch(t, b, messaging.PartitionQueue("billing", 0), b.PartitionSubscriber(3))
}

func TestAMQPPartitionPrefetch(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	spec := r.partitions("billing", 1)
	spec.Prefetch = 3
	sub, err := messaging.NewPartitionSubscriber(ctxTimeout(t), r.cfg, spec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	checkPrefetch(t, r.publisher(), messaging.PartitionQueue(spec.Group, 0), sub)
	assert.Zero(t, r.depth(messaging.PartitionQueue(spec.Group, 0)), "every message acked")
}

func TestAMQPPartitionsKeepAnAggregateInOneQueueInOrder(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	const n, aggs, events = 4, 60, 4
	spec := r.partitions("billing", n)
	sub, err := messaging.NewPartitionSubscriber(ctxTimeout(t), r.cfg, spec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	require.NoError(t, messaging.DeclarePartitions(ctxTimeout(t), r.cfg, spec), "declaring again is idempotent")
	pub := r.publisher()
	for e := range events {
		for a := range aggs {
			require.NoError(t, pub.Publish("order.placed", aggMsg(fmt.Sprintf("a%03d", a), e)))
		}
	}
	checkPartitioned(t, drainPartitions(t, sub, spec.Group, n), aggs, events)
	require.NoError(t, sub.Close())

	// A message published through bento without a partition key gets one
	// (its id): it lands in a partition.
	require.NoError(t, pub.Publish("order.placed", message.NewMessage("bare", []byte(`{}`))))
	total := 0
	for p := range n {
		total += r.depth(messaging.PartitionQueue(spec.Group, p))
	}
	assert.Equal(t, 1, total)

	// A message without the header, from another publisher, is not lost
	// either: the hash exchange puts it in some partition.
	require.NoError(t, r.ch.PublishWithContext(ctxTimeout(t), r.name, "order.placed", false, false,
		amqp.Publishing{Headers: amqp.Table{"x": "y"}, Body: []byte(`{}`)}))
	require.Eventually(t, func() bool {
		total = 0
		for p := range n {
			total += r.depth(messaging.PartitionQueue(spec.Group, p))
		}
		return total == 2
	}, waitFor, 20*time.Millisecond)
}

func TestAMQPPartitionSingleActiveConsumerHandsOver(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	spec := r.partitions("billing", 1)
	subs := make([]message.Subscriber, 2) // one connection each, as two processes
	for i := range subs {
		s, err := messaging.NewPartitionSubscriber(ctxTimeout(t), r.cfg, spec)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		subs[i] = s
	}
	checkHandover(t, r.publisher(), messaging.PartitionQueue(spec.Group, 0), subs[0], subs[1])
}

// TestAMQPPartitionCloseEndsAnUnreadSubscription closes a partition
// subscriber while its subscription holds a message nobody reads, its
// context still live, as a process does that stops reading and shuts down
// between two messages: Close must return, the channel close, and the
// message go back to the partition.
func TestAMQPPartitionCloseEndsAnUnreadSubscription(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	spec := r.partitions("billing", 1)
	q := messaging.PartitionQueue(spec.Group, 0)
	sub, err := messaging.NewPartitionSubscriber(ctxTimeout(t), r.cfg, spec)
	require.NoError(t, err)
	require.NoError(t, r.publisher().Publish("order.placed", aggMsg("a", 1)))
	require.Eventually(t, func() bool { return r.depth(q) == 1 }, waitFor, 10*time.Millisecond, "the message is in its partition")
	ch, err := sub.Subscribe(t.Context(), q)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.depth(q) == 0 }, waitFor, 10*time.Millisecond, "the broker delivered the message to the subscription")

	closed := make(chan error, 1)
	go func() { closed <- sub.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("Close did not return while the subscription held a message nobody read")
	}
	select {
	case m, ok := <-ch:
		require.False(t, ok, "the channel delivered %v after Close", m)
	case <-time.After(waitFor):
		t.Fatal("the channel was not closed by Close")
	}
	require.Eventually(t, func() bool { return r.depth(q) == 1 }, waitFor, 10*time.Millisecond, "the message is back in its partition")
}

func TestAMQPQuorumPartitionDeadLettersPastTheDeliveryLimit(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	spec := r.partitions("billing", 1)
	spec.DeliveryLimit = 2
	sub, err := messaging.NewPartitionSubscriber(ctxTimeout(t), r.cfg, spec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	require.NoError(t, r.publisher().Publish("order.placed", aggMsg("a", 0)))

	// Each consumer dies holding the message, as a crashing process would,
	// until the broker gives up on it.
	deliveries := 0
	for r.depth(spec.DeadKey) == 0 {
		require.LessOrEqual(t, deliveries, spec.DeliveryLimit+1, "delivered more often than the limit allows")
		ctx, stop := context.WithCancel(t.Context())
		ch, err := sub.Subscribe(ctx, messaging.PartitionQueue(spec.Group, 0))
		require.NoError(t, err)
		select {
		case m := <-ch:
			require.Equal(t, "a-000", m.UUID)
			deliveries++
			stop()
			m.Nack()
		case <-time.After(time.Second):
			stop()
		}
	}
	assert.Positive(t, deliveries)
	d := r.get(spec.DeadKey)
	assert.Equal(t, "a-000", d.MessageId, "past the delivery limit the broker dead-letters the message")
	assert.Zero(t, r.depth(messaging.PartitionQueue(spec.Group, 0)))
}

func TestDeclarePartitionsSaysWhenThePluginIsMissing(t *testing.T) {
	r := setupRabbit(t) // not parallel: it changes the exchange type asked for
	restore := messaging.SetHashExchangeType("x-bento-no-such-type")
	defer restore()
	err := messaging.DeclarePartitions(ctxTimeout(t), r.cfg, r.partitions("billing", 2))
	require.ErrorIs(t, err, messaging.ErrHashExchangeMissing)
	assert.Contains(t, err.Error(), "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange")
}

func TestPartitionSpecIsValidated(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	for _, spec := range []messaging.PartitionSpec{
		{Group: "g", Count: 0, Patterns: []string{"a"}},
		{Group: "g", Count: messaging.MaxPartitions + 1, Patterns: []string{"a"}},
		{Group: "g", Count: 1, Patterns: []string{"a"}, DeliveryLimit: 3},
		{Group: "g", Count: 1, Patterns: []string{"a"}, DeliveryLimit: -1, DeadKey: "g.dead"},
		{Group: "g", Count: 1, Patterns: []string{"a"}, QueueType: 7},
	} {
		require.ErrorIs(t, messaging.DeclarePartitions(ctxTimeout(t), r.cfg, spec), messaging.ErrInvalidConfig, "%+v", spec)
	}
	require.ErrorIs(t, messaging.DeclarePartitions(ctxTimeout(t), r.cfg,
		messaging.PartitionSpec{Group: "g", Count: 1}), messaging.ErrInvalidName, "no pattern")
}

// partitions returns the spec of n quorum partitions of a unique group,
// with a delivery limit of 20 to the queue "<group>.dead" (through the
// default exchange), whose queues and hash exchange are deleted at cleanup.
func (r *rabbit) partitions(suffix string, n int) messaging.PartitionSpec {
	group := r.group(suffix)
	dead := r.group(suffix + ".dead")
	_, err := r.ch.QueueDeclare(dead, true, false, false, false, nil)
	require.NoError(r.t, err)
	r.t.Cleanup(func() {
		if c, err := r.conn.Channel(); err == nil {
			for p := range n {
				_, _ = c.QueueDelete(messaging.PartitionQueue(group, p), false, false, false)
			}
			_ = c.ExchangeDelete(r.name+".hash."+group, false, false)
			_ = c.Close()
		}
	})
	return messaging.PartitionSpec{Group: group, Count: n, Patterns: []string{"order.*"}, DeliveryLimit: 20, DeadKey: dead}
}

func TestNewMessageSetsThePartitionKey(t *testing.T) {
	t.Parallel()
	row := sampleRow()
	m, err := messaging.NewMessage(row)
	require.NoError(t, err)
	assert.Equal(t, row.TenantID+"|"+row.AggregateType+"|"+row.AggregateID, m.Metadata.Get(messaging.MetaPartitionKey))
	row.AggregateType, row.AggregateID, row.AggregateVersion = "", "", 0
	m, err = messaging.NewMessage(row)
	require.NoError(t, err)
	assert.Equal(t, row.ID, m.Metadata.Get(messaging.MetaPartitionKey), "an event without aggregate may go anywhere")
}
