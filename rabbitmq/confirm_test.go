package rabbitmq_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/tcpproxy"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// confirmSetup declares a fresh exchange with a queue bound to "order.#".
func confirmSetup(t *testing.T) (*rabbitmq.Config, string, *amqp.Channel) {
	t.Helper()
	ex := testenv.NewExchange(t)
	cfg := &rabbitmq.Config{URL: ex.URL, Exchange: ex.Name, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	q := ex.Name + ".orders"
	ex.Queues(q)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, rabbitmq.DeclareQueue(ctx, cfg, q, "order.#"))
	conn, err := amqp.Dial(ex.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	return cfg, q, ch
}

func outgoing(n int, topic func(i int) string) []messaging.Outgoing {
	out := make([]messaging.Outgoing, n)
	for i := range out {
		m := message.NewMessage(fmt.Sprintf("msg-%04d", i), []byte(fmt.Sprintf(`{"n":%d}`, i)))
		m.Metadata.Set(messaging.MetaEventType, topic(i))
		out[i] = messaging.Outgoing{Topic: topic(i), Message: m}
	}
	return out
}

func queued(t *testing.T, ch *amqp.Channel, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func TestConfirmPublisherBatch(t *testing.T) {
	t.Parallel()
	cfg, q, ch := confirmSetup(t)
	p, err := rabbitmq.NewConfirmPublisher(t.Context(), cfg)
	require.NoError(t, err)
	defer p.Close()

	batch := outgoing(300, func(i int) string {
		if i%3 == 0 {
			return "invoice.sent" // bound nowhere: goes to the alternate exchange
		}
		return "order.paid"
	})
	errs := p.PublishBatch(context.Background(), batch)
	for i, err := range errs {
		require.NoError(t, err, "message %d", i)
	}
	got := queued(t, ch, q)
	require.Len(t, got, 200)
	for i, d := range got {
		assert.Equal(t, "order.paid", d.RoutingKey)
		assert.Equal(t, amqp.Persistent, d.DeliveryMode)
		assert.Equal(t, d.MessageId, d.Headers["_watermill_message_uuid"])
		assert.Equal(t, "order.paid", d.Headers[messaging.MetaEventType])
		if i > 0 {
			assert.Greater(t, d.MessageId, got[i-1].MessageId, "one channel keeps publish order")
		}
	}
	assert.Len(t, queued(t, ch, cfg.Exchange+".unroutable"), 100)

	// Publish (message.Publisher) works too.
	require.NoError(t, p.Publish("order.placed", message.NewMessage("single", []byte(`{}`))))
	assert.Len(t, queued(t, ch, q), 1)
}

// TestConfirmPublisherReportsReturns removes the alternate exchange's queue:
// a message nothing can take is returned by the broker, and the publisher
// says so instead of counting it as published.
func TestConfirmPublisherReportsReturns(t *testing.T) {
	t.Parallel()
	cfg, q, ch := confirmSetup(t)
	_, err := ch.QueueDelete(cfg.Exchange+".unroutable", false, false, false)
	require.NoError(t, err)
	p, err := rabbitmq.NewConfirmPublisher(t.Context(), cfg)
	require.NoError(t, err)
	defer p.Close()
	_, _ = ch.QueueDelete(cfg.Exchange+".unroutable", false, false, false) // declared again by the constructor

	errs := p.PublishBatch(context.Background(), outgoing(4, func(i int) string {
		if i%2 == 0 {
			return "order.paid"
		}
		return "nobody.listens"
	}))
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], rabbitmq.ErrReturned)
	assert.NoError(t, errs[2])
	assert.ErrorIs(t, errs[3], rabbitmq.ErrReturned)
	assert.Len(t, queued(t, ch, q), 2)
}

// TestConfirmPublisherReconnects cuts the connection: the batch in flight
// fails, and the next one reconnects and succeeds.
func TestConfirmPublisherReconnects(t *testing.T) {
	t.Parallel()
	cfg, q, ch := confirmSetup(t)
	via := *cfg
	var proxy *tcpproxy.Proxy
	via.URL, proxy = testenv.Proxied(t, cfg.URL)
	p, err := rabbitmq.NewConfirmPublisher(t.Context(), &via)
	require.NoError(t, err)
	defer p.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, err := range p.PublishBatch(ctx, outgoing(10, func(int) string { return "order.paid" })) {
		require.NoError(t, err)
	}
	proxy.Cut()
	failed := 0
	for _, err := range p.PublishBatch(ctx, outgoing(10, func(int) string { return "order.paid" })) {
		if err != nil {
			failed++
		}
	}
	assert.Equal(t, 10, failed, "nothing is reported published while the broker is unreachable")
	proxy.Restore()
	var errs []error
	testenv.Poll(10*time.Second, func() bool {
		errs = p.PublishBatch(context.Background(), outgoing(10, func(int) string { return "order.paid" }))
		return errs[0] == nil
	})
	for _, err := range errs {
		require.NoError(t, err, "the publisher reconnects")
	}
	assert.GreaterOrEqual(t, len(queued(t, ch, q)), 20)

	require.NoError(t, p.Close())
	require.ErrorIs(t, p.PublishBatch(context.Background(), outgoing(1, func(int) string { return "order.paid" }))[0], messaging.ErrClosed)
}
