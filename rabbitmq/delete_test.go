package rabbitmq_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/buscheck"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// TestDeleteRemovesWhatDeclareDeclared declares a partitioned group, a
// plain group and the topology, publishes into them, and deletes them
// again: a dry run says what would go and leaves it, the deletes remove it
// with its messages, and a second delete finds nothing.
func TestDeleteRemovesWhatDeclareDeclared(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	spec := r.partitions("billing", 3)
	require.NoError(t, rabbitmq.DeclarePartitions(ctxTimeout(t), r.cfg, spec))
	plain := r.group("shipping")
	require.NoError(t, rabbitmq.DeclareQueue(ctxTimeout(t), r.cfg, plain, "order.*"))
	pub := r.publisher()
	require.NoError(t, pub.Publish("order.placed", buscheck.AggMsg("a1", 1), buscheck.AggMsg("a2", 1)))
	require.NoError(t, pub.Publish("invoice.sent", buscheck.AggMsg("a3", 1))) // bound to nothing: unroutable
	parts := []string{messaging.PartitionQueue(spec.Group, 0), messaging.PartitionQueue(spec.Group, 1),
		messaging.PartitionQueue(spec.Group, 2)}
	hash := r.name + ".hash." + spec.Group

	dry, err := rabbitmq.DeletePartitions(ctxTimeout(t), r.cfg, spec.Group, &rabbitmq.DeleteOpts{DryRun: true})
	require.NoError(t, err)
	assert.Equal(t, rabbitmq.Deleted{Queues: parts, Messages: 2, Exchanges: []string{hash}}, dry)
	for _, q := range parts {
		_, err := rabbitmq.QueueDepth(ctxTimeout(t), r.cfg, q)
		require.NoError(t, err, "a dry run deletes nothing")
	}

	got, err := rabbitmq.DeletePartitions(ctxTimeout(t), r.cfg, spec.Group, nil)
	require.NoError(t, err)
	assert.Equal(t, dry, got, "the delete removes what the dry run found")
	for _, q := range parts {
		_, err := rabbitmq.QueueDepth(ctxTimeout(t), r.cfg, q)
		require.ErrorIs(t, err, messaging.ErrQueueNotFound, q)
	}

	got, err = rabbitmq.DeleteQueues(ctxTimeout(t), r.cfg, []string{plain, r.name + ".nothing"}, nil)
	require.NoError(t, err)
	assert.Equal(t, rabbitmq.Deleted{Queues: []string{plain}, Messages: 2}, got, "a missing queue is skipped")

	unroutable := rabbitmq.UnroutableQueue(r.name)
	got, err = rabbitmq.DeleteTopology(ctxTimeout(t), r.cfg, nil)
	require.NoError(t, err)
	assert.Equal(t, rabbitmq.Deleted{Queues: []string{unroutable}, Messages: 1,
		Exchanges: []string{r.name, r.name + ".unroutable"}}, got)
	_, err = rabbitmq.QueueDepth(ctxTimeout(t), r.cfg, unroutable)
	require.ErrorIs(t, err, messaging.ErrQueueNotFound)

	for name, del := range map[string]func() (rabbitmq.Deleted, error){
		"partitions": func() (rabbitmq.Deleted, error) {
			return rabbitmq.DeletePartitions(ctxTimeout(t), r.cfg, spec.Group, nil)
		},
		"queues": func() (rabbitmq.Deleted, error) {
			return rabbitmq.DeleteQueues(ctxTimeout(t), r.cfg, []string{plain}, nil)
		},
		"topology": func() (rabbitmq.Deleted, error) { return rabbitmq.DeleteTopology(ctxTimeout(t), r.cfg, nil) },
	} {
		again, err := del()
		require.NoError(t, err, name)
		assert.Equal(t, rabbitmq.Deleted{}, again, "%s: nothing is left to delete", name)
	}
}

func TestDeleteRejectsBadNames(t *testing.T) {
	t.Parallel()
	cfg := &rabbitmq.Config{URL: "amqp://guest:guest@127.0.0.1:1/", Exchange: "bento"}
	_, err := rabbitmq.DeleteQueues(t.Context(), cfg, []string{"ok", ""}, nil)
	require.ErrorIs(t, err, messaging.ErrInvalidName)
	_, err = rabbitmq.DeletePartitions(t.Context(), cfg, "bad name", nil)
	require.ErrorIs(t, err, messaging.ErrInvalidName)
	_, err = rabbitmq.DeleteTopology(t.Context(), &rabbitmq.Config{}, nil)
	require.ErrorIs(t, err, rabbitmq.ErrInvalidConfig)
}
