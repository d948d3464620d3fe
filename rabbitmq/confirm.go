package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"math/bits"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/internal/closing"
	"github.com/bentoevents/bento/internal/tracing"
	"github.com/bentoevents/bento/messaging"
)

var (
	// ErrNacked is returned for a message the broker refused to take
	// responsibility for (basic.nack).
	ErrNacked = errors.New("rabbitmq: broker did not confirm the message")
	// ErrReturned is returned for a message the broker returned as
	// unroutable (mandatory publish with no queue, not even through the
	// alternate exchange, to take it).
	ErrReturned = errors.New("rabbitmq: broker returned the message as unroutable")
	// ErrBlocked is returned for a message not published because the broker
	// blocked the connection (connection.blocked: RabbitMQ is short of
	// memory or disk and stopped reading from publishers) until the
	// context ended. Retry later.
	ErrBlocked = errors.New("rabbitmq: broker blocked the connection")
)

// ConfirmPublisher publishes to RabbitMQ with pipelined publisher confirms:
// a batch of messages is written to a channel without waiting, then the
// broker's confirms for all of them are awaited together, so a batch costs
// about one broker round trip instead of one per message (watermill-amqp's
// publisher waits for each confirm in turn). It publishes the same wire format
// as [Publisher] (persistent, MessageId and the Watermill UUID header set,
// metadata as headers) to the same topology, and it publishes with the
// mandatory flag and watches basic.return: a message the broker could not
// route anywhere is reported as [ErrReturned], never as published.
//
// It implements message.Publisher, and PublishBatch, which the projector
// uses to hand it a whole claimed batch. When the connection drops, the
// publishes in flight fail and the next call reconnects. It is safe for
// concurrent use: each call takes one of ChannelPoolSize channels.
//
// When RabbitMQ runs short of memory or disk it blocks publishing
// connections (connection.blocked) and stops reading from them. The
// publisher then writes nothing: calls wait for connection.unblocked or the
// end of their context. It logs the block and the unblock to
// Config.Logger, and, with Config.Registerer, shows it in the gauge
// bento_amqp_publisher_blocked (1 while its connection is blocked; the
// publishers sharing a registry add up).
type ConfirmPublisher struct {
	cfg     *Config
	metrics *publisherMetrics
	pool    chan *confirmChannel

	mu      closing.Guard // closed by Close; guards the fields below too
	link    *link         // the current connection; nil before the first dial
	dialing chan struct{} // closed when the dial in progress ends; nil when none
	open    int           // channels open or being opened, not discarded

	skipSizeCheck bool // tests: write messages too large for a frame anyway
}

type confirmChannel struct {
	link    *link
	ch      *amqp.Channel
	returns chan amqp.Return
	closes  chan *amqp.Error // the broker's error when it closes ch
}

// NewConfirmPublisher declares the topology (see [DeclareTopology]) and
// returns a publisher for cfg. ctx bounds the declaration, which is also
// bounded by 30 seconds; the publisher connects on its first publish, each
// publish bounded by its own context.
//
// Errors: ErrInvalidConfig, the broker's error, ctx's error when ctx ends
// first, or Config.Registerer's when it refuses the publisher's gauge.
func NewConfirmPublisher(ctx context.Context, cfg *Config) (*ConfirmPublisher, error) {
	c, err := cfg.publisherSetup(ctx)
	if err != nil {
		return nil, err
	}
	m, err := newPublisherMetrics(c.Registerer)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: register metrics: %w", err)
	}
	return &ConfirmPublisher{
		cfg:     c,
		metrics: m,
		pool:    make(chan *confirmChannel, c.ChannelPoolSize),
	}, nil
}

// Publish publishes msgs under topic and returns the first failure.
func (p *ConfirmPublisher) Publish(topic string, msgs ...*message.Message) error {
	batch := make([]messaging.Outgoing, len(msgs))
	for i, m := range msgs {
		batch[i] = messaging.Outgoing{Topic: topic, Message: m}
	}
	return errors.Join(p.PublishBatch(context.Background(), batch)...)
}

