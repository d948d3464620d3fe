package rabbitmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/buscheck"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

func TestAMQPPartitionPrefetch(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	spec := r.partitions("billing", 1)
	spec.Prefetch = 3
	sub, err := rabbitmq.NewPartitionSubscriber(ctxTimeout(t), r.cfg, spec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	buscheck.CheckPrefetch(t, r.publisher(), messaging.PartitionQueue(spec.Group, 0), sub)
	assert.Zero(t, r.depth(messaging.PartitionQueue(spec.Group, 0)), "every message acked")
}

func TestAMQPPartitionsKeepAnAggregateInOneQueueInOrder(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	const n, aggs, events = 4, 60, 4
	spec := r.partitions("billing", n)
	sub, err := rabbitmq.NewPartitionSubscriber(ctxTimeout(t), r.cfg, spec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	require.NoError(t, rabbitmq.DeclarePartitions(ctxTimeout(t), r.cfg, spec), "declaring again is idempotent")
	pub := r.publisher()
	for e := range events {
		for a := range aggs {
			require.NoError(t, pub.Publish("order.placed", buscheck.AggMsg(fmt.Sprintf("a%03d", a), e)))
		}
	}
	buscheck.CheckPartitioned(t, buscheck.Drain(t, sub, spec.Group, n), aggs, events)
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
	}, buscheck.WaitFor, 20*time.Millisecond)
}

func TestAMQPPartitionSingleActiveConsumerHandsOver(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	spec := r.partitions("billing", 1)
	subs := make([]message.Subscriber, 2) // one connection each, as two processes
	for i := range subs {
		s, err := rabbitmq.NewPartitionSubscriber(ctxTimeout(t), r.cfg, spec)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		subs[i] = s
	}
	buscheck.CheckHandover(t, r.publisher(), messaging.PartitionQueue(spec.Group, 0), subs[0], subs[1])
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
	sub, err := rabbitmq.NewPartitionSubscriber(ctxTimeout(t), r.cfg, spec)
	require.NoError(t, err)
	require.NoError(t, r.publisher().Publish("order.placed", buscheck.AggMsg("a", 1)))
	require.Eventually(t, func() bool { return r.depth(q) == 1 }, buscheck.WaitFor, 10*time.Millisecond, "the message is in its partition")
	ch, err := sub.Subscribe(t.Context(), q)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.depth(q) == 0 }, buscheck.WaitFor, 10*time.Millisecond, "the broker delivered the message to the subscription")

	closed := make(chan error, 1)
	go func() { closed <- sub.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(buscheck.WaitFor):
		t.Fatal("Close did not return while the subscription held a message nobody read")
	}
	select {
	case m, ok := <-ch:
		require.False(t, ok, "the channel delivered %v after Close", m)
	case <-time.After(buscheck.WaitFor):
		t.Fatal("the channel was not closed by Close")
	}
	require.Eventually(t, func() bool { return r.depth(q) == 1 }, buscheck.WaitFor, 10*time.Millisecond, "the message is back in its partition")
}

