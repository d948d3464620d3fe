package rabbitmq_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/buscheck"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// TestUnroutableEventsCanBeReplayedOnceTheirQueueExists: an event no queue
// is bound for waits in the unroutable queue; listing leaves it there; a
// replay before any queue exists brings it straight back (counted, not
// lost); once a group's queue is declared, a replay delivers it there with
// its id and takes it out of the unroutable queue.
func TestUnroutableEventsCanBeReplayedOnceTheirQueueExists(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	pub := r.publisher()
	late := message.NewMessage("late-1", []byte(`{"n":1}`))
	late.Metadata.Set(messaging.MetaEventType, "late.event")
	late.Metadata.Set(messaging.MetaTenantID, "acme")
	require.NoError(t, pub.Publish("late.event", late))
	other := message.NewMessage("other-1", []byte(`{}`))
	other.Metadata.Set(messaging.MetaEventType, "other.event")
	other.Metadata.Set(messaging.MetaTenantID, "globex")
	require.NoError(t, pub.Publish("other.event", other))
	unroutable := rabbitmq.UnroutableQueue(r.name)
	require.Eventually(t, func() bool { return r.depth(unroutable) == 2 }, buscheck.WaitFor, 20*time.Millisecond)

	ctx := t.Context()
	parked, err := rabbitmq.ListUnroutable(ctx, r.cfg, rabbitmq.UnroutableFilter{EventTypes: []string{"late.event"}}, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	assert.Equal(t, "late-1", parked[0].UUID)
	assert.Equal(t, 2, r.depth(unroutable), "listing leaves them")
	parked, err = rabbitmq.ListUnroutable(ctx, r.cfg, rabbitmq.UnroutableFilter{TenantID: "globex"}, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1, "one tenant's")
	assert.Equal(t, "other-1", parked[0].UUID)
	replayed, _, err := rabbitmq.ReplayUnroutable(ctx, r.cfg, rabbitmq.UnroutableFilter{EventTypes: []string{"late.event"}, TenantID: "globex"})
	require.NoError(t, err)
	assert.Empty(t, replayed, "late.event is acme's")

	replayed, back, err := rabbitmq.ReplayUnroutable(ctx, r.cfg, rabbitmq.UnroutableFilter{EventTypes: []string{"late.event"}})
	require.NoError(t, err)
	assert.Len(t, replayed, 1)
	assert.Equal(t, 1, back, "no queue yet: it came straight back")
	require.Eventually(t, func() bool { return r.depth(unroutable) == 2 }, buscheck.WaitFor, 20*time.Millisecond)

	queue := r.name + ".late-group"
	require.NoError(t, rabbitmq.DeclareQueue(ctx, r.cfg, queue, "late.*"))
	t.Cleanup(func() { _, _ = r.ch.QueueDelete(queue, false, false, false) })
	replayed, back, err = rabbitmq.ReplayUnroutable(ctx, r.cfg, rabbitmq.UnroutableFilter{EventTypes: []string{"late.event"}})
	require.NoError(t, err)
	assert.Len(t, replayed, 1)
	assert.Zero(t, back)
	require.Eventually(t, func() bool { return r.depth(queue) == 1 }, buscheck.WaitFor, 20*time.Millisecond)
	d := r.get(queue)
	assert.Equal(t, "late-1", d.MessageId, "its id kept")
	assert.Equal(t, 1, r.depth(unroutable), "the other event stays parked")
}
