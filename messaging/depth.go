package messaging

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrQueueNotFound is returned for a queue that does not exist.
var ErrQueueNotFound = errors.New("messaging: queue not found")

// QueueDepth returns how many messages wait in queue on the broker of cfg:
// the ready ones, not those delivered and not yet acked. It opens a
// connection of its own for the call.
//
// Errors: ErrQueueNotFound, ErrInvalidConfig, or the broker's error.
func QueueDepth(ctx context.Context, cfg *AMQPConfig, queue string) (int, error) {
	c, err := cfg.resolve()
	if err != nil {
		return 0, err
	}
	var n int
	err = c.withChannel(ctx, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if isNotFound(err) {
			return fmt.Errorf("%w: %q", ErrQueueNotFound, queue)
		}
		if err != nil {
			return fmt.Errorf("messaging: inspect queue %q: %w", queue, err)
		}
		n = q.Messages
		return nil
	})
	return n, err
}

// Depth returns how many messages wait in queue on the bus: not those
// delivered and not yet acked.
//
// Errors: ErrQueueNotFound.
func (b *MemoryBus) Depth(queue string) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.queues[queue]
	if q == nil {
		return 0, fmt.Errorf("%w: %q", ErrQueueNotFound, queue)
	}
	return len(q.items) - q.head, nil
}

// Ping checks that the broker of cfg accepts a connection and a channel.
func Ping(ctx context.Context, cfg *AMQPConfig) error {
	c, err := cfg.resolve()
	if err != nil {
		return err
	}
	return c.withChannel(ctx, func(*amqp.Channel) error { return nil })
}
