package rabbitmq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/buscheck"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/rabbitmq"
)

// rabbit is a test's view of the broker: a config with an exchange of its
// own, and a raw connection for looking behind the package's back.
type rabbit struct {
	t    *testing.T
	cfg  *rabbitmq.Config
	conn *amqp.Connection
	ch   *amqp.Channel
	name string // unique prefix of the test's exchange and queues
}

func setupRabbit(t *testing.T) *rabbit {
	t.Helper()
	url := testenv.RequireAMQP(t)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "bt." + hex.EncodeToString(b)
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	r := &rabbit{
		t:    t,
		name: name,
		conn: conn,
		ch:   ch,
		cfg: &rabbitmq.Config{
			URL:      url,
			Exchange: name,
			Logger:   slog.New(slog.DiscardHandler),
		},
	}
	t.Cleanup(func() {
		// A fresh channel: a failed assertion may have closed ch.
		if c, err := conn.Channel(); err == nil {
			_, _ = c.QueueDelete(name+".unroutable", false, false, false)
			_ = c.ExchangeDelete(name, false, false)
			_ = c.ExchangeDelete(name+".unroutable", false, false)
			_ = c.Close()
		}
		_ = conn.Close()
	})
	return r
}

// group returns a unique queue name, deleted at cleanup.
func (r *rabbit) group(suffix string) string {
	g := r.name + "." + suffix
	r.t.Cleanup(func() {
		if c, err := r.conn.Channel(); err == nil {
			_, _ = c.QueueDelete(g, false, false, false)
			_ = c.Close()
		}
	})
	return g
}

func (r *rabbit) publisher() *rabbitmq.Publisher {
	r.t.Helper()
	p, err := rabbitmq.NewPublisher(ctxTimeout(r.t), r.cfg)
	require.NoError(r.t, err)
	r.t.Cleanup(func() { _ = p.Close() })
	return p
}

// depth returns how many messages wait in queue.
func (r *rabbit) depth(queue string) int {
	r.t.Helper()
	q, err := r.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(r.t, err)
	return q.Messages
}

// get fetches one message from queue with basic.get and acks it.
func (r *rabbit) get(queue string) amqp.Delivery {
	r.t.Helper()
	d, ok, err := r.ch.Get(queue, true)
	require.NoError(r.t, err)
	require.True(r.t, ok, "queue %s is empty", queue)
	return d
}

// orderRow is an outbox row of an order aggregate with a correlation id.
func orderRow() *outbox.Message {
	return &outbox.Message{ID: "01JD0000000000000000000001", TenantID: "acme", Topic: "order.paid",
		AggregateType: "order", AggregateID: "o-42", AggregateVersion: 7, SchemaVersion: 1,
		Payload:    outbox.JSON(`{"order_id":"o-42","amount_cents":1200}`),
		Metadata:   outbox.Metadata{messaging.MetaCorrelationID: "01JD0000000000000000000000"},
		OccurredAt: time.Date(2026, 11, 21, 10, 30, 0, 0, time.UTC)}
}

// msg is a bare message whose id is also its payload.
func msg(id string) *message.Message {
	return message.NewMessage(id, []byte(`{"id":"`+id+`"}`))
}

func ctxTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), buscheck.WaitFor)
	t.Cleanup(cancel)
	return ctx
}

