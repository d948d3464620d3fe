package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/internal/closing"
	"github.com/bentoevents/bento/internal/tracing"
	"github.com/bentoevents/bento/messaging"
)

// ErrInvalidConfig is wrapped by every problem [Config] validation finds.
var ErrInvalidConfig = errors.New("rabbitmq: invalid config")

// Defaults of [Config].
const (
	DefaultExchange        = "bento.events"
	DefaultChannelPoolSize = 16
	DefaultPrefetchCount   = 32
	// DefaultDeliveryLimit is PartitionSpec.DeliveryLimit's default: a
	// far-off backstop, since every give-back of a message counts.
	DefaultDeliveryLimit = 500
	// DefaultHeartbeat is Config.Heartbeat's default, amqp091's.
	DefaultHeartbeat = 10 * time.Second
)

// setupTimeout bounds the topology declaration done by the constructors.
const setupTimeout = 30 * time.Second

// Config configures the RabbitMQ publisher and subscriber. A zero
// field means the field's default, except URL, which has none and is
// required; a nil *Config is a zero one, so it fails naming URL.
// Impossible values are rejected with [ErrInvalidConfig] naming the field.
// Producers and consumers that leave Exchange empty agree on
// DefaultExchange; set it on both sides or on neither.
type Config struct {
	// URL is the broker's address, amqp://user:pass@host:5672/vhost or
	// amqps://... It has no default: it is required.
	URL string
	// Exchange is the name of the durable topic exchange events are
	// published to; "<Exchange>.unroutable" is its alternate exchange and
	// queue. 1 to 200 ASCII letters, digits, '_', '.', ':' or '-', not
	// starting with "amq.". Defaults to DefaultExchange ("bento.events").
	Exchange string
	// ChannelPoolSize is the number of AMQP channels a publisher opens up
	// front; it caps how many Publish calls run at once. Defaults to
	// DefaultChannelPoolSize (16).
	ChannelPoolSize int
	// PrefetchCount is how many unacked messages the broker sends ahead to
	// each subscription (AMQP basic.qos), at most 65535. Defaults to
	// DefaultPrefetchCount (32).
	PrefetchCount int
	// Heartbeat is the AMQP heartbeat timeout the connections propose to
	// the broker, in whole seconds (rounded down), at least 1s: the
	// shorter of it and the broker's own (RabbitMQ's heartbeat setting,
	// 60s by default) is used, and a link that stays silent for about that
	// long (a process stopped or frozen, a network that drops packets) is
	// closed by the broker, which gives the messages it held unacked to
	// other consumers, and by the client. A heartbeat parameter in URL
	// takes precedence. Defaults to DefaultHeartbeat (10s).
	Heartbeat time.Duration
	// Logger receives the logs of watermill-amqp and of ConfirmPublisher.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer, when set, receives ConfirmPublisher's Prometheus metrics.
	// Defaults to none.
	Registerer prometheus.Registerer
}

