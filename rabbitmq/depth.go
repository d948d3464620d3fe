package rabbitmq

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/messaging"
)

// QueueDepth returns how many messages wait in queue on the broker of cfg:
// the ready ones, not those delivered and not yet acked. It opens a
// connection of its own for the call.
//
// Errors: messaging.ErrQueueNotFound, ErrInvalidConfig, or the broker's error.
func QueueDepth(ctx context.Context, cfg *Config, queue string) (int, error) {
	c, err := cfg.resolve()
	if err != nil {
		return 0, err
	}
	var n int
	err = c.withChannel(ctx, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if isNotFound(err) {
			return fmt.Errorf("%w: %q", messaging.ErrQueueNotFound, queue)
		}
		if err != nil {
			return fmt.Errorf("rabbitmq: inspect queue %q: %w", queue, err)
		}
		n = q.Messages
		return nil
	})
	return n, err
}

// Ping checks that the broker of cfg accepts a connection and a channel.
func Ping(ctx context.Context, cfg *Config) error {
	c, err := cfg.resolve()
	if err != nil {
		return err
	}
	return c.withChannel(ctx, func(*amqp.Channel) error { return nil })
}
