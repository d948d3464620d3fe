package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/messaging"
)

// unroutableSuffix names the alternate exchange and its queue.
const unroutableSuffix = ".unroutable"

// dialTimeout bounds a dial whose context has no deadline.
const dialTimeout = 30 * time.Second

// ErrTopologyMismatch is returned when a queue or exchange to declare
// exists with other settings (another type or other arguments: a delivery
// limit, a queue type, a dead-letter target), which RabbitMQ refuses with
// 406 PRECONDITION_FAILED. The error names the object and, in the broker's
// words, the argument that differs. Declare it with the settings it has, or
// delete it (once drained) to declare it anew.
var ErrTopologyMismatch = errors.New("rabbitmq: exists with other settings")

// declareError wraps the failed declaration of the queue or exchange name,
// with ErrTopologyMismatch when it exists with other settings.
func declareError(kind, name string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		return fmt.Errorf("%w: declare %s %q: %w", ErrTopologyMismatch, kind, name, err)
	}
	return fmt.Errorf("rabbitmq: declare %s %q: %w", kind, name, err)
}

// exchangeArgs are the arguments of the main exchange. They must be the same
// wherever it is declared: RabbitMQ refuses (PRECONDITION_FAILED) to
// redeclare an exchange with other arguments.
func exchangeArgs(exchange string) amqp.Table {
	return amqp.Table{"alternate-exchange": exchange + unroutableSuffix}
}

// DeclareTopology declares, on the broker at cfg.URL, the durable topic
// exchange cfg.Exchange with the alternate exchange cfg.Exchange+".unroutable"
// (a durable fanout exchange), and the durable queue of that name bound to
// it, where messages that match no binding end up. Declaring is idempotent;
// it fails if an exchange or queue of the same name exists with other
// settings ([ErrTopologyMismatch]). ctx bounds the whole call.
//
// It returns an error wrapping [ErrInvalidConfig] for a bad cfg.
func DeclareTopology(ctx context.Context, cfg *Config) error {
	c, err := cfg.resolve()
	if err != nil {
		return err
	}
	return c.withChannel(ctx, func(ch *amqp.Channel) error {
		return declareExchanges(ch, c.Exchange)
	})
}

// DeclareQueue declares the topology (see [DeclareTopology]) and the durable
// queue of the consumer group group, bound to the exchange with each binding
// pattern ("order.*", "payment.#"). Once it returns, the queue keeps every
// message routed to it until a consumer acks it. Bindings add up over calls;
// removing one is left to the operator.
//
// It returns an error wrapping [ErrInvalidConfig] for a bad cfg,
// [ErrTopologyMismatch] when the queue or an exchange exists with other
// settings, and [messaging.ErrInvalidName] for a bad group or pattern.
func DeclareQueue(ctx context.Context, cfg *Config, group string, patterns ...string) error {
	c, err := cfg.resolve()
	if err != nil {
		return err
	}
	if err := errors.Join(messaging.ValidateGroup(group), messaging.ValidatePatterns(patterns)); err != nil {
		return fmt.Errorf("declare queue: %w", err)
	}
	return c.withChannel(ctx, func(ch *amqp.Channel) error {
		if err := declareExchanges(ch, c.Exchange); err != nil {
			return err
		}
		return declareGroupQueue(ch, c.Exchange, group, patterns)
	})
}

// dial connects to the broker. ctx bounds the dial and the AMQP handshake.
func (c *Config) dial(ctx context.Context) (*amqp.Connection, error) {
	conn, _, err := c.dialSocket(ctx)
	return conn, err
}

