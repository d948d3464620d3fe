package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// TestUnroutableAndDeclareThroughTheBinary: an event relayed before any
// group consumes its type is parked; bento lists it; replaying it with no
// queue bound brings it back (and says so); once bento declared the
// group's partition queues ahead of the group's deployment, a replay
// delivers it into them, with its id.
func TestUnroutableAndDeclareThroughTheBinary(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ex, env := b.ex, b.env
	m := b.publish(t, "late.event")
	depth := func(q string) int { return b.depth(t, q) }
	require.Eventually(t, func() bool { return depth(rabbitmq.UnroutableQueue(ex.Name)) == 1 }, 10*time.Second, 20*time.Millisecond)

	r := bentoEnv(t, env, "", "unroutable", "list")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, fieldLines(r.stdout), "late.event 1")
	assert.Contains(t, r.stdout, m.UUID)

	r = bentoEnv(t, env, "", "unroutable", "replay", "--event-type", "late.event", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "1 came back")

	group := "late" + aggregate.NewID()[18:]
	ex.Partitioned(group, 2)
	r = bentoEnv(t, env, "", "consumer", "declare", "--group", group, "--event-type", "late.*", "--partitions", "2")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "declared 2 partition queues")
	r = bentoEnv(t, env, "", "unroutable", "replay", "--event-type", "late.event", "--dry-run")
	assert.Contains(t, r.stdout, "would replay 1")
	r = bentoEnv(t, env, "", "unroutable", "replay", "--event-type", "late.event", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "replayed 1")
	assert.NotContains(t, r.stdout, "came back")
	p0, p1 := messaging.PartitionQueue(group, 0), messaging.PartitionQueue(group, 1)
	require.Eventually(t, func() bool { return depth(p0)+depth(p1) == 1 }, 10*time.Second, 20*time.Millisecond)
	assert.Zero(t, depth(rabbitmq.UnroutableQueue(ex.Name)))
}
