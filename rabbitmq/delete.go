package rabbitmq

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/messaging"
)

// DeleteOpts adjust the Delete calls. A nil *DeleteOpts means none.
type DeleteOpts struct {
	// DryRun finds what would be deleted, and the messages that would go
	// with it, and deletes nothing.
	DryRun bool
}

// Deleted is what a Delete call removed (or, with DeleteOpts.DryRun,
// would remove): only what existed.
type Deleted struct {
	// Queues are the queues deleted, in the order they were.
	Queues []string
	// Messages is how many messages the queues held: they are gone.
	Messages int
	// Exchanges are the exchanges deleted.
	Exchanges []string
}

// DeleteQueues deletes, on the broker at cfg.URL, the named queues with
// the messages they hold, whatever their bindings, consumers and contents:
// the counterpart of [DeclareQueue] (a group's queue) and of the
// dead-letter queue a consumer declares. A queue that does not exist is
// skipped. A consumer reading a deleted queue loses its subscription.
//
// It returns an error wrapping [ErrInvalidConfig] for a bad cfg and
// [messaging.ErrInvalidName] for a bad name.
func DeleteQueues(ctx context.Context, cfg *Config, names []string, opts *DeleteOpts) (Deleted, error) {
	c, err := cfg.resolve()
	if err != nil {
		return Deleted{}, err
	}
	var errs []error
	for _, n := range names {
		errs = append(errs, messaging.ValidateGroup(n))
	}
	if err := errors.Join(errs...); err != nil {
		return Deleted{}, fmt.Errorf("delete queues: %w", err)
	}
	var out Deleted
	err = c.withConn(ctx, func(conn *amqp.Connection) error {
		d := &deleter{conn: conn, dry: opts != nil && opts.DryRun}
		defer d.close()
		for _, n := range names {
			if _, err := d.queue(n); err != nil {
				return err
			}
		}
		out = d.done
		return nil
	})
	return out, err
}

// DeletePartitions deletes, on the broker at cfg.URL, the partition queues
// of consumer group group (messaging.PartitionQueue(group, 0), 1, ... as many as
// exist) with their messages, and its consistent-hash exchange: the
// counterpart of [DeclarePartitions]. Nothing of the group left is routed
// to.
//
// It returns an error wrapping [ErrInvalidConfig] for a bad cfg and
// [messaging.ErrInvalidName] for a bad group.
func DeletePartitions(ctx context.Context, cfg *Config, group string, opts *DeleteOpts) (Deleted, error) {
	c, err := cfg.resolve()
	if err != nil {
		return Deleted{}, err
	}
	if err := messaging.ValidateGroup(group); err != nil {
		return Deleted{}, fmt.Errorf("delete partitions: %w", err)
	}
	var out Deleted
	err = c.withConn(ctx, func(conn *amqp.Connection) error {
		d := &deleter{conn: conn, dry: opts != nil && opts.DryRun}
		defer d.close()
		for p := 0; ; p++ {
			found, err := d.queue(messaging.PartitionQueue(group, p))
			if err != nil {
				return err
			}
			if !found {
				break
			}
		}
		if err := d.exchange(hashExchange(c.Exchange, group)); err != nil {
			return err
		}
		out = d.done
		return nil
	})
	return out, err
}

// DeleteTopology deletes, on the broker at cfg.URL, what [DeclareTopology]
// declares: the exchange cfg.Exchange, its alternate exchange and the
// unroutable queue ([UnroutableQueue]) with its messages. Delete the
// groups' queues first (DeleteQueues, DeletePartitions): they outlive the
// exchange, bound to nothing. A consumer's dead letters have a topology of
// their own, on the exchange cfg.Exchange+".dead"; delete it with a cfg
// naming that exchange.
//
// It returns an error wrapping [ErrInvalidConfig] for a bad cfg.
func DeleteTopology(ctx context.Context, cfg *Config, opts *DeleteOpts) (Deleted, error) {
	c, err := cfg.resolve()
	if err != nil {
		return Deleted{}, err
	}
	var out Deleted
	err = c.withConn(ctx, func(conn *amqp.Connection) error {
		d := &deleter{conn: conn, dry: opts != nil && opts.DryRun}
		defer d.close()
		if err := d.exchange(c.Exchange); err != nil {
			return err
		}
		if err := d.exchange(c.Exchange + unroutableSuffix); err != nil {
			return err
		}
		if _, err := d.queue(UnroutableQueue(c.Exchange)); err != nil {
			return err
		}
		out = d.done
		return nil
	})
	return out, err
}

// deleter deletes queues and exchanges that exist, on a connection. A
// passive declaration of something missing closes its channel, so it opens
// another when it needs one.
type deleter struct {
	conn *amqp.Connection
	ch   *amqp.Channel
	dry  bool
	done Deleted
}

// channel returns an open channel.
func (d *deleter) channel() (*amqp.Channel, error) {
	if d.ch == nil || d.ch.IsClosed() {
		ch, err := d.conn.Channel()
		if err != nil {
			return nil, fmt.Errorf("rabbitmq: open AMQP channel: %w", err)
		}
		d.ch = ch
	}
	return d.ch, nil
}

func (d *deleter) close() {
	if d.ch != nil {
		_ = d.ch.Close()
	}
}

// queue deletes queue name if it exists and reports whether it did.
func (d *deleter) queue(name string) (bool, error) {
	ch, err := d.channel()
	if err != nil {
		return false, err
	}
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if isNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("rabbitmq: inspect queue %q: %w", name, err)
	}
	n := q.Messages
	if !d.dry {
		if n, err = ch.QueueDelete(name, false, false, false); err != nil {
			return false, fmt.Errorf("rabbitmq: delete queue %q: %w", name, err)
		}
	}
	d.done.Queues = append(d.done.Queues, name)
	d.done.Messages += n
	return true, nil
}

// exchange deletes exchange name if it exists.
func (d *deleter) exchange(name string) error {
	ch, err := d.channel()
	if err != nil {
		return err
	}
	// The kind is not checked by a passive declaration.
	err = ch.ExchangeDeclarePassive(name, amqp.ExchangeTopic, true, false, false, false, nil)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("rabbitmq: inspect exchange %q: %w", name, err)
	}
	if !d.dry {
		if err := ch.ExchangeDelete(name, false, false); err != nil {
			return fmt.Errorf("rabbitmq: delete exchange %q: %w", name, err)
		}
	}
	d.done.Exchanges = append(d.done.Exchanges, name)
	return nil
}

// isNotFound reports whether err is the broker's 404: no such queue or
// exchange.
func isNotFound(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.NotFound
}
