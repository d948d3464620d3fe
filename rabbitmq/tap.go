package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/messaging"
)

// Bounds of a tap queue (see DeclareTap).
const (
	// TapMaxLength is how many messages a tap queue keeps: past it the
	// oldest are dropped.
	TapMaxLength = 10_000
	// TapExpiry is how long a tap queue lives unused (no consumer, no
	// get) before the broker deletes it.
	TapExpiry = 7 * 24 * time.Hour
)

// DeclareTap declares the durable queue named queue, bound to cfg's
// exchange with key: from then on it receives a copy of every message
// routed there with key, beside the queues bound the same way, for a
// [Tap] to read. It keeps at most TapMaxLength messages (the oldest
// dropped first) and the broker deletes it after TapExpiry unused.
// Declaring is idempotent.
//
// Errors: ErrInvalidConfig, messaging.ErrInvalidName, or the broker's.
func DeclareTap(ctx context.Context, cfg *Config, queue, key string) error {
	c, err := cfg.resolve()
	if err != nil {
		return err
	}
	if err := errors.Join(messaging.ValidateGroup(queue), messaging.ValidatePatterns([]string{key})); err != nil {
		return fmt.Errorf("declare tap: %w", err)
	}
	return c.withChannel(ctx, func(ch *amqp.Channel) error {
		if err := declareExchanges(ch, c.Exchange); err != nil {
			return err
		}
		args := amqp.Table{"x-max-length": int64(TapMaxLength), "x-expires": TapExpiry.Milliseconds()}
		if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
			return fmt.Errorf("rabbitmq: declare tap queue %q: %w", queue, err)
		}
		if err := ch.QueueBind(queue, key, c.Exchange, false, nil); err != nil {
			return fmt.Errorf("rabbitmq: bind tap queue %q to %q with %q: %w", queue, c.Exchange, key, err)
		}
		return nil
	})
}

// Tap reads a tap queue (see DeclareTap) over one connection, opened at
// the first Drain and again after a failure. It is safe for concurrent
// use; drains run one at a time.
type Tap struct {
	cfg   *Config
	queue string

	mu   sync.Mutex
	conn *amqp.Connection
	ch   *amqp.Channel
}

// NewTap returns a Tap of queue on the broker of cfg. It connects lazily.
func NewTap(cfg *Config, queue string) *Tap { return &Tap{cfg: cfg, queue: queue} }

// Drain takes the messages of the tap queue, oldest first, until it is
// empty, and calls fn with each: a message fn returns nil for is removed;
// fn's error stops the drain, the message stays in its place, and Drain
// returns the error. It returns how many messages it removed. The end of
// ctx ends it, closing the connection.
//
// Errors: messaging.ErrQueueNotFound, ErrInvalidConfig, fn's error, ctx's
// error, or the broker's.
func (t *Tap) Drain(ctx context.Context, fn func(*message.Message) error) (n int, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ch, err := t.channel(ctx)
	if err != nil {
		return 0, err
	}
	conn := t.conn
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() }) // a broker that stopped answering
	defer func() {
		stop()
		if err != nil {
			t.reset() // a failed channel is closed; open a new one next time
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		d, ok, err := ch.Get(t.queue, false)
		switch {
		case isNotFound(err):
			return n, fmt.Errorf("%w: %q", messaging.ErrQueueNotFound, t.queue)
		case err != nil:
			return n, fmt.Errorf("rabbitmq: get from %q: %w", t.queue, err)
		case !ok:
			return n, nil
		}
		msg, _ := marshaler{}.Unmarshal(d)
		msg.SetContext(ctx)
		if err := fn(msg); err != nil {
			_ = d.Nack(false, true)
			return n, err
		}
		if err := d.Ack(false); err != nil {
			return n, fmt.Errorf("rabbitmq: remove %s from %q: %w", msg.UUID, t.queue, err)
		}
		n++
	}
}

// channel returns the tap's channel, connecting first when it has none.
func (t *Tap) channel(ctx context.Context) (*amqp.Channel, error) {
	if t.ch != nil && !t.ch.IsClosed() {
		return t.ch, nil
	}
	t.reset()
	c, err := t.cfg.resolve()
	if err != nil {
		return nil, err
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("rabbitmq: open AMQP channel: %w", err)
	}
	t.conn, t.ch = conn, ch
	return ch, nil
}

// reset closes the tap's connection, if any.
func (t *Tap) reset() {
	if t.conn != nil {
		_ = t.conn.Close()
	}
	t.conn, t.ch = nil, nil
}

// Close closes the tap's connection.
func (t *Tap) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reset()
	return nil
}
