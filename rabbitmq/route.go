package rabbitmq

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/messaging"
)

// Route is where a message is published: an exchange and a routing key.
// The empty Exchange is the broker's default exchange, which routes to the
// queue named Key.
type Route struct {
	Exchange, Key string
}

// GroupRoute returns the route on the broker of cfg that reaches the
// consumer group group and no other group: for a partitioned group (one
// [DeclarePartitions] declared), its consistent-hash exchange
// "<exchange>.hash.<group>", which puts a message in the partition its
// messaging.MetaPartitionKey header chooses, the same as for the events
// the main exchange routes there; otherwise the group's queue, through the
// default exchange. A message published there reaches no other group
// bound to its event type.
//
// Errors: messaging.ErrQueueNotFound when the group has neither,
// ErrInvalidConfig, messaging.ErrInvalidName for a bad group, or the
// broker's.
func GroupRoute(ctx context.Context, cfg *Config, group string) (Route, error) {
	c, err := cfg.resolve()
	if err != nil {
		return Route{}, err
	}
	if err := messaging.ValidateGroup(group); err != nil {
		return Route{}, fmt.Errorf("group route: %w", err)
	}
	hx := hashExchange(c.Exchange, group)
	var r Route
	err = c.withConn(ctx, func(conn *amqp.Connection) error {
		// A passive declaration of what does not exist closes its
		// channel: each gets its own. A hash exchange name too long to
		// declare does not exist.
		if len(hx) <= messaging.MaxRoutingKeyLen {
			switch found, err := passive(conn, func(ch *amqp.Channel) error {
				return ch.ExchangeDeclarePassive(hx, hashExchangeType, true, false, false, false, nil)
			}); {
			case err != nil:
				return err
			case found:
				r = Route{Exchange: hx}
				return nil
			}
		}
		switch found, err := passive(conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(group, true, false, false, false, nil)
			return err
		}); {
		case err != nil:
			return err
		case found:
			r = Route{Key: group}
			return nil
		}
		return fmt.Errorf("%w: consumer group %q has no exchange %q and no queue %q",
			messaging.ErrQueueNotFound, group, hx, group)
	})
	return r, err
}

// passive runs the passive declaration declare on a channel of its own,
// and reports whether what it declares exists.
func passive(conn *amqp.Connection, declare func(*amqp.Channel) error) (bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("rabbitmq: open AMQP channel: %w", err)
	}
	switch err := declare(ch); {
	case isNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("rabbitmq: passive declaration: %w", err)
	}
	return true, ch.Close()
}