// PublishBatch publishes every message of batch, pipelined on one channel,
// and returns each message's outcome: nil once the broker confirmed it,
// otherwise an error saying why not:
//   - [ErrNacked]: the broker refused the message;
//   - [ErrReturned]: the broker could not route it anywhere;
//   - [messaging.ErrMessageTooLarge]: its metadata does not fit an AMQP frame (it is
//     not sent, so the others are not disturbed);
//   - [messaging.ErrInvalidName]: its topic is not a valid routing key;
//   - [ErrBlocked], together with ctx's error: the broker blocked the
//     connection until ctx ended (the message was not written, or not
//     confirmed);
//   - ctx's error: ctx ended first;
//   - [messaging.ErrClosed]: the publisher was closed;
//   - the broker's *amqp091.Error: the message made the broker close the
//     channel or the connection even when sent alone (see below);
//   - otherwise the error of the dial or of the connection.
//
// A message whose outcome is an error may still have reached the broker
// (at least once). Treat an error as "retry later", except
// messaging.ErrMessageTooLarge and messaging.ErrInvalidName, which no retry cures.
//
// When the channel or its connection fails in the middle of the batch, the
// messages not yet confirmed are published again on a fresh channel
// (reconnecting if need be) before PublishBatch returns, in smaller and
// smaller rounds until the message that causes the failure is sent alone
// and fails again: it alone gets the error, the others are published. It
// gives up after about 2·log2(len(batch)) failed rounds, reporting the last
// failure for the messages left. Calls running at once share the
// connection: a connection closed because of one call's message makes the
// others publish again too.
//
// ctx bounds the whole call, even on a link that stops answering without
// closing: when ctx ends while a message is being written, the publisher
// closes the connection's socket (the next call reconnects), and every
// message not confirmed by then is reported with an error wrapping ctx's.
func (p *ConfirmPublisher) PublishBatch(ctx context.Context, batch []messaging.Outgoing) []error {
	errs := make([]error, len(batch))
	pubs := make([]amqp.Publishing, len(batch))
	todo := make([]int, 0, len(batch))
	for i, o := range batch {
		if o.Message == nil {
			errs[i] = fmt.Errorf("rabbitmq: publish to %q: nil message", o.Topic)
			continue
		}
		if err := messaging.ValidateTopic(o.Topic); err != nil {
			errs[i] = fmt.Errorf("rabbitmq: publish %s: %w", o.Message.UUID, err)
			continue
		}
		pub, err := marshaler{}.Marshal(o.Message)
		if err == nil {
			// What amqp091 would refuse before writing: a publish error is
			// then always the channel's, never the message's.
			err = pub.Headers.Validate()
		}
		if err != nil {
			errs[i] = fmt.Errorf("rabbitmq: marshal %s: %w", o.Message.UUID, err)
			continue
		}
		pubs[i] = pub
		todo = append(todo, i)
	}
	failAll := func(idx []int, err error) {
		for _, i := range idx {
			errs[i] = fmt.Errorf("rabbitmq: publish %s: %w", batch[i].Message.UUID, err)
		}
	}
	// A channel or connection that fails in the middle of a round fails
	// every message not yet confirmed, whichever caused it. Those go out
	// again on a fresh channel, in rounds half as large as the last
	// undecided part, until a message that fails alone is known to be the
	// cause: it alone gets the error. The number of failed rounds is
	// bounded, enough to single out a couple of culprits.
	window := len(todo)
	failures, maxFailures := 0, 2*(bits.Len(uint(len(todo)))+1)
	for len(todo) > 0 {
		cc, err := p.channel(ctx)
		if err != nil {
			failAll(todo, err)
			break
		}
		todo = p.checkSizes(cc.link, batch, pubs, todo, errs)
		n := min(window, len(todo))
		r := p.round(ctx, cc, batch, pubs, todo[:n], errs)
		p.release(cc, r.healthy)
		rest := todo[n:]
		switch {
		case r.stop != nil:
			failAll(rest, r.stop)
			return errs
		case r.failure == nil:
			todo = rest
			continue
		}
		failures++
		if n == 1 && r.culprit {
			failAll(r.retry, r.failure)
			todo, window = rest, len(rest)
			continue
		}
		if failures >= maxFailures {
			failAll(append(r.retry, rest...), r.failure)
			break
		}
		todo = append(r.retry, rest...)
		window = max(1, (len(r.retry)+1)/2)
	}
	return errs
}

// Close closes the connection; publishes in flight fail. It waits at most
// 2 seconds for the broker to acknowledge the close, then closes the
// socket, so it returns promptly even on a link that stopped answering. It
// is idempotent.
func (p *ConfirmPublisher) Close() error {
	var l *link
	_ = p.mu.Close(func() error { l = p.link; return nil })
	if l == nil {
		return nil
	}
	return l.close()
}

// MessagingSystem returns "rabbitmq", the publisher's messaging.system name
// in traces.
func (p *ConfirmPublisher) MessagingSystem() string { return tracing.SystemRabbitMQ }
