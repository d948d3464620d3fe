package rabbitmq_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/buscheck"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// TestTapCopiesAndDrainsInOrder: a tap queue receives a copy of what is
// routed with its key, beside the queue bound the same way; Drain removes
// what fn accepts, oldest first, and leaves the message fn refuses, with
// those after it, for the next Drain.
func TestTapCopiesAndDrainsInOrder(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	queue, tapQueue := r.group("billing"), r.group("billing.tap")
	require.NoError(t, rabbitmq.DeclareQueue(ctxTimeout(t), r.cfg, queue, "order.placed"))
	require.NoError(t, rabbitmq.DeclareTap(ctxTimeout(t), r.cfg, tapQueue, "order.placed"))
	pub := r.publisher()
	for i := range 3 {
		require.NoError(t, pub.Publish("order.placed", buscheck.AggMsg("a", i)))
	}
	assert.Equal(t, 3, r.depth(queue), "the bound queue keeps its messages")

	tap := rabbitmq.NewTap(r.cfg, tapQueue)
	t.Cleanup(func() { _ = tap.Close() })
	refuse := errors.New("not now")
	var seen []string
	n, err := tap.Drain(ctxTimeout(t), func(m *message.Message) error {
		seen = append(seen, m.UUID)
		if m.UUID == "a-001" {
			return refuse
		}
		return nil
	})
	require.ErrorIs(t, err, refuse)
	assert.Equal(t, 1, n)
	assert.Equal(t, []string{"a-000", "a-001"}, seen)

	seen = nil
	n, err = tap.Drain(ctxTimeout(t), func(m *message.Message) error { seen = append(seen, m.UUID); return nil })
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.Equal(t, []string{"a-001", "a-002"}, seen, "the refused message stayed in its place")
	assert.Equal(t, 0, r.depth(tapQueue))
	assert.Equal(t, 3, r.depth(queue))

	_, err = rabbitmq.NewTap(r.cfg, r.name+".no-such-tap").Drain(ctxTimeout(t), func(*message.Message) error { return nil })
	require.ErrorIs(t, err, messaging.ErrQueueNotFound)
}