func TestAMQPPublisherWire(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	group := r.group("billing")
	require.NoError(t, rabbitmq.DeclareQueue(ctxTimeout(t), r.cfg, group, "order.*"))
	pub := r.publisher()

	row := orderRow()
	msg, err := messaging.NewMessage(row)
	require.NoError(t, err)
	require.NoError(t, pub.Publish("order.paid", msg))

	other := orderRow()
	other.ID, other.Topic = "01JD0000000000000000000002", "invoice.sent"
	stray, err := messaging.NewMessage(other)
	require.NoError(t, err)
	require.NoError(t, pub.Publish("invoice.sent", stray), "unroutable is confirmed, via the alternate exchange")

	// Publish returns after the confirm, so the messages are enqueued.
	require.Equal(t, 1, r.depth(group))
	require.Equal(t, 1, r.depth(r.name+".unroutable"))

	d := r.get(group)
	assert.Equal(t, r.name, d.Exchange)
	assert.Equal(t, "order.paid", d.RoutingKey)
	assert.Equal(t, uint8(amqp.Persistent), d.DeliveryMode)
	assert.Equal(t, row.ID, d.MessageId)
	assert.Equal(t, "application/json", d.ContentType)
	assert.Equal(t, row.ID, d.Headers[wamqp.DefaultMessageUUIDHeaderKey])
	for k, v := range msg.Metadata {
		assert.Equal(t, v, d.Headers[k], "header %s", k)
	}
	for _, k := range []string{"event_type", "tenant_id", "schema_version", "occurred_at", "correlation_id", "aggregate_id", "aggregate_type", "aggregate_version"} {
		assert.Contains(t, d.Headers, k)
	}
	assert.JSONEq(t, string(row.Payload), string(d.Body))

	u := r.get(r.name + ".unroutable")
	assert.Equal(t, "invoice.sent", u.RoutingKey)
	assert.Equal(t, other.ID, u.MessageId)
	assert.Equal(t, 0, r.depth(group))
}

func TestAMQPSubscriberDecodeAckNack(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	group := r.group("audit")
	sub, err := rabbitmq.NewSubscriber(t.Context(), r.cfg, group, "order.#")
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	pub := r.publisher()

	// The queue exists once the subscriber is built: this is kept.
	rows := map[string]string{"01JD0000000000000000000011": "order.paid", "01JD0000000000000000000012": "order.paid.late"}
	for id, topic := range rows {
		row := orderRow()
		row.ID, row.Topic = id, topic
		m, err := messaging.NewMessage(row)
		require.NoError(t, err)
		require.NoError(t, pub.Publish(topic, m))
	}

	ch, err := sub.Subscribe(t.Context(), "topic is ignored")
	require.NoError(t, err)

	const nacked = "01JD0000000000000000000011"
	deliveries := map[string]int{}
	for len(deliveries) < 2 || deliveries[nacked] < 2 {
		m := buscheck.Receive(t, ch)
		env, err := messaging.Decode(m)
		require.NoError(t, err)
		assert.Equal(t, m.UUID, env.ID)
		assert.Equal(t, rows[env.ID], env.EventType)
		assert.Equal(t, "acme", env.TenantID)
		assert.Equal(t, int64(7), env.AggregateVersion)
		assert.JSONEq(t, `{"order_id":"o-42","amount_cents":1200}`, string(env.Payload))
		deliveries[m.UUID]++
		if m.UUID == nacked && deliveries[m.UUID] == 1 {
			require.True(t, m.Nack())
			continue
		}
		require.True(t, m.Ack())
		require.LessOrEqual(t, len(deliveries)+deliveries[nacked], 4, "unexpected deliveries: %v", deliveries)
	}
	assert.Equal(t, map[string]int{nacked: 2, "01JD0000000000000000000012": 1}, deliveries)

	require.NoError(t, sub.Close())
	buscheck.RequireClosed(t, ch)
	_, err = sub.Subscribe(t.Context(), "")
	require.ErrorIs(t, err, messaging.ErrClosed)
	require.NoError(t, pub.Close())
	require.ErrorIs(t, pub.Publish("order.paid", msg("x")), messaging.ErrClosed)
}

