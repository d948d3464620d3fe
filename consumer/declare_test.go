package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// declareEnv is a fresh exchange, a migrated PostgreSQL schema and a
// publisher to the exchange.
type declareEnv struct {
	ex   *testenv.Exchange
	db   *gorm.DB
	amqp *rabbitmq.Config
	pub  *rabbitmq.Publisher
}

func newDeclareEnv(t *testing.T) *declareEnv {
	t.Helper()
	ex := testenv.NewExchange(t)
	db, _ := testenv.Postgres(t)
	require.NoError(t, inbox.Migrate(t.Context(), db))
	cfg := &rabbitmq.Config{URL: ex.URL, Exchange: ex.Name, Logger: quiet}
	pub, err := rabbitmq.NewPublisher(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return &declareEnv{ex: ex, db: db, amqp: cfg, pub: pub}
}

// group returns a fresh group's DefaultConfig, with change applied, whose
// queues are deleted at cleanup.
func (e *declareEnv) group(change func(*consumer.Config)) *consumer.Config {
	group := "decl" + aggregate.NewID()[18:]
	e.ex.Queues(group)
	e.ex.Partitioned(group, 2)
	cfg := consumer.DefaultConfig(group)
	cfg.Logger, cfg.TakeoverTime = quiet, 2*time.Second
	change(cfg)
	return cfg
}

// TestDeclareIsWhatAnInstanceDeclares: for each kind of group, Declare
// with its Config alone, an event published then, and an instance started
// afterwards with NewAMQP and the same Config: the instance runs (its own
// declarations match, no 406) and handles the event that came before it.
func TestDeclareIsWhatAnInstanceDeclares(t *testing.T) {
	t.Parallel()
	e := newDeclareEnv(t)
	for name, change := range map[string]func(*consumer.Config){
		"quorum partitions":  func(c *consumer.Config) { c.Partitions = 2 },
		"classic partitions": func(c *consumer.Config) { c.Partitions, c.QueueType = 2, rabbitmq.Classic },
		"delivery limit":     func(c *consumer.Config) { c.Partitions, c.DeliveryLimit = 2, 40 },
		"unpartitioned":      func(c *consumer.Config) { c.Partitions = -1 },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := e.group(change)
			require.NoError(t, consumer.Declare(t.Context(), e.amqp, cfg, OrderPaid{}.EventType()))
			require.NoError(t, e.pub.Publish("order.paid", eventMsg(t, "order.paid", 1, OrderPaid{OrderID: cfg.Group}, nil)))

			c, err := consumer.NewAMQP(t.Context(), e.db, e.amqp, cfg)
			require.NoError(t, err)
			got := make(chan string, 1)
			require.NoError(t, consumer.Handle(c, func(_ context.Context, _ *gorm.DB, ev OrderPaid, _ *messaging.Envelope) error {
				got <- ev.OrderID
				return nil
			}))
			run(t, c)
			select {
			case id := <-got:
				assert.Equal(t, cfg.Group, id)
			case <-time.After(20 * time.Second):
				t.Fatal("the event published before the instance started never reached it")
			}
		})
	}
}

// TestDeclareWithAnotherConfigIsAMismatch: an instance whose Config
// differs from the one the group was declared with (another delivery
// limit, classic instead of quorum queues) fails with
// rabbitmq.ErrTopologyMismatch, naming the queue, not with a bare 406; so
// does Declare.
func TestDeclareWithAnotherConfigIsAMismatch(t *testing.T) {
	t.Parallel()
	e := newDeclareEnv(t)
	cfg := e.group(func(c *consumer.Config) { c.Partitions = 2 })
	require.NoError(t, consumer.Declare(t.Context(), e.amqp, cfg, "order.*"))

	other := *cfg
	other.QueueType = rabbitmq.Classic
	err := consumer.Declare(t.Context(), e.amqp, &other, "order.*")
	require.ErrorIs(t, err, rabbitmq.ErrTopologyMismatch)
	assert.Contains(t, err.Error(), messaging.PartitionQueue(cfg.Group, 0))

	other = *cfg
	other.DeliveryLimit = 40
	c, err := consumer.NewAMQP(t.Context(), e.db, e.amqp, &other)
	require.NoError(t, err)
	require.NoError(t, consumer.Handle(c, func(context.Context, *gorm.DB, OrderPaid, *messaging.Envelope) error { return nil }))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err = c.Run(ctx)
	require.ErrorIs(t, err, rabbitmq.ErrTopologyMismatch)
	assert.Contains(t, err.Error(), "x-delivery-limit")

	require.ErrorIs(t, consumer.Declare(t.Context(), e.amqp, cfg), consumer.ErrInvalidConfig, "no event type")
	require.ErrorIs(t, consumer.Declare(t.Context(), e.amqp, &consumer.Config{}, "order.*"), consumer.ErrInvalidConfig, "no group")
}

