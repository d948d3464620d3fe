package consumer_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// TestBrokerDeadLetterIsLoggedAndHolds: a message the broker dead-letters
// itself, past its partition queue's delivery limit, while no instance saw
// it near the limit (here a bare subscriber takes it and gives it back
// until the broker gives up, as processes dying before they look would),
// is logged at Warn like any dead letter, and holds its aggregate back:
// the aggregate's next event, behind it in the queue, is parked, not
// applied ahead of it. (It used to be dead-lettered without a word, and
// the next event applied.)
func TestBrokerDeadLetterIsLoggedAndHolds(t *testing.T) {
	const limit = 2
	b := newOrderedBed(t, func(c *consumer.Config) { c.DeliveryLimit = limit })
	ccfg := consumer.DefaultConfig(b.group)
	ccfg.Partitions, ccfg.DeliveryLimit, ccfg.TakeoverTime = orderPartitions, limit, orderTakeover
	logs := &recorder{}
	ccfg.Logger = slog.New(logs)
	c, err := consumer.NewAMQP(t.Context(), b.db, b.amqp, ccfg) // declares the tap
	require.NoError(t, err)
	require.NoError(t, consumer.Handle(c, checkOrder("in-process")))
	publishBacklog(t, b, 1, 2)

	// The partition holding a000's two events.
	queue := ""
	testenv.WaitFor(t, 10*time.Second, "the events routed", func() bool {
		for p := range orderPartitions {
			if q := messaging.PartitionQueue(b.group, p); deadDepth(t, b.ex.URL, q) == 2 {
				queue = q
				return true
			}
		}
		return false
	})
	spec := consumer.PartitionSpec(b.ex.Name, ccfg)
	spec.Patterns = []string{Step{}.EventType()}
	sub, err := rabbitmq.NewPartitionSubscriber(t.Context(), b.amqp, spec)
	require.NoError(t, err)
	for deliveries := 0; deadDepth(t, b.ex.URL, consumer.DeadLetterQueue(b.group)) == 0; deliveries++ {
		require.LessOrEqual(t, deliveries, limit+1, "delivered more often than the limit allows")
		ctx, stop := context.WithCancel(t.Context())
		msgs, err := sub.Subscribe(ctx, queue)
		require.NoError(t, err)
		select {
		case m := <-msgs:
			require.Equal(t, "a000-001", m.UUID)
			m.Nack()
		case <-time.After(2 * time.Second):
		}
		stop()
		time.Sleep(100 * time.Millisecond) // the give-back reaches the broker
	}
	require.NoError(t, sub.Close())

	run(t, c)
	var attrs map[string]string
	testenv.WaitFor(t, 20*time.Second, "the broker's dead letter logged", func() bool {
		a, level, ok := logs.find("consumer: dead letter")
		attrs = a
		return ok && level == slog.LevelWarn
	})
	assert.Equal(t, "a000-001", attrs["message_id"])
	assert.Equal(t, "broker", attrs["by"])
	assert.Equal(t, consumer.CausePoison, attrs["cause"])
	assert.Equal(t, "a000", attrs["aggregate_id"])
	assert.Contains(t, attrs["err"], "delivery limit")

	var heldBehind string
	require.NoError(t, b.db.Raw(`SELECT message_id FROM inbox_holds WHERE consumer = ? AND aggregate_id = 'a000'`,
		b.group).Scan(&heldBehind).Error)
	assert.Equal(t, "a000-001", heldBehind, "the aggregate is held behind the broker's dead letter")
	testenv.WaitFor(t, 20*time.Second, "its next event parked", func() bool {
		var n int64
		b.db.Raw(`SELECT count(*) FROM inbox_parked WHERE consumer = ? AND message_id = 'a000-002'`, b.group).Scan(&n)
		return n == 1
	})
	assert.Empty(t, b.versions(t, "a000"), "nothing of the aggregate applied ahead of its dead letter")
}
