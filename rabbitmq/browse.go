package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// Bounds of the wait for a queue another browse holds.
const (
	lockWaitMin = 50 * time.Millisecond
	lockWaitMax = time.Second
)

// BrowseQueue calls fn for up to limit messages of queue on the broker of
// cfg, oldest first, and does with each what fn says: nothing, republish
// it, remove it. The messages fn does not remove go back to the queue, in
// their places, when BrowseQueue returns; while it runs, they are held by
// it and no consumer receives them, so browse queues without consumers,
// such as dead-letter queues. fn's error stops the browse (nothing is done
// with that message) and is returned.
//
// Browses of one queue run one at a time, in this process or any other:
// each first takes a lock on the broker, the exclusive queue
// "<queue>.lock", which lives as long as its connection, and waits for a
// browse holding it to end, until ctx ends. So no browse misses the
// messages another one holds, and a process that dies lets go of the lock
// with its connection.
//
// Errors: messaging.ErrQueueNotFound, ErrInvalidConfig, fn's error, ctx's
// error, or the broker's.
func BrowseQueue(ctx context.Context, cfg *Config, queue string, limit int, fn func(*message.Message) (Browse, error)) error {
	c, err := cfg.resolve()
	if err != nil {
		return err
	}
	return c.withConn(ctx, func(conn *amqp.Connection) error {
		if err := lockQueue(ctx, conn, queue); err != nil {
			return err
		}
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("rabbitmq: open AMQP channel: %w", err)
		}
		return browse(ctx, ch, queue, limit, fn)
	})
}

// lockName is the exclusive queue that locks queue for a browse.
func lockName(queue string) string { return queue + ".lock" }

// lockQueue takes the browse lock of queue for conn: it declares the
// exclusive, auto-delete queue lockName(queue), which one connection at a
// time can have and the broker deletes with that connection. While another
// connection has it, the broker refuses the declaration (RESOURCE_LOCKED)
// and closes the channel: lockQueue tries again on a new channel, backing
// off, until ctx ends.
func lockQueue(ctx context.Context, conn *amqp.Connection, queue string) error {
	name := lockName(queue)
	for wait := lockWaitMin; ; wait = min(2*wait, lockWaitMax) {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("rabbitmq: open AMQP channel: %w", err)
		}
		_, err = ch.QueueDeclare(name, false, true, true, false, nil)
		var ae *amqp.Error
		switch {
		case err == nil:
			return ch.Close()
		case !errors.As(err, &ae) || ae.Code != amqp.ResourceLocked:
			return fmt.Errorf("rabbitmq: lock %q: declare %q: %w", queue, name, err)
		}
		t := time.NewTimer(wait/2 + rand.N(wait/2))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("rabbitmq: wait for another browse of %q to end: %w", queue, ctx.Err())
		case <-t.C:
		}
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