func TestAMQPQuorumPartitionDeadLettersPastTheDeliveryLimit(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	spec := r.partitions("billing", 1)
	spec.DeliveryLimit = 2
	sub, err := rabbitmq.NewPartitionSubscriber(ctxTimeout(t), r.cfg, spec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	require.NoError(t, r.publisher().Publish("order.placed", buscheck.AggMsg("a", 0)))

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
	restore := rabbitmq.SetHashExchangeType("x-bento-no-such-type")
	defer restore()
	err := rabbitmq.DeclarePartitions(ctxTimeout(t), r.cfg, r.partitions("billing", 2))
	require.ErrorIs(t, err, rabbitmq.ErrHashExchangeMissing)
	assert.Contains(t, err.Error(), "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange")
}

// TestRedeclaringWithOtherSettingsIsAMismatch: partition queues declared
// again with another delivery limit or queue type, or a group queue over
// an exchange of another kind, fail with ErrTopologyMismatch (the broker's
// 406 PRECONDITION_FAILED), naming the object, and leave what exists.
func TestRedeclaringWithOtherSettingsIsAMismatch(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	spec := r.partitions("billing", 2)
	require.NoError(t, rabbitmq.DeclarePartitions(ctxTimeout(t), r.cfg, spec))
	other := spec
	other.DeliveryLimit = 30
	err := rabbitmq.DeclarePartitions(ctxTimeout(t), r.cfg, other)
	require.ErrorIs(t, err, rabbitmq.ErrTopologyMismatch)
	assert.Contains(t, err.Error(), messaging.PartitionQueue(spec.Group, 0))
	other = spec
	other.QueueType = rabbitmq.Classic
	require.ErrorIs(t, rabbitmq.DeclarePartitions(ctxTimeout(t), r.cfg, other), rabbitmq.ErrTopologyMismatch)
	require.NoError(t, rabbitmq.DeclarePartitions(ctxTimeout(t), r.cfg, spec), "the same settings declare again")

	// An exchange of the group's hash-exchange name, of another kind.
	clash := r.group("clash")
	hx := r.name + ".hash." + clash
	require.NoError(t, r.ch.ExchangeDeclare(hx, amqp.ExchangeTopic, true, false, false, false, nil))
	t.Cleanup(func() {
		if c, err := r.conn.Channel(); err == nil {
			_ = c.ExchangeDelete(hx, false, false)
			_ = c.Close()
		}
	})
	err = rabbitmq.DeclarePartitions(ctxTimeout(t), r.cfg, rabbitmq.PartitionSpec{Group: clash, Count: 1, Patterns: []string{"a"}, DeadKey: "x"})
	require.ErrorIs(t, err, rabbitmq.ErrTopologyMismatch)
	assert.NotErrorIs(t, err, rabbitmq.ErrHashExchangeMissing)
	assert.Contains(t, err.Error(), hx)
}

func TestPartitionSpecIsValidated(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	for _, spec := range []rabbitmq.PartitionSpec{
		{Group: "g", Count: 0, Patterns: []string{"a"}},
		{Group: "g", Count: messaging.MaxPartitions + 1, Patterns: []string{"a"}},
		{Group: "g", Count: 1, Patterns: []string{"a"}, DeliveryLimit: 3},
		{Group: "g", Count: 1, Patterns: []string{"a"}, DeliveryLimit: -1, DeadKey: "g.dead"},
		{Group: "g", Count: 1, Patterns: []string{"a"}, QueueType: 7},
	} {
		require.ErrorIs(t, rabbitmq.DeclarePartitions(ctxTimeout(t), r.cfg, spec), rabbitmq.ErrInvalidConfig, "%+v", spec)
	}
	require.ErrorIs(t, rabbitmq.DeclarePartitions(ctxTimeout(t), r.cfg,
		rabbitmq.PartitionSpec{Group: "g", Count: 1}), messaging.ErrInvalidName, "no pattern")
}

// partitions returns the spec of n quorum partitions of a unique group,
// with a delivery limit of 20 to the queue "<group>.dead" (through the
// default exchange), whose queues and hash exchange are deleted at cleanup.
func (r *rabbit) partitions(suffix string, n int) rabbitmq.PartitionSpec {
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
	return rabbitmq.PartitionSpec{Group: group, Count: n, Patterns: []string{"order.*"}, DeliveryLimit: 20, DeadKey: dead}
}

// TestAMQPPartitionNackGivesBackInOrder: a subscription holding 100
// messages of a quorum partition nacks the first: all 100 come back, in
// their order. (A nack of them all at once, multiple, made RabbitMQ 3.10
// requeue them shuffled.)
func TestAMQPPartitionNackGivesBackInOrder(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	spec := r.partitions("billing", 1)
	spec.Prefetch = 100
	sub, err := rabbitmq.NewPartitionSubscriber(ctxTimeout(t), r.cfg, spec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	pub := r.publisher()
	var want []string
	for i := range 100 {
		m := buscheck.AggMsg("a", i)
		want = append(want, m.UUID)
		require.NoError(t, pub.Publish("order.placed", m))
	}
	queue := messaging.PartitionQueue(spec.Group, 0)
	ch, err := sub.Subscribe(t.Context(), queue)
	require.NoError(t, err)
	// receive returns the next n messages, from a new subscription when a
	// give-back ended this one.
	receive := func(n int) []*message.Message {
		var ms []*message.Message
		for len(ms) < n {
			select {
			case m, ok := <-ch:
				if !ok {
					ch, err = sub.Subscribe(t.Context(), queue)
					require.NoError(t, err)
					continue
				}
				ms = append(ms, m)
			case <-time.After(buscheck.WaitFor):
				t.Fatalf("%d of %d messages arrived", len(ms), n)
			}
		}
		return ms
	}
	held := receive(100)
	held[0].Nack()
	var got []string
	for _, m := range receive(100) {
		got = append(got, m.UUID)
		m.Ack()
	}
	assert.Equal(t, want, got, "given back in their order")
}