func TestAMQPSubscriberCompetingConsumers(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	group := r.group("workers")
	sub, err := rabbitmq.NewSubscriber(t.Context(), r.cfg, group, "job.*")
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	pub := r.publisher()
	const n = 40
	for i := range n {
		require.NoError(t, pub.Publish("job.run", message.NewMessage(fmt.Sprintf("m%02d", i), []byte(`{}`))))
	}
	ch1, err := sub.Subscribe(t.Context(), "")
	require.NoError(t, err)
	ch2, err := sub.Subscribe(t.Context(), "")
	require.NoError(t, err)
	seen := map[string]int{}
	for len(seen) < n {
		var m *message.Message
		select {
		case m = <-ch1:
		case m = <-ch2:
		case <-time.After(buscheck.WaitFor):
			t.Fatalf("got %d of %d messages", len(seen), n)
		}
		seen[m.UUID]++
		m.Ack()
	}
	for id, c := range seen {
		assert.Equal(t, 1, c, "message %s", id)
	}
}

func TestAMQPSubscriberContextCancel(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	group := r.group("cancel")
	sub, err := rabbitmq.NewSubscriber(t.Context(), r.cfg, group, "job.*")
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	pub := r.publisher()
	const n = 30
	for i := range n {
		require.NoError(t, pub.Publish("job.run", message.NewMessage(fmt.Sprintf("m%02d", i), []byte(`{}`))))
	}
	seen := map[string]bool{}
	for round := 0; len(seen) < n; round++ {
		require.Less(t, round, n, "no progress")
		ctx, cancel := context.WithCancel(t.Context())
		ch, err := sub.Subscribe(ctx, "")
		require.NoError(t, err)
		m := buscheck.Receive(t, ch)
		seen[m.UUID] = true
		m.Ack()
		cancel()
		buscheck.RequireClosed(t, ch) // at once, and nothing more after the cancel
	}
	assert.Len(t, seen, n, "messages prefetched by cancelled subscriptions are requeued")
}

func TestAMQPSubscriberForeignProducer(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	group := r.group("foreign")
	sub, err := rabbitmq.NewSubscriber(t.Context(), r.cfg, group, "order.*")
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })

	died := time.Date(2026, 11, 21, 8, 0, 0, 0, time.UTC)
	headers := amqp.Table{
		"x-death": []any{amqp.Table{
			"count": int64(2), "reason": "rejected", "queue": "orders", "exchange": "",
			"time": died, "routing-keys": []any{"order.paid"},
		}},
		"x-first-death-reason": "rejected",
		"retries":              int32(3),
		"ratio":                float64(0.5),
		"flag":                 true,
		"raw":                  []byte("bytes"),
		"nothing":              nil,
		"event_type":           "order.paid",
	}
	require.NoError(t, r.ch.PublishWithContext(ctxTimeout(t), r.name, "order.paid", false, false, amqp.Publishing{
		MessageId: "foreign-1", Headers: headers, Body: []byte(`{"a":1}`),
	}))
	require.NoError(t, r.ch.PublishWithContext(ctxTimeout(t), r.name, "order.paid", false, false, amqp.Publishing{
		MessageId: "foreign-2", Body: []byte(`{"a":2}`), // no headers at all
	}))

	ch, err := sub.Subscribe(t.Context(), "")
	require.NoError(t, err)
	m := buscheck.Receive(t, ch)
	require.Equal(t, "foreign-1", m.UUID)
	assert.Equal(t, `{"a":1}`, string(m.Payload))
	assert.Equal(t, "order.paid", m.Metadata.Get("event_type"))
	assert.Equal(t, "3", m.Metadata.Get("retries"))
	assert.Equal(t, "0.5", m.Metadata.Get("ratio"))
	assert.Equal(t, "true", m.Metadata.Get("flag"))
	assert.Equal(t, "bytes", m.Metadata.Get("raw"))
	assert.NotContains(t, m.Metadata, "nothing")
	var death []map[string]any
	require.NoError(t, json.Unmarshal([]byte(m.Metadata.Get("x-death")), &death))
	require.Len(t, death, 1)
	assert.Equal(t, "rejected", death[0]["reason"])
	assert.EqualValues(t, 2, death[0]["count"])
	m.Ack()

	m = buscheck.Receive(t, ch)
	assert.Equal(t, "foreign-2", m.UUID)
	assert.Empty(t, m.Metadata)
	m.Ack()
}

