package redisbus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/examples/redisbus"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
)

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	_, err := redisbus.NewPublisher(redisbus.Config{DB: -1, StreamPrefix: "a*", MaxIdleTime: -time.Second})
	require.ErrorIs(t, err, redisbus.ErrInvalidConfig)
	for _, field := range []string{"Addr", "DB", "StreamPrefix", "MaxIdleTime"} {
		assert.Contains(t, err.Error(), field)
	}

	_, err = redisbus.NewSubscriber(redisbus.Config{}, "g", []string{"order.paid"})
	assert.ErrorIs(t, err, redisbus.ErrInvalidConfig)

	_, err = redisbus.NewConsumer(nil, redisbus.Config{Addr: "127.0.0.1:1"}, nil)
	assert.ErrorIs(t, err, consumer.ErrInvalidConfig)
}

// TestPublisherNamesItsSystem: the projector's publish spans say "redis",
// as they say "rabbitmq" for bento's own publishers. The publisher connects
// on first use, so no Redis is needed.
func TestPublisherNamesItsSystem(t *testing.T) {
	t.Parallel()
	pub, err := redisbus.NewPublisher(redisbus.Config{Addr: "127.0.0.1:1"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	named, ok := pub.(projector.SystemNamer)
	require.True(t, ok, "%T does not implement projector.SystemNamer", pub)
	assert.Equal(t, "redis", named.MessagingSystem())
}

// TestSubscriberRejectsPatterns: streams are read by exact name, so a
// wildcard topic is an error, found before anything is sent to Redis.
func TestSubscriberRejectsPatterns(t *testing.T) {
	t.Parallel()
	cfg := redisbus.Config{Addr: "127.0.0.1:1"} // never dialled
	for _, topics := range [][]string{{"order.*"}, {"order.paid", "#"}, {"order.#.late"}} {
		_, err := redisbus.NewSubscriber(cfg, "g", topics)
		assert.ErrorIs(t, err, redisbus.ErrTopicPattern, "topics %q", topics)
	}
	_, err := redisbus.NewSubscriber(cfg, "", nil)
	require.ErrorIs(t, err, redisbus.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "empty group")
	assert.Contains(t, err.Error(), "no topics")
}

// TestGroupStartsAtFirstEntry: a group reads its streams from their first
// entry, so what was published before the group existed is not lost, and
// from NewSubscriber on it keeps what is published, even before Subscribe.
func TestGroupStartsAtFirstEntry(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t, requireRedis(t))
	pub := publisher(t, cfg)
	before := message.NewMessage("before-the-group", []byte(`{}`))
	require.NoError(t, pub.Publish("order.paid", before))

	sub, err := redisbus.NewSubscriber(cfg, "g", []string{"order.paid"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	beforeSubscribe := message.NewMessage("before-subscribe", []byte(`{}`))
	require.NoError(t, pub.Publish("order.paid", beforeSubscribe))

	ch, err := sub.Subscribe(context.Background(), "ignored")
	require.NoError(t, err)
	for _, want := range []string{before.UUID, beforeSubscribe.UUID} {
		m := receive(t, ch)
		assert.Equal(t, want, m.UUID)
		m.Ack()
	}
}

// TestAckAfterCancelCounts: a message in the consumer's hands when the
// Subscribe context ends still counts its Ack, so it is not redelivered.
func TestAckAfterCancelCounts(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t, requireRedis(t))
	cfg.ClaimInterval, cfg.MaxIdleTime = 50*time.Millisecond, 200*time.Millisecond
	pub := publisher(t, cfg)
	sub, err := redisbus.NewSubscriber(cfg, "g", []string{"order.paid"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, "")
	require.NoError(t, err)
	held := message.NewMessage("held", []byte(`{}`))
	require.NoError(t, pub.Publish("order.paid", held))
	m := receive(t, ch)
	require.Equal(t, held.UUID, m.UUID)

	cancel()
	for range ch { // closed once the context ended, message in hand or not
	}
	m.Ack()
	require.NoError(t, sub.Close())

	// Another consumer of the group claims whatever stays pending after
	// MaxIdleTime; the acked message must not be among it.
	next := message.NewMessage("next", []byte(`{}`))
	require.NoError(t, pub.Publish("order.paid", next))
	other, err := redisbus.NewSubscriber(cfg, "g", []string{"order.paid"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	ch2, err := other.Subscribe(context.Background(), "")
	require.NoError(t, err)
	got := receive(t, ch2)
	assert.Equal(t, next.UUID, got.UUID)
	got.Ack()
	select {
	case m := <-ch2:
		t.Errorf("message %s came back after its Ack", m.UUID)
		m.Ack()
	case <-time.After(5 * (cfg.MaxIdleTime + cfg.ClaimInterval)):
	}
}

// TestUnreadableEntry: an entry another program appended is delivered
// with MetaUnmarshalError, for the consumer to dead-letter, and the stream
// goes on.
func TestUnreadableEntry(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t, requireRedis(t))
	pub := publisher(t, cfg)
	sub, err := redisbus.NewSubscriber(cfg, "g", []string{"order.paid"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	ch, err := sub.Subscribe(context.Background(), "")
	require.NoError(t, err)

	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.XAdd(context.Background(), &redis.XAddArgs{
		Stream: cfg.StreamPrefix + "order.paid", Values: map[string]any{"hello": "world"},
	}).Err())
	good := message.NewMessage("good", []byte(`{}`))
	require.NoError(t, pub.Publish("order.paid", good))

	bad := receive(t, ch)
	assert.NotEmpty(t, bad.Metadata.Get(redisbus.MetaUnmarshalError))
	assert.JSONEq(t, `{"hello":"world"}`, string(bad.Payload))
	bad.Ack()
	m := receive(t, ch)
	assert.Equal(t, good.UUID, m.UUID)
	m.Ack()
}

func TestClosed(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t, requireRedis(t))
	pub := publisher(t, cfg)
	assert.ErrorIs(t, pub.Publish("order.*", message.NewMessage("x", nil)), redisbus.ErrTopicPattern)
	require.NoError(t, pub.Close())
	require.NoError(t, pub.Close())
	assert.ErrorIs(t, pub.Publish("order.paid", message.NewMessage("x", nil)), redisbus.ErrClosed)

	sub, err := redisbus.NewSubscriber(cfg, "g", []string{"order.paid"})
	require.NoError(t, err)
	ch, err := sub.Subscribe(context.Background(), "")
	require.NoError(t, err)
	require.NoError(t, sub.Close())
	require.NoError(t, sub.Close())
	_, open := <-ch
	assert.False(t, open, "channel open after Close")
	_, err = sub.Subscribe(context.Background(), "")
	assert.True(t, errors.Is(err, redisbus.ErrClosed), "Subscribe after Close: %v", err)
}

func publisher(t *testing.T, cfg redisbus.Config) message.Publisher {
	t.Helper()
	pub, err := redisbus.NewPublisher(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// receive returns the next message of ch, failing after 10s.
func receive(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		require.True(t, ok, "channel closed")
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message within 10s")
		return nil
	}
}

// TestDeadLetters: NewConsumer publishes what fails for good to the group's
// dead-letter stream, with the reason, and the group goes on.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t, requireRedis(t))
	ctx := context.Background()
	db := openSQLite(t)
	require.NoError(t, outbox.Migrate(ctx, db))
	require.NoError(t, inbox.Migrate(ctx, db))
	ccfg := consumer.DefaultConfig("billing")
	ccfg.Logger = testLogger()
	c, err := redisbus.NewConsumer(db, cfg, ccfg)
	require.NoError(t, err)
	require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e order.OrderPaid, env *messaging.Envelope) error {
		return consumer.Permanent(errors.New("card declined"))
	}))
	runConsumer(t, c)

	m, err := messaging.NewMessage(&outbox.Message{
		ID: aggregate.NewID(), TenantID: "default", Topic: "order.paid", AggregateType: "order",
		AggregateID: "o-1", AggregateVersion: 2, SchemaVersion: 1,
		Payload: outbox.JSON(`{"order_id":"o-1","amount_cents":100}`), OccurredAt: time.Now(),
	})
	require.NoError(t, err)
	require.NoError(t, publisher(t, cfg).Publish("order.paid", m))

	dead, err := redisbus.NewSubscriber(cfg, "dead-letter-reader", []string{consumer.DeadLetterTopic("billing")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dead.Close() })
	ch, err := dead.Subscribe(ctx, "")
	require.NoError(t, err)
	got := receive(t, ch)
	got.Ack()
	assert.Equal(t, m.UUID, got.UUID)
	assert.Contains(t, got.Metadata.Get(consumer.MetaDeadReason), "card declined")
	assert.Equal(t, string(m.Payload), string(got.Payload))
}