// resolve returns a validated copy of c with the defaults filled in.
func (c *Config) resolve() (*Config, error) {
	r := Config{}
	if c != nil {
		r = *c
	}
	r.Exchange = c.ExchangeName()
	if r.ChannelPoolSize == 0 {
		r.ChannelPoolSize = DefaultChannelPoolSize
	}
	if r.PrefetchCount == 0 {
		r.PrefetchCount = DefaultPrefetchCount
	}
	if r.Heartbeat == 0 {
		r.Heartbeat = DefaultHeartbeat
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// ExchangeName returns the exchange c names: Exchange, or DefaultExchange
// when it is empty (or c is nil).
func (c *Config) ExchangeName() string {
	if c == nil || c.Exchange == "" {
		return DefaultExchange
	}
	return c.Exchange
}

// validate names every bad field of c, whose defaults are filled in.
func (c *Config) validate() error {
	var errs []error
	bad := func(field, reason string) {
		errs = append(errs, fmt.Errorf("%w: Config.%s %s", ErrInvalidConfig, field, reason))
	}
	if c.URL == "" {
		bad("URL", "is required")
	} else if reason := checkURL(c.URL); reason != "" {
		bad("URL", reason)
	}
	if err := messaging.ValidateExchange(c.Exchange); err != nil {
		errs = append(errs, fmt.Errorf("%w: Config.Exchange is invalid: %w", ErrInvalidConfig, err))
	}
	if c.ChannelPoolSize < 0 {
		bad("ChannelPoolSize", fmt.Sprintf("%d is negative", c.ChannelPoolSize))
	}
	if c.PrefetchCount < 0 || c.PrefetchCount > 65535 {
		bad("PrefetchCount", fmt.Sprintf("%d is outside 0..65535", c.PrefetchCount))
	}
	if c.Heartbeat < time.Second {
		bad("Heartbeat", fmt.Sprintf("%v is below 1s", c.Heartbeat))
	}
	return errors.Join(errs...)
}

// checkURL says what is wrong with an AMQP URL, without repeating it (it may
// hold a password).
func checkURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Sprintf("does not parse: %v", err)
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return fmt.Sprintf("has scheme %q, want amqp or amqps", u.Scheme)
	}
	if _, err := amqp.ParseURI(s); err != nil {
		return "is not a valid AMQP URI"
	}
	return ""
}

// wamqpConfig is the watermill-amqp configuration shared by our publishers
// and subscribers: one durable topic exchange with a constant name, routing
// key = watermill topic = event type.
func (c *Config) wamqpConfig(b topologyBuilder) wamqp.Config {
	exchange := c.Exchange
	return wamqp.Config{
		Connection: wamqp.ConnectionConfig{AmqpURI: c.URL, AmqpConfig: &amqp.Config{Heartbeat: c.Heartbeat, Locale: "en_US"}},
		Marshaler:  marshaler{},
		Exchange: wamqp.ExchangeConfig{
			GenerateName: func(string) string { return exchange },
			Type:         amqp.ExchangeTopic,
			Durable:      true,
			Arguments:    exchangeArgs(exchange),
		},
		Queue: wamqp.QueueConfig{Durable: true},
		// Unused: topologyBuilder binds with the group's patterns.
		QueueBind: wamqp.QueueBindConfig{GenerateRoutingKey: func(string) string { return "" }},
		Publish: wamqp.PublishConfig{
			GenerateRoutingKey: func(topic string) string { return topic },
			ConfirmDelivery:    true,
			ChannelPoolSize:    c.ChannelPoolSize,
		},
		Consume: wamqp.ConsumeConfig{
			Qos: wamqp.QosConfig{PrefetchCount: c.PrefetchCount},
		},
		TopologyBuilder: b,
	}
}

// Publisher publishes messages to the RabbitMQ topic exchange with
// publisher confirms. It implements message.Publisher and is safe for
// concurrent use.
type Publisher struct {
	pub   *wamqp.Publisher
	guard closing.Guard
}

// publisherSetup validates cfg and declares the topology a publisher needs,
// bounded by ctx and by setupTimeout; both publishers start with it.
func (cfg *Config) publisherSetup(ctx context.Context) (*Config, error) {
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	if err := DeclareTopology(ctx, c); err != nil {
		return nil, err
	}
	return c, nil
}

// openWithin runs open, which takes no context, and returns what it opens,
// or ctx's error once ctx ends first; what open returns after that is
// closed. watermill-amqp dials and declares in its constructors without a
// context: this bounds them.
func openWithin[T io.Closer](ctx context.Context, open func() (T, error)) (T, error) {
	type opened struct {
		v   T
		err error
	}
	done := make(chan opened, 1)
	go func() {
		v, err := open()
		done <- opened{v, err}
	}()
	select {
	case o := <-done:
		return o.v, o.err
	case <-ctx.Done():
		go func() {
			if o := <-done; o.err == nil {
				_ = o.v.Close()
			}
		}()
		var zero T
		return zero, ctx.Err()
	}
}

