package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/bentoevents/bento/internal/conf"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// ErrDeadLettersLeft is returned by Delete when the group's dead-letter
// queue holds dead letters and DeleteOpts.Force is not set: replay or
// discard them first (ReplayDeadLetters, DiscardDeadLetters), or force.
var ErrDeadLettersLeft = errors.New("consumer: the group's dead-letter queue holds dead letters")

// Declare declares, on the RabbitMQ broker of amqpCfg, every broker object
// of the consumer group cfg describes, the ones its instances declare with
// NewAMQP and Run, with the same arguments: the event exchange's topology
// (see rabbitmq.DeclareTopology); with Partitions, the group's partition
// queues behind their consistent-hash exchange, bound to the event
// exchange with each of patterns (see rabbitmq.DeclarePartitions), else
// the group's queue bound with them (rabbitmq.DeclareQueue); and the
// dead-letter exchange DeadLetterExchange(exchange) with the queue
// DeadLetterQueue(group). patterns are the event types the group handles,
// or patterns over them ("order.*"); at least one is required.
//
// Call it before the first events of those types are relayed (at deploy,
// ahead of the group's first instance) so that none is missed: from then
// on they wait in the group's queues. An instance started later with the
// same Config (Group, Partitions, QueueType, DeliveryLimit) finds them as
// it would have declared them. Declaring is idempotent; bindings add up.
// cfg's zero fields take their defaults.
//
// Errors: ErrInvalidConfig (a bad cfg, no pattern), rabbitmq.ErrTopologyMismatch
// (a queue or exchange exists with other settings: another QueueType or
// DeliveryLimit than it was declared with), rabbitmq.ErrHashExchangeMissing,
// rabbitmq.ErrInvalidConfig, messaging.ErrInvalidName (a bad pattern), or
// the broker's error.
func Declare(ctx context.Context, amqpCfg *rabbitmq.Config, cfg *Config, patterns ...string) error {
	c, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if len(patterns) == 0 {
		return fmt.Errorf("%w: declare %s: no event type to bind it to", ErrInvalidConfig, c.Group)
	}
	if err := declareDeadLetters(ctx, amqpCfg, &c); err != nil {
		return err
	}
	if c.Partitions > 0 {
		err = rabbitmq.DeclarePartitions(ctx, amqpCfg, partitionSpec(amqpCfg.ExchangeName(), &c, patterns))
	} else {
		err = rabbitmq.DeclareQueue(ctx, amqpCfg, c.Group, patterns...)
	}
	if err != nil {
		return fmt.Errorf("consumer: declare %s: %w", c.Group, err)
	}
	return nil
}

// declareDeadLetters declares the dead-letter exchange of amqpCfg's
// exchange and the dead-letter queue of the group cfg describes, bound to
// it with DeadLetterTopic(group), and, when the group has one, its tap
// (see DeadLetterTap).
func declareDeadLetters(ctx context.Context, amqpCfg *rabbitmq.Config, cfg *Config) error {
	dead, topic := deadLetterConfig(amqpCfg), DeadLetterTopic(cfg.Group)
	if err := rabbitmq.DeclareQueue(ctx, dead, DeadLetterQueue(cfg.Group), topic); err != nil {
		return fmt.Errorf("consumer: declare dead-letter queue: %w", err)
	}
	if hasTap(cfg) {
		if err := rabbitmq.DeclareTap(ctx, dead, DeadLetterTap(cfg.Group), topic); err != nil {
			return fmt.Errorf("consumer: declare dead-letter tap: %w", err)
		}
	}
	return nil
}

// hasTap reports whether the group cfg describes has a tap queue: whether
// its partition queues have a delivery limit, past which the broker
// dead-letters a message itself.
func hasTap(cfg *Config) bool { return cfg.Partitions > 0 && cfg.QueueType == rabbitmq.Quorum }

// deadLetterConfig is amqpCfg with the exchange of its dead letters.
func deadLetterConfig(amqpCfg *rabbitmq.Config) *rabbitmq.Config {
	dead := conf.Value(amqpCfg)
	dead.Exchange = DeadLetterExchange(amqpCfg.ExchangeName())
	return &dead
}

// partitionSpec is the spec of the partition queues of c, whose defaults
// are filled in, on exchange, bound with patterns.
func partitionSpec(exchange string, c *Config, patterns []string) rabbitmq.PartitionSpec {
	return rabbitmq.PartitionSpec{
		Group: c.Group, Count: c.Partitions, Patterns: patterns, QueueType: c.QueueType, DeliveryLimit: c.DeliveryLimit,
		DeadExchange: DeadLetterExchange(exchange), DeadKey: DeadLetterTopic(c.Group),
	}
}

