package rabbitmq

import (
	"context"
	"fmt"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/messaging"
)

// roundResult is what one round of PublishBatch on one channel leaves to
// decide.
type roundResult struct {
	// healthy reports whether the channel can serve another call.
	healthy bool
	// stop, when set, ends the batch: ctx ended or the publisher closed.
	// The round's own undecided messages already carry it.
	stop error
	// failure is why the channel or its connection failed before retry
	// were decided; nil when it did not.
	failure error
	// retry are the messages the failure left undecided, in batch order.
	retry []int
	// culprit reports that the round was a single message, written before
	// the failure: the failure is that message's.
	culprit bool
}

// round publishes the messages idx of batch on cc, pipelined, waits for
// their confirms and records every outcome it can decide in errs.
func (p *ConfirmPublisher) round(ctx context.Context, cc *confirmChannel, batch []messaging.Outgoing, pubs []amqp.Publishing, idx []int, errs []error) roundResult {
	r := roundResult{healthy: true}
	// A write to the socket ignores ctx: when ctx ends during one, close
	// the socket, which fails the write.
	var writing atomic.Bool
	stop := context.AfterFunc(ctx, func() {
		if writing.Load() {
			cc.link.kill()
		}
	})
	defer stop()

	pending := make([]*amqp.DeferredConfirmation, 0, len(idx))
	var publishErr error
	for _, i := range idx {
		if p.waitUnblocked(ctx, cc.link) != nil {
			break // stopErr below says why
		}
		writing.Store(true) // before reading ctx.Err, which the AfterFunc sets first
		if ctx.Err() != nil {
			writing.Store(false)
			break
		}
		dc, err := cc.ch.PublishWithDeferredConfirm(p.cfg.Exchange, batch[i].Topic, true, false, pubs[i])
		writing.Store(false)
		if err != nil {
			publishErr = err
			break
		}
		pending = append(pending, dc)
	}

	var confirmed, undecided []int
	for k, dc := range pending {
		i := idx[k]
		ok, err := dc.WaitContext(ctx)
		switch {
		case err != nil:
			undecided = append(undecided, i)
		case ok:
			confirmed = append(confirmed, i)
		case cc.ch.IsClosed(): // the channel went down with the message
			undecided = append(undecided, i)
		default:
			errs[i] = fmt.Errorf("%w: %s", ErrNacked, batch[i].Message.UUID)
		}
	}
	written := len(pending)
	undecided = append(undecided, idx[written:]...)

	// The broker sends basic.return before the basic.ack of the same
	// message, and the client hands returns over before confirms, so every
	// return of this round is buffered by now.
	returned := map[string]bool{}
drain:
	for {
		select {
		case ret, ok := <-cc.returns:
			if !ok { // the channel closed: no more returns will come
				r.healthy = false
				break drain
			}
			returned[ret.MessageId] = true
		default:
			break drain
		}
	}
	for _, i := range confirmed {
		if returned[batch[i].Message.UUID] {
			errs[i] = fmt.Errorf("%w: %s (routing key %q)", ErrReturned, batch[i].Message.UUID, batch[i].Topic)
		}
	}
	if len(undecided) == 0 {
		r.healthy = r.healthy && !cc.ch.IsClosed()
		return r
	}
	// A late confirm or return of a message left undecided must not reach
	// the next call on this channel.
	r.healthy = false
	if err := p.stopErr(ctx, cc.link); err != nil {
		r.stop = err
		for _, i := range undecided {
			errs[i] = fmt.Errorf("rabbitmq: publish %s: %w", batch[i].Message.UUID, err)
		}
		return r
	}
	r.failure = cc.closeReason(publishErr)
	r.retry = undecided
	r.culprit = len(idx) == 1 && written == 1
	return r
}

// stopErr returns why the batch cannot go on, or nil: ctx's error (with
// ErrBlocked if the broker blocks l) once ctx ended, or messaging.ErrClosed once the
// publisher is closed.
func (p *ConfirmPublisher) stopErr(ctx context.Context, l *link) error {
	if err := ctx.Err(); err != nil {
		return blockedErr(l, err)
	}
	select {
	case <-p.mu.Done():
		return messaging.ErrClosed
	default:
		return nil
	}
}

// closeReason returns why cc failed: the broker's error when it closed the
// channel or the connection, else publishErr, else amqp.ErrClosed.
func (cc *confirmChannel) closeReason(publishErr error) error {
	select {
	case e, ok := <-cc.closes:
		if ok && e != nil {
			return e
		}
	default:
	}
	if publishErr != nil {
		return publishErr
	}
	return amqp.ErrClosed
}

// checkSizes fails, in errs, the messages of todo whose content header does
// not fit one frame of l, and returns the others.
func (p *ConfirmPublisher) checkSizes(l *link, batch []messaging.Outgoing, pubs []amqp.Publishing, todo []int, errs []error) []int {
	if p.skipSizeCheck || l.frameSize <= 0 {
		return todo
	}
	fit := todo[:0:0]
	for _, i := range todo {
		if size := headerFrameSize(&pubs[i]); size > l.frameSize {
			errs[i] = fmt.Errorf("%w: %s: its properties and %d headers make a %d-byte content header frame, over the %d-byte frame size of the connection",
				messaging.ErrMessageTooLarge, batch[i].Message.UUID, len(pubs[i].Headers), size, l.frameSize)
			continue
		}
		fit = append(fit, i)
	}
	return fit
}