func TestAMQPPublisherConcurrent(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	group := r.group("all")
	require.NoError(t, rabbitmq.DeclareQueue(ctxTimeout(t), r.cfg, group, "#"))
	pub := r.publisher()

	const n, workers = 200, 16
	ids := make(chan string, n)
	for i := range n {
		ids <- fmt.Sprintf("c%03d", i)
	}
	close(ids)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range workers {
		wg.Go(func() {
			for id := range ids {
				if err := pub.Publish(fmt.Sprintf("load.w%d", w), message.NewMessage(id, []byte(`{}`))); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, n, r.depth(group), "every confirmed message is enqueued once")

	deliveries, err := r.ch.Consume(group, "", true, false, false, false, nil)
	require.NoError(t, err)
	seen := map[string]int{}
	for range n {
		select {
		case d := <-deliveries:
			seen[d.MessageId]++
		case <-time.After(buscheck.WaitFor):
			t.Fatalf("got %d of %d messages", len(seen), n)
		}
	}
	assert.Len(t, seen, n)
	for id, c := range seen {
		assert.Equal(t, 1, c, "message %s", id)
	}
}

func TestAMQPTopologyConflict(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	// An exchange of that name without the alternate-exchange argument.
	require.NoError(t, r.ch.ExchangeDeclare(r.name, "topic", true, false, false, false, nil))
	_, err := rabbitmq.NewPublisher(ctxTimeout(r.t), r.cfg)
	var aerr *amqp.Error
	require.ErrorAs(t, err, &aerr)
	assert.Equal(t, amqp.PreconditionFailed, aerr.Code)
}

func TestAMQPDeclareIdempotent(t *testing.T) {
	t.Parallel()
	r := setupRabbit(t)
	group := r.group("g")
	for range 2 {
		require.NoError(t, rabbitmq.DeclareTopology(ctxTimeout(t), r.cfg))
		require.NoError(t, rabbitmq.DeclareQueue(ctxTimeout(t), r.cfg, group, "a.*", "b.#"))
	}
	require.NoError(t, rabbitmq.DeclareQueue(ctxTimeout(t), r.cfg, group, "c"))
	pub := r.publisher()
	for _, topic := range []string{"a.x", "b", "b.y.z", "c", "d"} {
		require.NoError(t, pub.Publish(topic, msg(topic)))
	}
	assert.Equal(t, 4, r.depth(group))
	assert.Equal(t, 1, r.depth(r.name+".unroutable"))

	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, rabbitmq.DeclareTopology(cancelled, r.cfg), context.Canceled)
}

func TestAMQPConfigValidation(t *testing.T) {
	t.Parallel()
	bad := &rabbitmq.Config{
		URL:             "http://guest:guest@127.0.0.1:5672/",
		Exchange:        "amq.topic",
		ChannelPoolSize: -1,
		PrefetchCount:   -1,
		Heartbeat:       500 * time.Millisecond,
	}
	fields := []string{"URL", "Exchange", "ChannelPoolSize", "PrefetchCount", "Heartbeat"}
	check := func(t *testing.T, err error, fields ...string) {
		t.Helper()
		require.ErrorIs(t, err, rabbitmq.ErrInvalidConfig)
		var joined interface{ Unwrap() []error }
		require.ErrorAs(t, err, &joined)
		problems := joined.Unwrap()
		require.Len(t, problems, len(fields), "%v", err)
		for i, f := range fields {
			assert.ErrorIs(t, problems[i], rabbitmq.ErrInvalidConfig)
			assert.Contains(t, problems[i].Error(), "Config."+f+" ")
		}
	}
	_, err := rabbitmq.NewPublisher(t.Context(), bad)
	check(t, err, fields...)
	_, err = rabbitmq.NewSubscriber(t.Context(), bad, "g", "a")
	check(t, err, fields...)
	check(t, rabbitmq.DeclareTopology(t.Context(), bad), fields...)
	check(t, rabbitmq.DeclareQueue(t.Context(), bad, "g", "a"), fields...)

	_, err = rabbitmq.NewPublisher(t.Context(), nil)
	check(t, err, "URL") // the one field without a default
	check(t, rabbitmq.DeclareTopology(t.Context(), &rabbitmq.Config{
		URL: "amqp://guest:guest@127.0.0.1:5672/", Exchange: "has space", PrefetchCount: 70000,
	}), "Exchange", "PrefetchCount")

	// The password never shows in the error.
	_, err = rabbitmq.NewPublisher(t.Context(), &rabbitmq.Config{URL: "amqp://u:s3cret@127.0.0.1:bad/", Exchange: rabbitmq.DefaultExchange})
	check(t, err, "URL")
	assert.NotContains(t, err.Error(), "s3cret")

	good := &rabbitmq.Config{URL: "amqps://u:p@127.0.0.1/vhost", Exchange: rabbitmq.DefaultExchange}
	for _, args := range [][]string{{"", "a"}, {"amq.g", "a"}, {"g"}, {"g", "a..b"}} {
		err := rabbitmq.DeclareQueue(t.Context(), good, args[0], args[1:]...)
		require.ErrorIs(t, err, messaging.ErrInvalidName, "%q", args)
		require.False(t, errors.Is(err, rabbitmq.ErrInvalidConfig))
		_, err = rabbitmq.NewSubscriber(t.Context(), good, args[0], args[1:]...)
		require.ErrorIs(t, err, messaging.ErrInvalidName, "%q", args)
	}
	assert.True(t, strings.HasPrefix(rabbitmq.DefaultExchange, "bento."))
}

// TestAMQPConfigDefaults checks that a zero field takes its default: a
// config with only a URL is complete, and the exchange it names is
// DefaultExchange.
func TestAMQPConfigDefaults(t *testing.T) {
	t.Parallel()
	const url = "amqp://guest:guest@127.0.0.1:5672/"
	c, err := rabbitmq.Resolve(&rabbitmq.Config{URL: url})
	require.NoError(t, err)
	assert.Equal(t, "bento.events", c.Exchange)
	assert.Equal(t, 16, c.ChannelPoolSize)
	assert.Equal(t, 32, c.PrefetchCount)
	assert.Equal(t, 10*time.Second, c.Heartbeat)
	assert.NotNil(t, c.Logger)
	assert.Equal(t, "bento.events", (&rabbitmq.Config{}).ExchangeName())
	assert.Equal(t, "bento.events", (*rabbitmq.Config)(nil).ExchangeName())
	assert.Equal(t, "x.events", (&rabbitmq.Config{Exchange: "x.events"}).ExchangeName())

	c, err = rabbitmq.Resolve(&rabbitmq.Config{URL: url, Exchange: "x.events", PrefetchCount: 5})
	require.NoError(t, err)
	assert.Equal(t, "x.events", c.Exchange)
	assert.Equal(t, 5, c.PrefetchCount)

	_, err = rabbitmq.Resolve(&rabbitmq.Config{URL: url, ChannelPoolSize: -1})
	require.ErrorIs(t, err, rabbitmq.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "Config.ChannelPoolSize")
}

// TestPartitionSpecDefaults checks that a zero DeliveryLimit gives quorum
// partition queues DefaultDeliveryLimit.
func TestPartitionSpecDefaults(t *testing.T) {
	t.Parallel()
	args := rabbitmq.QueueArgs(rabbitmq.PartitionSpec{Group: "g", Count: 1, DeadKey: "g.dead"})
	assert.Equal(t, 500, args["x-delivery-limit"])
	args = rabbitmq.QueueArgs(rabbitmq.PartitionSpec{Group: "g", Count: 1, DeadKey: "g.dead", DeliveryLimit: 3})
	assert.Equal(t, 3, args["x-delivery-limit"])
}