// NewPublisher declares the topology (see [DeclareTopology]) and connects a
// publisher. ctx bounds both, the declaration also by 30 seconds; once
// NewPublisher has returned, ctx no longer matters. The publisher
// reconnects on its own when the connection drops.
//
// It returns an error wrapping [ErrInvalidConfig] for a bad cfg, or ctx's
// error when ctx ends first.
func NewPublisher(ctx context.Context, cfg *Config) (*Publisher, error) {
	c, err := cfg.publisherSetup(ctx)
	if err != nil {
		return nil, fmt.Errorf("new AMQP publisher: %w", err)
	}
	pub, err := openWithin(ctx, func() (*wamqp.Publisher, error) {
		return wamqp.NewPublisher(c.wamqpConfig(topologyBuilder{}), watermill.NewSlogLogger(c.Logger))
	})
	if err != nil {
		return nil, fmt.Errorf("new AMQP publisher: %w", err)
	}
	return &Publisher{pub: pub}, nil
}

// Publish publishes msgs to the exchange with topic as routing key, as
// persistent messages whose AMQP MessageId is the message UUID, and returns
// once the broker has confirmed each of them (it waits for each message in
// turn). For throughput, call Publish from several goroutines at once: up
// to Config.ChannelPoolSize calls run in parallel.
//
// A message that no binding matches is not lost: the broker routes it to
// the "<exchange>.unroutable" queue and confirms it.
//
// An error means some of msgs may not have reached the broker: treat it as
// "retry later". In particular, while the connection is down Publish fails
// at once (it neither waits nor buffers) and the publisher reconnects in the
// background. It returns an error wrapping [messaging.ErrInvalidName] for a malformed
// topic, and [messaging.ErrClosed] after Close.
//
// Publish takes no context and sets no deadline of its own. On a link that
// stops answering without closing, it fails once amqp091's heartbeat check
// gives up on the connection, about one and a half Config.Heartbeat (15
// seconds by default) after the broker last sent anything; while the broker blocks publishers (connection.blocked, under a
// memory or disk alarm) it waits until they are unblocked, however long
// that takes. The projector stops waiting at its PublishTimeout and lets
// the call finish in the background. [ConfirmPublisher.PublishBatch] is
// bounded by its context instead.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if err := messaging.ValidateTopic(topic); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	if slices.Contains(msgs, nil) {
		return fmt.Errorf("publish to %q: nil message", topic)
	}
	return p.guard.Use(messaging.ErrClosed, func() error {
		if err := p.pub.Publish(topic, msgs...); err != nil {
			return fmt.Errorf("publish to %q: %w", topic, err)
		}
		return nil
	})
}

// Close waits for the Publish calls in progress and closes the connection.
// It is idempotent. Like Publish it has no deadline: on a link that stopped
// answering it returns after the heartbeat check (see Publish), and
// while the broker blocks publishers, once it unblocks them.
func (p *Publisher) Close() error {
	return p.guard.Close(func() error {
		if err := p.pub.Close(); err != nil {
			return fmt.Errorf("close AMQP publisher: %w", err)
		}
		return nil
	})
}

// Subscriber consumes the durable queue of one consumer group. It
// implements message.Subscriber and message.SubscribeInitializer.
type Subscriber struct {
	sub   *wamqp.Subscriber
	guard closing.Guard
}

