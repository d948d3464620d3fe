package rabbitmq

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/messaging"
)

// Browse is what the function BrowseQueue calls says to do with a message.
type Browse struct {
	// Republish, when not nil, publishes the message, as the function left
	// it (its metadata may have been changed), to this route, and waits
	// for the broker's confirm. A message the route delivers to no queue
	// fails the browse, and stays in its place.
	Republish *Route
	// Remove takes the message out of the queue (after its republish was
	// confirmed). A message not removed stays, in its place.
	Remove bool
}

// BrowseQueue calls fn for up to limit messages of queue on the broker of
// cfg, oldest first, and does with each what fn says: nothing, republish
// it, remove it. The messages fn does not remove go back to the queue, in
// their places, when BrowseQueue returns; while it runs, they are held by
// it and no consumer receives them, so browse queues without consumers,
// such as dead-letter queues. fn's error stops the browse (nothing is done
// with that message) and is returned.
//
// Browses of one queue run one at a time, in this process or any other:
// each first takes a lock on the broker (see lockQueue), held by its
// connection, and waits for a browse holding it to end, until ctx ends.
// So no browse misses the messages another one holds, and a process that
// dies lets go of the lock with its connection.
//
// Errors: messaging.ErrQueueNotFound, ErrInvalidConfig, fn's error, ctx's
// error, or the broker's.
func BrowseQueue(ctx context.Context, cfg *Config, queue string, limit int, fn func(*message.Message) (Browse, error)) error {
	c, err := cfg.resolve()
	if err != nil {
		return err
	}
	return c.withConn(ctx, func(conn *amqp.Connection) error {
		release, err := lockQueue(ctx, conn, queue)
		if err != nil {
			return err
		}
		defer release()
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("rabbitmq: open AMQP channel: %w", err)
		}
		// Closed before the lock is released (deferred calls run last
		// first): the messages the browse holds are back in the queue
		// before the next browse may look.
		defer func() { _ = ch.Close() }()
		return browse(ctx, ch, queue, limit, fn)
	})
}

// lockName is the queue that locks queue for a browse.
func lockName(queue string) string { return queue + ".browsing" }

// lockExpiry is how long the broker keeps a lock queue nobody consumes
// (a process that died between declaring and consuming it).
const lockExpiry = time.Minute

// lockQueue takes the browse lock of queue for conn and returns its
// release. The lock is the queue lockName(queue), with a single active
// consumer: each browse consumes it, one message at a time, and
// publishes a token to it; the broker delivers only to the active
// consumer, so the browse that receives a token holds the lock, and the
// others wait, without polling and without a refused declaration, until
// it closes its channel (or its connection dies), which gives its token
// to the next. The queue keeps one ready token at most and is deleted
// with its last consumer.
func lockQueue(ctx context.Context, conn *amqp.Connection, queue string) (release func(), err error) {
	name := lockName(queue)
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: open AMQP channel: %w", err)
	}
	closeCh := func() { _ = ch.Close() }
	defer func() {
		if err != nil {
			closeCh()
		}
	}()
	args := amqp.Table{"x-single-active-consumer": true, "x-max-length": int64(1), "x-expires": lockExpiry.Milliseconds()}
	if _, err := ch.QueueDeclare(name, false, true, false, false, args); err != nil {
		return nil, fmt.Errorf("rabbitmq: lock %q: declare %q: %w", queue, name, err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		return nil, fmt.Errorf("rabbitmq: lock %q: %w", queue, err)
	}
	tokens, err := ch.Consume(name, "", false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: lock %q: consume %q: %w", queue, name, err)
	}
	if err := ch.PublishWithContext(ctx, "", name, false, false, amqp.Publishing{Body: []byte("token")}); err != nil {
		return nil, fmt.Errorf("rabbitmq: lock %q: publish a token: %w", queue, err)
	}
	select {
	case _, ok := <-tokens:
		if !ok {
			return nil, fmt.Errorf("rabbitmq: lock %q: the channel closed", queue)
		}
		return closeCh, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("rabbitmq: wait for another browse of %q to end: %w", queue, ctx.Err())
	}
}

// browse is BrowseQueue on ch, once it holds the lock of queue.
func browse(ctx context.Context, ch *amqp.Channel, queue string, limit int, fn func(*message.Message) (Browse, error)) error {
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("rabbitmq: confirm mode: %w", err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	for n := 0; n < limit; n++ {
		d, ok, err := ch.Get(queue, false)
		if isNotFound(err) {
			return fmt.Errorf("%w: %q", messaging.ErrQueueNotFound, queue)
		}
		if err != nil {
			return fmt.Errorf("rabbitmq: get from %q: %w", queue, err)
		}
		if !ok {
			return nil // the queue is empty
		}
		msg, _ := marshaler{}.Unmarshal(d)
		b, err := fn(msg)
		if err != nil {
			return err
		}
		if b.Republish != nil {
			if err := republish(ctx, ch, returns, *b.Republish, msg); err != nil {
				return err
			}
		}
		if b.Remove {
			if err := d.Ack(false); err != nil {
				return fmt.Errorf("rabbitmq: remove %s from %q: %w", msg.UUID, queue, err)
			}
		}
	}
	return nil
}

// republish publishes msg to r on ch, in confirm mode and mandatory, and
// waits for the confirm; returns is ch's NotifyReturn channel, which
// receives the message before its confirm when no queue took it.
func republish(ctx context.Context, ch *amqp.Channel, returns <-chan amqp.Return, r Route, msg *message.Message) error {
	pub, err := marshaler{}.Marshal(msg)
	if err != nil {
		return fmt.Errorf("rabbitmq: republish %s: %w", msg.UUID, err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, r.Exchange, r.Key, true, false, pub)
	if err != nil {
		return fmt.Errorf("rabbitmq: republish %s: %w", msg.UUID, err)
	}
	acked, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("rabbitmq: republish %s: %w", msg.UUID, err)
	case !acked:
		return fmt.Errorf("rabbitmq: republish %s: the broker refused it", msg.UUID)
	}
	select {
	case ret := <-returns:
		return fmt.Errorf("rabbitmq: republish %s: exchange %q routed it to no queue with key %q (%s)",
			msg.UUID, r.Exchange, r.Key, ret.ReplyText)
	default:
		return nil
	}
}