// TestDeleteUndoesDeclare: Delete finds what Declare declared (a dry run
// deletes nothing), refuses while the dead-letter queue holds a dead
// letter, deletes it all when forced, and with Topology and no group
// deletes the exchanges' topology.
func TestDeleteUndoesDeclare(t *testing.T) {
	t.Parallel()
	e := newDeclareEnv(t)
	cfg := e.group(func(c *consumer.Config) { c.Partitions = 2 })
	ctx := t.Context()
	require.NoError(t, consumer.Declare(ctx, e.amqp, cfg, "order.*"))
	require.NoError(t, e.pub.Publish("order.paid", eventMsg(t, "order.paid", 1, OrderPaid{OrderID: "o-1"}, nil)))
	p0, p1, dead := messaging.PartitionQueue(cfg.Group, 0), messaging.PartitionQueue(cfg.Group, 1), consumer.DeadLetterQueue(cfg.Group)
	tap := consumer.DeadLetterTap(cfg.Group)
	depth := func(q string) int {
		n, err := rabbitmq.QueueDepth(ctx, e.amqp, q)
		require.NoError(t, err, q)
		return n
	}
	testenv.WaitFor(t, 10*time.Second, "the event in a partition", func() bool { return depth(p0)+depth(p1) == 1 })

	found, err := consumer.Delete(ctx, e.amqp, cfg.Group, &consumer.DeleteOpts{DryRun: true})
	require.NoError(t, err)
	assert.Equal(t, []string{p0, p1, dead, tap}, found.Queues)
	assert.Equal(t, 1, found.Messages)
	assert.Equal(t, []string{e.amqp.Exchange + ".hash." + cfg.Group}, found.Exchanges)
	assert.Equal(t, 1, depth(p0)+depth(p1), "a dry run deletes nothing")

	deadCfg := *e.amqp
	deadCfg.Exchange = consumer.DeadLetterExchange(e.amqp.Exchange)
	deadPub, err := rabbitmq.NewPublisher(ctx, &deadCfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = deadPub.Close() })
	require.NoError(t, deadPub.Publish(consumer.DeadLetterTopic(cfg.Group), message.NewMessage("d-1", []byte(`{}`))))
	testenv.WaitFor(t, 10*time.Second, "the dead letter in its queue", func() bool { return depth(dead) == 1 })
	for _, opts := range []*consumer.DeleteOpts{nil, {DryRun: true}, {Topology: true}} {
		_, err = consumer.Delete(ctx, e.amqp, cfg.Group, opts)
		require.ErrorIs(t, err, consumer.ErrDeadLettersLeft, "%+v", opts)
		assert.Contains(t, err.Error(), "1 in "+dead)
	}
	assert.Equal(t, 1, depth(p0)+depth(p1), "a refusal deletes nothing")
	assert.Equal(t, 1, depth(dead))

	done, err := consumer.Delete(ctx, e.amqp, cfg.Group, &consumer.DeleteOpts{Force: true})
	require.NoError(t, err)
	assert.Equal(t, []string{p0, p1, dead, tap}, done.Queues)
	assert.Equal(t, 3, done.Messages) // the event, the dead letter and its copy in the tap
	for _, q := range []string{p0, p1, dead, tap} {
		_, err := rabbitmq.QueueDepth(ctx, e.amqp, q)
		require.ErrorIs(t, err, messaging.ErrQueueNotFound, q)
	}

	done, err = consumer.Delete(ctx, e.amqp, "", &consumer.DeleteOpts{Topology: true})
	require.NoError(t, err)
	ex := e.amqp.Exchange
	assert.Equal(t, []string{ex, ex + ".unroutable", ex + ".dead", ex + ".dead.unroutable"}, done.Exchanges)
	done, err = consumer.Delete(ctx, e.amqp, cfg.Group, &consumer.DeleteOpts{Topology: true})
	require.NoError(t, err)
	assert.Empty(t, done.Queues, "nothing left")
	assert.Empty(t, done.Exchanges, "nothing left")

	_, err = consumer.Delete(ctx, e.amqp, "", nil)
	require.ErrorIs(t, err, consumer.ErrInvalidConfig, "nothing to delete")
	_, err = consumer.Delete(ctx, e.amqp, "bad group", nil)
	require.ErrorIs(t, err, messaging.ErrInvalidName)
}