// DeleteOpts adjust Delete. A nil *DeleteOpts means none.
type DeleteOpts struct {
	// DryRun finds what would be deleted, with the messages that would
	// go with it, and deletes nothing; it refuses as Delete would.
	DryRun bool
	// Force deletes the group's dead-letter queue even when it holds
	// dead letters: they are lost.
	Force bool
	// Topology also deletes the event exchange's topology and that of its
	// dead letters (see rabbitmq.DeleteTopology): once no group uses the
	// exchange.
	Topology bool
}

// Delete deletes, on the RabbitMQ broker of amqpCfg, the broker objects of
// the consumer group group, with the messages they hold and the bindings
// to them: the counterpart of Declare, for tests, tutorials and groups
// retired for good. That is its partition queues (as many as exist,
// whatever the Partitions they were declared with) with their
// consistent-hash exchange, its unpartitioned queue, its dead-letter tap
// (DeadLetterTap) and its dead-letter queue; with opts.Topology, also the event exchange, the dead-letter
// exchange, their alternate exchanges and unroutable queues (an empty
// group then deletes only these). What does not exist is skipped. It
// refuses, deleting nothing, while the dead-letter queue holds dead
// letters, unless opts.Force. A consumer still running stops receiving.
// It returns what it deleted (with opts.DryRun, what it would), up to an
// error. A group on the database bus is deleted with DeleteDatabase.
//
// Errors: ErrDeadLettersLeft, ErrInvalidConfig (neither a group nor
// Topology), rabbitmq.ErrInvalidConfig, messaging.ErrInvalidName (a bad
// group), or the broker's error.
func Delete(ctx context.Context, amqpCfg *rabbitmq.Config, group string, opts *DeleteOpts) (rabbitmq.Deleted, error) {
	o := conf.Value(opts)
	if group == "" && !o.Topology {
		return rabbitmq.Deleted{}, fmt.Errorf("%w: delete: no group, and Topology not set", ErrInvalidConfig)
	}
	var steps []func(*rabbitmq.DeleteOpts) (rabbitmq.Deleted, error)
	if group != "" {
		if err := messaging.ValidateGroup(group); err != nil {
			return rabbitmq.Deleted{}, fmt.Errorf("consumer: delete: %w", err)
		}
		if !o.Force {
			if err := noDeadLetters(ctx, amqpCfg, group); err != nil {
				return rabbitmq.Deleted{}, err
			}
		}
		steps = append(steps,
			func(ro *rabbitmq.DeleteOpts) (rabbitmq.Deleted, error) {
				return rabbitmq.DeletePartitions(ctx, amqpCfg, group, ro)
			},
			func(ro *rabbitmq.DeleteOpts) (rabbitmq.Deleted, error) {
				return rabbitmq.DeleteQueues(ctx, amqpCfg, []string{group, DeadLetterQueue(group), DeadLetterTap(group)}, ro)
			})
	}
	if o.Topology {
		steps = append(steps,
			func(ro *rabbitmq.DeleteOpts) (rabbitmq.Deleted, error) {
				return rabbitmq.DeleteTopology(ctx, amqpCfg, ro)
			},
			func(ro *rabbitmq.DeleteOpts) (rabbitmq.Deleted, error) {
				return rabbitmq.DeleteTopology(ctx, deadLetterConfig(amqpCfg), ro)
			})
	}
	var all rabbitmq.Deleted
	for _, step := range steps {
		d, err := step(&rabbitmq.DeleteOpts{DryRun: o.DryRun})
		all.Queues = append(all.Queues, d.Queues...)
		all.Messages += d.Messages
		all.Exchanges = append(all.Exchanges, d.Exchanges...)
		if err != nil {
			return all, fmt.Errorf("consumer: delete: %w", err)
		}
	}
	return all, nil
}

// noDeadLetters returns ErrDeadLettersLeft when group's dead-letter queue
// holds dead letters.
func noDeadLetters(ctx context.Context, amqpCfg *rabbitmq.Config, group string) error {
	queue := DeadLetterQueue(group)
	n, err := rabbitmq.QueueDepth(ctx, amqpCfg, queue)
	switch {
	case errors.Is(err, messaging.ErrQueueNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("consumer: delete %s: %w", group, err)
	case n > 0:
		return fmt.Errorf("%w: %d in %s (replay or discard them, or force)", ErrDeadLettersLeft, n, queue)
	}
	return nil
}
