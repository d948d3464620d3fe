package rabbitmq

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/messaging"
)

// channel takes a channel from the pool, opening one (and the connection)
// when the pool is empty and fewer than ChannelPoolSize are open.
func (p *ConfirmPublisher) channel(ctx context.Context) (*confirmChannel, error) {
	for {
		select {
		case cc := <-p.pool:
			if cc.link.conn.IsClosed() || cc.ch.IsClosed() {
				p.discard(cc)
				continue
			}
			return cc, nil
		default:
		}
		p.mu.Lock()
		if p.mu.Closed() {
			p.mu.Unlock()
			return nil, messaging.ErrClosed
		}
		if p.open < cap(p.pool) {
			p.open++
			p.mu.Unlock()
			cc, err := p.openChannel(ctx)
			if err != nil {
				p.mu.Lock()
				p.open--
				p.mu.Unlock()
			}
			return cc, err
		}
		p.mu.Unlock()
		select {
		case cc := <-p.pool:
			if cc.link.conn.IsClosed() || cc.ch.IsClosed() {
				p.discard(cc)
				continue
			}
			return cc, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.mu.Done():
			return nil, messaging.ErrClosed
		}
	}
}

// openChannel opens a confirm-mode channel on the current connection,
// dialling first when there is none. ctx bounds it all.
func (p *ConfirmPublisher) openChannel(ctx context.Context) (*confirmChannel, error) {
	l, err := p.connection(ctx)
	if err != nil {
		return nil, err
	}
	if err := p.waitUnblocked(ctx, l); err != nil {
		return nil, err
	}
	var cc *confirmChannel
	err = l.guard(ctx, func() error {
		ch, err := l.conn.Channel()
		if err != nil {
			return fmt.Errorf("rabbitmq: open channel: %w", err)
		}
		if err := ch.Confirm(false); err != nil {
			l.closeChannel(ch)
			return fmt.Errorf("rabbitmq: confirm mode: %w", err)
		}
		cc = &confirmChannel{
			link:    l,
			ch:      ch,
			returns: ch.NotifyReturn(make(chan amqp.Return, 4096)),
			closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
		}
		return nil
	})
	return cc, err
}

// connection returns the current connection, dialling when there is none or
// it has closed. One dial runs at a time; Close does not wait for it.
func (p *ConfirmPublisher) connection(ctx context.Context) (*link, error) {
	for {
		p.mu.Lock()
		if p.mu.Closed() {
			p.mu.Unlock()
			return nil, messaging.ErrClosed
		}
		if l := p.link; l != nil && !l.conn.IsClosed() {
			p.mu.Unlock()
			return l, nil
		}
		if wait := p.dialing; wait != nil {
			p.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-p.mu.Done():
				return nil, messaging.ErrClosed
			}
		}
		dialing := make(chan struct{})
		p.dialing = dialing
		p.mu.Unlock()

		l, err := dialLink(ctx, p.cfg, p.metrics)

		p.mu.Lock()
		p.dialing = nil
		close(dialing)
		closed := p.mu.Closed()
		if err == nil && !closed {
			p.link = l
		}
		p.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if closed {
			go func() { _ = l.close() }()
			return nil, messaging.ErrClosed
		}
		return l, nil
	}
}

// waitUnblocked returns once l is not blocked by the broker. It returns an
// error wrapping ErrBlocked and ctx's error when ctx ends first, and
// messaging.ErrClosed when the publisher is closed meanwhile.
func (p *ConfirmPublisher) waitUnblocked(ctx context.Context, l *link) error {
	for {
		wait, _ := l.blocked()
		if wait == nil {
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return blockedErr(l, ctx.Err())
		case <-p.mu.Done():
			return messaging.ErrClosed
		}
	}
}

// blockedErr returns err, which ended a wait, wrapped with ErrBlocked when
// the broker blocks l: the wait ended because of the block.
func blockedErr(l *link, err error) error {
	if wait, reason := l.blocked(); wait != nil {
		return fmt.Errorf("%w (%s): %w", ErrBlocked, reason, err)
	}
	return err
}

func (p *ConfirmPublisher) release(cc *confirmChannel, healthy bool) {
	if !healthy {
		p.discard(cc)
		return
	}
	p.mu.Lock()
	closed := p.mu.Closed()
	p.mu.Unlock()
	if closed {
		p.discard(cc)
		return
	}
	p.pool <- cc
}

// discard drops cc from the pool's count and closes it in the background,
// killing its connection if the broker does not answer.
func (p *ConfirmPublisher) discard(cc *confirmChannel) {
	p.mu.Lock()
	p.open--
	p.mu.Unlock()
	cc.link.closeChannel(cc.ch)
}