// dialSocket is dial that also returns the connection's TCP socket, which
// the caller may close to abandon a connection whose broker stopped
// answering. An error after ctx ended wraps ctx's error.
func (c *Config) dialSocket(ctx context.Context) (*amqp.Connection, net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	var sock net.Conn
	conn, err := amqp.DialConfig(c.URL, amqp.Config{
		Heartbeat: c.Heartbeat,
		Locale:    "en_US",
		Dial: func(network, addr string) (net.Conn, error) {
			dctx := ctx
			if _, ok := ctx.Deadline(); !ok {
				var cancel context.CancelFunc
				dctx, cancel = context.WithTimeout(ctx, dialTimeout)
				defer cancel()
			}
			var d net.Dialer
			nc, err := d.DialContext(dctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bound the AMQP handshake too; amqp091 clears the deadline
			// once the connection is open.
			deadline, _ := dctx.Deadline()
			if err := nc.SetDeadline(deadline); err != nil {
				_ = nc.Close()
				return nil, err
			}
			sock = nc
			return nc, nil
		},
	})
	if err != nil {
		cerr := ctx.Err()
		if d, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(d) {
			// The socket's deadline is ctx's: its timeout can come a hair
			// before ctx reports that it ended.
			cerr = context.DeadlineExceeded
		}
		if cerr != nil {
			return nil, nil, fmt.Errorf("rabbitmq: connect to AMQP: %w (%w)", cerr, err)
		}
		return nil, nil, fmt.Errorf("rabbitmq: connect to AMQP: %w", err)
	}
	return conn, sock, nil
}

// withChannel dials the broker, runs fn on a channel and closes the
// connection. Cancelling ctx aborts the dial and closes the connection.
func (c *Config) withChannel(ctx context.Context, fn func(*amqp.Channel) error) error {
	return c.withConn(ctx, func(conn *amqp.Connection) error {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("rabbitmq: open AMQP channel: %w", err)
		}
		return fn(ch)
	})
}

// withConn dials the broker, runs fn on the connection and closes it.
// Cancelling ctx aborts the dial and closes the connection.
func (c *Config) withConn(ctx context.Context, fn func(*amqp.Connection) error) (err error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer func() {
		stop()
		if cerr := conn.Close(); cerr != nil && err == nil && !errors.Is(cerr, amqp.ErrClosed) {
			err = fmt.Errorf("rabbitmq: close AMQP connection: %w", cerr)
		}
	}()
	if err := fn(conn); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return err
	}
	return nil
}

// declareExchanges declares the alternate exchange with its queue, then the
// main exchange that names it.
func declareExchanges(ch *amqp.Channel, exchange string) error {
	ae := exchange + unroutableSuffix
	if err := ch.ExchangeDeclare(ae, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return declareError("exchange", ae, err)
	}
	if _, err := ch.QueueDeclare(ae, true, false, false, false, nil); err != nil {
		return declareError("queue", ae, err)
	}
	if err := ch.QueueBind(ae, "", ae, false, nil); err != nil {
		return fmt.Errorf("rabbitmq: bind queue %q: %w", ae, err)
	}
	return declareMainExchange(ch, exchange)
}

func declareMainExchange(ch *amqp.Channel, exchange string) error {
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, exchangeArgs(exchange)); err != nil {
		return declareError("exchange", exchange, err)
	}
	return nil
}

// declareGroupQueue declares the durable queue group and binds it to
// exchange with each pattern.
func declareGroupQueue(ch *amqp.Channel, exchange, group string, patterns []string) error {
	if _, err := ch.QueueDeclare(group, true, false, false, false, nil); err != nil {
		return declareError("queue", group, err)
	}
	for _, p := range patterns {
		if err := ch.QueueBind(group, p, exchange, false, nil); err != nil {
			return fmt.Errorf("rabbitmq: bind queue %q to %q with %q: %w", group, exchange, p, err)
		}
	}
	return nil
}

// topologyBuilder is the watermill-amqp TopologyBuilder of our publishers
// and subscribers. It replaces wamqp.DefaultTopologyBuilder, whose
// BuildTopology binds the queue with the queue name as binding key instead of
// the topic (ThreeDotsLabs/watermill#305): ours binds the group's queue with
// each of its patterns and also declares the alternate exchange.
type topologyBuilder struct {
	patterns []string
}

var _ wamqp.TopologyBuilder = topologyBuilder{}

// ExchangeDeclare declares the main exchange, with its arguments.
func (topologyBuilder) ExchangeDeclare(ch *amqp.Channel, exchange string, _ wamqp.Config) error {
	return declareMainExchange(ch, exchange)
}

// BuildTopology declares both exchanges and the queue, and binds it.
func (b topologyBuilder) BuildTopology(ch *amqp.Channel, queue, exchange string, _ wamqp.Config, l watermill.LoggerAdapter) error {
	if err := declareExchanges(ch, exchange); err != nil {
		return err
	}
	if err := declareGroupQueue(ch, exchange, queue, b.patterns); err != nil {
		return err
	}
	l.Debug("Queue declared and bound", watermill.LogFields{"amqp_queue_name": queue, "patterns": b.patterns})
	return nil
}
