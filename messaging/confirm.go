package messaging

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

var (
	// ErrNacked is returned for a message the broker refused to take
	// responsibility for (basic.nack), or whose channel closed before the
	// broker confirmed it.
	ErrNacked = errors.New("messaging: broker did not confirm the message")
	// ErrReturned is returned for a message the broker returned as
	// unroutable (mandatory publish with no queue, not even through the
	// alternate exchange, to take it).
	ErrReturned = errors.New("messaging: broker returned the message as unroutable")
)

// Outgoing is one message of a batch and the topic (routing key) it is
// published under.
type Outgoing struct {
	Topic   string
	Message *message.Message
}

// ConfirmPublisher publishes to RabbitMQ with pipelined publisher confirms:
// a batch of messages is written to a channel without waiting, then the
// broker's confirms for all of them are awaited together, so a batch costs
// about one broker round trip instead of one per message (watermill-amqp's
// publisher waits for each confirm in turn). It publishes the same wire format
// as [AMQPPublisher] (persistent, MessageId and the Watermill UUID header set,
// metadata as headers) to the same topology, and it publishes with the
// mandatory flag and watches basic.return: a message the broker could not
// route anywhere is reported as [ErrReturned], never as published.
//
// It implements message.Publisher, and PublishBatch, which the projector
// uses to hand it a whole claimed batch. When the connection drops, the
// publishes in flight fail and the next call reconnects. It is safe for
// concurrent use: each call takes one of ChannelPoolSize channels.
type ConfirmPublisher struct {
	cfg  *AMQPConfig
	pool chan *confirmChannel

	mu     sync.Mutex
	conn   *amqp.Connection
	open   int // channels created on conn and not discarded
	closed bool
}

type confirmChannel struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
}

// NewConfirmPublisher declares the topology (see DeclareTopology) and
// returns a publisher for cfg.
//
// Errors: ErrInvalidConfig, or the broker's error.
func NewConfirmPublisher(cfg *AMQPConfig) (*ConfirmPublisher, error) {
	c, err := cfg.publisherSetup()
	if err != nil {
		return nil, err
	}
	return &ConfirmPublisher{cfg: c, pool: make(chan *confirmChannel, c.ChannelPoolSize)}, nil
}

// Publish publishes msgs under topic and returns the first failure.
func (p *ConfirmPublisher) Publish(topic string, msgs ...*message.Message) error {
	batch := make([]Outgoing, len(msgs))
	for i, m := range msgs {
		batch[i] = Outgoing{Topic: topic, Message: m}
	}
	return errors.Join(p.PublishBatch(context.Background(), batch)...)
}

// PublishBatch publishes every message of batch, pipelined on one channel,
// and returns each message's outcome: nil once the broker confirmed it,
// otherwise why not (ErrNacked, ErrReturned, a connection error, or ctx's
// error when ctx ends first). A message whose outcome is an error may still
// have reached the broker: treat it as "retry later" (at least once).
func (p *ConfirmPublisher) PublishBatch(ctx context.Context, batch []Outgoing) []error {
	errs := make([]error, len(batch))
	if len(batch) == 0 {
		return errs
	}
	fail := func(from int, err error) {
		for i := from; i < len(batch); i++ {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	cc, err := p.channel(ctx)
	if err != nil {
		fail(0, err)
		return errs
	}
	healthy := true
	defer func() { p.release(cc, healthy) }()

	pending := make([]*amqp.DeferredConfirmation, len(batch))
	for i, o := range batch {
		pub, err := defaultMarshaler.Marshal(o.Message)
		if err != nil {
			errs[i] = fmt.Errorf("messaging: marshal %s: %w", o.Message.UUID, err)
			continue
		}
		dc, err := cc.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, o.Topic, true, false, pub)
		if err != nil {
			healthy = false
			fail(i, fmt.Errorf("messaging: publish to %q: %w", o.Topic, err))
			break
		}
		pending[i] = dc
	}
	for i, dc := range pending {
		if dc == nil {
			continue
		}
		ok, err := dc.WaitContext(ctx)
		switch {
		case err != nil:
			healthy = false // confirms of this channel are now out of step
			errs[i] = fmt.Errorf("messaging: wait for confirm of %s: %w", batch[i].Message.UUID, err)
		case !ok:
			errs[i] = fmt.Errorf("%w: %s", ErrNacked, batch[i].Message.UUID)
		}
	}
	// The broker sends basic.return before the basic.ack of the same
	// message, and the client hands returns over before confirms, so every
	// return of this batch is buffered by now.
	returned := map[string]bool{}
drain:
	for {
		select {
		case r, ok := <-cc.returns:
			if !ok { // the channel closed: no more returns will come
				healthy = false
				break drain
			}
			returned[r.MessageId] = true
		default:
			break drain
		}
	}
	for i, o := range batch {
		if errs[i] == nil && returned[o.Message.UUID] {
			errs[i] = fmt.Errorf("%w: %s (routing key %q)", ErrReturned, o.Message.UUID, o.Topic)
		}
	}
	if cc.ch.IsClosed() {
		healthy = false
	}
	return errs
}

// channel takes a channel from the pool, opening one (and the connection)
// when the pool is empty and fewer than ChannelPoolSize are open.
func (p *ConfirmPublisher) channel(ctx context.Context) (*confirmChannel, error) {
	for {
		select {
		case cc := <-p.pool:
			if cc.conn.IsClosed() || cc.ch.IsClosed() {
				p.discard(cc)
				continue
			}
			return cc, nil
		default:
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		if p.open < cap(p.pool) {
			cc, err := p.openLocked(ctx)
			p.mu.Unlock()
			return cc, err
		}
		p.mu.Unlock()
		select {
		case cc := <-p.pool:
			if cc.conn.IsClosed() || cc.ch.IsClosed() {
				p.discard(cc)
				continue
			}
			return cc, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// openLocked opens a confirm-mode channel, dialling first when there is no
// live connection. p.mu must be held.
func (p *ConfirmPublisher) openLocked(ctx context.Context) (*confirmChannel, error) {
	if p.conn == nil || p.conn.IsClosed() {
		conn, err := p.cfg.dial(ctx)
		if err != nil {
			return nil, err
		}
		p.conn = conn
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("messaging: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("messaging: confirm mode: %w", err)
	}
	cc := &confirmChannel{conn: p.conn, ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 4096))}
	p.open++
	return cc, nil
}

func (p *ConfirmPublisher) release(cc *confirmChannel, healthy bool) {
	if !healthy {
		p.discard(cc)
		return
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		p.discard(cc)
		return
	}
	p.pool <- cc
}

func (p *ConfirmPublisher) discard(cc *confirmChannel) {
	_ = cc.ch.Close()
	p.mu.Lock()
	p.open--
	p.mu.Unlock()
}

// Close closes the connection; publishes in flight fail. It is idempotent.
func (p *ConfirmPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.conn != nil && !p.conn.IsClosed() {
		if err := p.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			return fmt.Errorf("messaging: close AMQP connection: %w", err)
		}
	}
	return nil
}
