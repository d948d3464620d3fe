package main

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// TestConsumerDeleteThroughTheBinary: what "bento consumer declare"
// declared (the partition queues, their hash exchange and the dead-letter
// queue), "bento consumer delete" deletes, messages included, after a dry
// run and a declined prompt that change nothing; it refuses while the group
// has a dead letter, unless --force; --topology then deletes the exchange's
// topology and its dead letters', and a second run finds nothing left.
func TestConsumerDeleteThroughTheBinary(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ex, env := b.ex, b.env
	group := "gone" + aggregate.NewID()[18:]
	ex.Partitioned(group, 2) // deleted at cleanup, should the test fail first
	r := bentoEnv(t, env, "", "consumer", "declare", "--group", group, "--event-type", "gone.*", "--partitions", "2")
	require.Equal(t, 0, r.code, r.stderr)
	b.publish(t, "gone.event")
	p0, p1, dead := messaging.PartitionQueue(group, 0), messaging.PartitionQueue(group, 1), consumer.DeadLetterQueue(group)
	tap := consumer.DeadLetterTap(group)
	depth := func(q string) int { return b.depth(t, q) }
	require.Eventually(t, func() bool { return depth(p0)+depth(p1) == 1 }, 10*time.Second, 20*time.Millisecond)
	assert.Zero(t, depth(dead), "declare declared the dead-letter queue too")

	r = bentoEnv(t, env, "", "consumer", "delete")
	assert.Equal(t, 2, r.code, "nothing said to delete")
	r = bentoEnv(t, env, "", "consumer", "delete", "--group", group, "--dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "would delete 4 queue(s) with 1 message(s): "+p0+", "+p1+", "+dead+", "+tap)
	assert.Contains(t, r.stdout, ex.Name+".hash."+group)
	r = bentoEnv(t, env, "n\n", "consumer", "delete", "--group", group)
	assert.Equal(t, 1, r.code, "declined")
	assert.Equal(t, 1, depth(p0)+depth(p1), "neither the dry run nor the declined prompt deleted anything")

	deadCfg := *b.cfg
	deadCfg.Exchange = consumer.DeadLetterExchange(ex.Name)
	deadPub, err := rabbitmq.NewPublisher(t.Context(), &deadCfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = deadPub.Close() })
	require.NoError(t, deadPub.Publish(consumer.DeadLetterTopic(group), message.NewMessage(aggregate.NewID(), []byte(`{}`))))
	require.Eventually(t, func() bool { return depth(dead) == 1 }, 10*time.Second, 20*time.Millisecond)
	r = bentoEnv(t, env, "", "consumer", "delete", "--group", group, "--yes")
	assert.Equal(t, 1, r.code, "a dead letter is left")
	assert.Contains(t, r.stderr, "1 in "+dead)
	assert.Contains(t, r.stderr, "--force")
	assert.Equal(t, 1, depth(p0)+depth(p1), "the refusal deleted nothing")

	r = bentoEnv(t, env, "y\n", "consumer", "delete", "--group", group, "--force")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "deleted 4 queue(s) with 3 message(s)") // the dead letter, and its copy in the tap
	for _, q := range []string{p0, p1, dead, tap} {
		_, err := rabbitmq.QueueDepth(t.Context(), b.cfg, q)
		require.ErrorIs(t, err, messaging.ErrQueueNotFound, q)
	}

	r = bentoEnv(t, env, "", "consumer", "delete", "--topology", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "deleted 2 queue(s) with 0 message(s): "+rabbitmq.UnroutableQueue(ex.Name)+", "+rabbitmq.UnroutableQueue(deadCfg.Exchange))
	assert.Contains(t, r.stdout, "4 exchange(s): "+ex.Name+", "+ex.Name+".unroutable, "+deadCfg.Exchange+", "+deadCfg.Exchange+".unroutable")
	r = bentoEnv(t, env, "", "consumer", "delete", "--group", group, "--topology", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "nothing to delete")
}

// TestConsumerDeclareUnpartitioned: "bento consumer declare --partitions
// 0" declares the group's one queue and its dead-letter queue, which
// "bento consumer delete" deletes.
func TestConsumerDeclareUnpartitioned(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	group := "flat" + aggregate.NewID()[18:]
	b.ex.Queues(group, consumer.DeadLetterQueue(group))
	r := bentoEnv(t, b.env, "", "consumer", "declare", "--group", group, "--event-type", "flat.*", "--partitions", "0")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "declared queue "+group)
	b.publish(t, "flat.event")
	require.Eventually(t, func() bool { return b.depth(t, group) == 1 }, 10*time.Second, 20*time.Millisecond)
	assert.Zero(t, b.depth(t, consumer.DeadLetterQueue(group)))

	r = bentoEnv(t, b.env, "", "consumer", "delete", "--group", group, "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "deleted 2 queue(s) with 1 message(s): "+group+", "+consumer.DeadLetterQueue(group))
}

// broker is a fresh exchange on the test broker, the environment that
// points bento at it, and a publisher to it.
type broker struct {
	ex  *testenv.Exchange
	cfg *rabbitmq.Config
	env []string
	pub *rabbitmq.Publisher
}

func newBroker(t *testing.T) *broker {
	t.Helper()
	ex := testenv.NewExchange(t)
	b := &broker{ex: ex, cfg: &rabbitmq.Config{URL: ex.URL, Exchange: ex.Name},
		env: []string{"AMQP_URL=" + ex.URL, "BENTO_EXCHANGE=" + ex.Name}}
	pub, err := rabbitmq.NewPublisher(t.Context(), b.cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	b.pub = pub
	ex.Queues(rabbitmq.UnroutableQueue(ex.Name))
	return b
}

// publish publishes an event of type eventType and returns it.
func (b *broker) publish(t *testing.T, eventType string) *message.Message {
	t.Helper()
	m := message.NewMessage(aggregate.NewID(), []byte(`{}`))
	m.Metadata.Set(messaging.MetaEventType, eventType)
	require.NoError(t, b.pub.Publish(eventType, m))
	return m
}

// depth returns how many messages wait in queue.
func (b *broker) depth(t *testing.T, queue string) int {
	t.Helper()
	n, err := rabbitmq.QueueDepth(t.Context(), b.cfg, queue)
	require.NoError(t, err)
	return n
}