// NewSubscriber connects a subscriber for the consumer group group and
// declares, before returning, the topology and the group's durable queue
// bound to each pattern (see [DeclareQueue]); from then on the queue keeps
// what is routed to it. Each Subscribe redeclares them, and so does the
// subscriber after a reconnect. ctx bounds the dial and the declaration;
// once NewSubscriber has returned, ctx no longer matters (each Subscribe
// takes its own).
//
// It returns an error wrapping [ErrInvalidConfig] for a bad cfg,
// [messaging.ErrInvalidName] for a bad group or pattern, or ctx's error
// when ctx ends first.
func NewSubscriber(ctx context.Context, cfg *Config, group string, patterns ...string) (*Subscriber, error) {
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	if err := errors.Join(messaging.ValidateGroup(group), messaging.ValidatePatterns(patterns)); err != nil {
		return nil, fmt.Errorf("new AMQP subscriber: %w", err)
	}
	wc := c.wamqpConfig(topologyBuilder{patterns: slices.Clone(patterns)})
	wc.Queue.GenerateName = wamqp.GenerateQueueNameConstant(group)
	sub, err := openWithin(ctx, func() (*wamqp.Subscriber, error) {
		sub, err := wamqp.NewSubscriber(wc, watermill.NewSlogLogger(c.Logger))
		if err != nil {
			return nil, err
		}
		if err := sub.SubscribeInitialize(group); err != nil {
			_ = sub.Close()
			return nil, err
		}
		return sub, nil
	})
	if err != nil {
		return nil, fmt.Errorf("new AMQP subscriber: %w", err)
	}
	return &Subscriber{sub: sub}, nil
}

// Subscribe starts a consumer on the group's queue and returns the channel
// it delivers to. The topic argument is ignored: the queue receives what the
// group's binding patterns route to it. Several Subscribe calls are
// competing consumers on the queue. Each subscription delivers one message
// at a time and waits for its Ack or Nack (the broker sends up to
// Config.PrefetchCount ahead); a nacked message is requeued and
// redelivered. The channel is closed when ctx is cancelled or the subscriber
// is closed; the messages the broker sent ahead then go back to the queue,
// and the one in the consumer's hands still counts its Ack or Nack (Close
// requeues it). Each message's context derives from ctx and is cancelled
// once the message is acked or nacked.
//
// It returns [messaging.ErrClosed] after Close.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	var out <-chan *message.Message
	err := s.guard.Use(messaging.ErrClosed, func() error {
		in, err := s.sub.Subscribe(ctx, topic)
		if err != nil {
			return fmt.Errorf("subscribe: %w", err)
		}
		out = untilDone(ctx, in)
		return nil
	})
	return out, err
}

// untilDone relays in to the returned channel, which it closes as soon as
// ctx is done. watermill-amqp v2 does not: after the cancel its subscription
// may run another consume round, delivering more messages, and closes its
// channel 100 ms or more later. What in delivers after ctx is done is nacked,
// so the broker requeues it.
func untilDone(ctx context.Context, in <-chan *message.Message) <-chan *message.Message {
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for {
			select {
			case m, ok := <-in:
				if !ok {
					return
				}
				if ctx.Err() == nil {
					select {
					case out <- m:
						continue
					case <-ctx.Done():
					}
				}
				m.Nack()
			case <-ctx.Done():
			}
			go func() {
				for m := range in {
					m.Nack()
				}
			}()
			return
		}
	}()
	return out
}

// SubscribeInitialize declares the topology and the group's queue and
// bindings; topic is ignored. It implements message.SubscribeInitializer.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	return s.guard.Use(messaging.ErrClosed, func() error {
		if err := s.sub.SubscribeInitialize(topic); err != nil {
			return fmt.Errorf("subscribe initialize: %w", err)
		}
		return nil
	})
}

// Close closes every subscription's channel, waits for them to stop and
// closes the connection. It is idempotent.
func (s *Subscriber) Close() error {
	return s.guard.Close(func() error {
		if err := s.sub.Close(); err != nil {
			return fmt.Errorf("close AMQP subscriber: %w", err)
		}
		return nil
	})
}

// MessagingSystem returns "rabbitmq", the publisher's messaging.system name
// in traces.
func (p *Publisher) MessagingSystem() string { return tracing.SystemRabbitMQ }
