package rabbitmq

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/messaging"
)

// Browse is what the function BrowseQueue calls says to do with a message.
type Browse struct {
	// Republish, when not empty, publishes the message, as the function
	// left it (its metadata may have been changed), to the config's
	// exchange with this routing key, and waits for the broker's confirm.
	Republish string
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
// Errors: messaging.ErrQueueNotFound, ErrInvalidConfig, fn's error, or the broker's.
func BrowseQueue(ctx context.Context, cfg *Config, queue string, limit int, fn func(*message.Message) (Browse, error)) error {
	c, err := cfg.resolve()
	if err != nil {
		return err
	}
	return c.withChannel(ctx, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return fmt.Errorf("rabbitmq: confirm mode: %w", err)
		}
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
			if b.Republish != "" {
				if err := republish(ctx, ch, c.Exchange, b.Republish, msg); err != nil {
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
	})
}

// republish publishes msg to exchange with routing key topic on ch, in
// confirm mode, and waits for the confirm.
func republish(ctx context.Context, ch *amqp.Channel, exchange, topic string, msg *message.Message) error {
	pub, err := marshaler{}.Marshal(msg)
	if err != nil {
		return fmt.Errorf("rabbitmq: republish %s: %w", msg.UUID, err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, topic, true, false, pub)
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
	return nil
}
