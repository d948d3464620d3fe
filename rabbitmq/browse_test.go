package rabbitmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/buscheck"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// TestBrowseQueueWaitsForAnotherBrowse: while one browse holds a queue's
// messages, a second browse of it waits, and gives up with its context's
// error having seen nothing; once the first one's connection dies, the
// next browse sees every message, in order.
func TestBrowseQueueWaitsForAnotherBrowse(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	queue := r.group("browsed")
	require.NoError(t, rabbitmq.DeclareQueue(ctxTimeout(t), r.cfg, queue, "browse.*"))
	pub := r.publisher()
	for i := range 3 {
		require.NoError(t, pub.Publish("browse.it", message.NewMessage(fmt.Sprint("m", i), []byte(`{}`))))
	}
	require.Eventually(t, func() bool { return r.depth(queue) == 3 }, buscheck.WaitFor, 20*time.Millisecond)

	holding := make(chan struct{})
	hold, dies := context.WithCancel(t.Context())
	held := make(chan error, 1)
	go func() {
		held <- rabbitmq.BrowseQueue(hold, r.cfg, queue, 10, func(*message.Message) (rabbitmq.Browse, error) {
			close(holding)
			<-hold.Done() // its connection dies with it
			return rabbitmq.Browse{}, hold.Err()
		})
	}()
	<-holding
	browse := func(ctx context.Context) ([]string, error) {
		var ids []string
		err := rabbitmq.BrowseQueue(ctx, r.cfg, queue, 10, func(m *message.Message) (rabbitmq.Browse, error) {
			ids = append(ids, m.UUID)
			return rabbitmq.Browse{}, nil
		})
		return ids, err
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	ids, err := browse(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Empty(t, ids, "nothing seen while the other browse holds the queue")

	dies()
	require.ErrorIs(t, <-held, context.Canceled)
	ids, err = browse(ctxTimeout(t))
	require.NoError(t, err)
	assert.Equal(t, []string{"m0", "m1", "m2"}, ids, "every message, in its place")
}

// TestGroupRouteReachesTheGroupOnly: a partitioned group's route is its
// hash exchange, a group of one queue's is that queue through the default
// exchange, and a group with neither has none.
func TestGroupRouteReachesTheGroupOnly(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	ctx := ctxTimeout(t)
	_, err := rabbitmq.GroupRoute(ctx, r.cfg, r.name+".nobody")
	require.ErrorIs(t, err, messaging.ErrQueueNotFound)

	plain := r.group("plain")
	require.NoError(t, rabbitmq.DeclareQueue(ctx, r.cfg, plain, "order.*"))
	route, err := rabbitmq.GroupRoute(ctx, r.cfg, plain)
	require.NoError(t, err)
	assert.Equal(t, rabbitmq.Route{Key: plain}, route)

	spec := r.partitions("parted", 2)
	require.NoError(t, rabbitmq.DeclarePartitions(ctx, r.cfg, spec))
	route, err = rabbitmq.GroupRoute(ctx, r.cfg, spec.Group)
	require.NoError(t, err)
	assert.Equal(t, rabbitmq.Route{Exchange: r.name + ".hash." + spec.Group}, route)
}
