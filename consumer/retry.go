package consumer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
)

// retry is the middleware that decides, for each failure of a message,
// whether to try it again (after a backoff, in place, so nothing behind it
// on its subscription overtakes it) or to give up: then it returns the
// error with the cause in MetaDeadCause, for the poison middleware to
// dead-letter. A message whose context ends (the consumer stopping) is
// returned at once, to be redelivered.
func (c *Consumer) retry(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		// One decode per delivery: the inbox and the handler read the
		// envelope kept in the message's context. A message that does not
		// decode fails each attempt with that error (dead-lettered as
		// CauseDecode below).
		_, decodeErr := messaging.EnvelopeOf(msg)
		ctx := msg.Context()
		start := time.Now()
		delay := c.cfg.RetryInitialInterval
		failures := 0
		holds := !c.cfg.DisableHoldBack && c.cfg.Partitions > 0
		for {
			probe, err := c.breaker.enter(ctx)
			if err != nil {
				return nil, fmt.Errorf("consumer: stopped waiting for the database: %w", context.Canceled)
			}
			var out []*message.Message
			var st inbox.HoldState
			err = decodeErr
			if err == nil && holds {
				st, err = c.inbox.CheckHold(ctx, msg)
			}
			if err == nil {
				out, err = c.attempt(ctx, msg, h)
			}
			cl := failed
			if err != nil && ctx.Err() == nil {
				cl = c.classify(ctx, err)
			}
			c.leaveBreaker(ctx, probe, err, cl)
			if err == nil {
				if st.Own {
					c.unhold(ctx, msg)
				}
				if st.Parked { // its aggregate's later events, parked behind it
					c.drain(ctx, aggregateOf(msg))
				}
				return out, nil
			}
			if ctx.Err() != nil && !errors.Is(err, context.Canceled) {
				// The consumer is stopping or giving the partition up: the
				// message goes back to its queue, whatever it failed with.
				return nil, fmt.Errorf("consumer: stopped retrying: %w (%w)", context.Canceled, err)
			}
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return nil, err
			}
			if errors.Is(err, ErrFenced) {
				// Not this instance's to apply any more: back to its queue.
				return nil, fmt.Errorf("consumer: %w (%w)", context.Canceled, err)
			}
			if reason := parkReason(err); holds && reason != "" {
				// Out of order: park it, and let its partition move on.
				perr := c.park(ctx, msg, reason, err)
				if perr == nil {
					return nil, nil
				}
				err = perr // retried like any failure, in place
			}
			cause := ""
			switch waited := time.Since(start); {
			case errors.Is(err, ErrNoHandler) || isDecode(err):
				cause = CauseDecode
			case errors.Is(err, inbox.ErrStale):
				cause = CauseStale
			case IsPermanent(err):
				cause = CausePermanent
			case errors.Is(err, inbox.ErrGap):
				if waited >= c.cfg.GapTimeout {
					cause = CauseGap
				}
			case cl != failed && waited < c.cfg.OutageWindow:
				c.cfg.Logger.Warn("consumer: transient failure; retrying in place", "group", c.cfg.Group,
					"message_id", msg.UUID, "waited", waited.Round(time.Millisecond), "outage", cl == outage, "err", err)
			default:
				if failures++; failures > c.cfg.MaxRetries {
					cause = CauseFailed
				}
			}
			if holds && cause != "" && cause != CauseStale {
				// Hold the aggregate before its event leaves; if the hold
				// cannot be written, keep the event rather than let later
				// ones overtake it.
				if herr := c.inbox.Hold(ctx, msg); herr != nil {
					c.cfg.Logger.Warn("consumer: cannot hold the aggregate back; keeping the message", "group", c.cfg.Group,
						"message_id", msg.UUID, "err", herr)
					cause = ""
				}
			}
			if cause != "" {
				c.markDead(msg, cause, max(failures, 1), err)
				return nil, err
			}
			jittered := delay/2 + rand.N(delay/2+1)
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("consumer: stopped retrying: %w (%w)", context.Canceled, err)
			case <-time.After(jittered):
			}
			delay = min(2*delay, c.cfg.RetryMaxInterval)
		}
	}
}

// leaveBreaker tells the breaker what an attempt that ended with err, of
// class cl, says about the database, and logs when that opens or closes it.
func (c *Consumer) leaveBreaker(ctx context.Context, probe bool, err error, cl class) {
	o := reachable
	switch {
	case ctx.Err() != nil:
		o = neutral
	case err != nil && cl == outage:
		o = unreachable
	}
	switch opened, down := c.breaker.leave(probe, o); {
	case opened:
		c.cfg.Logger.Warn("consumer: the database is unreachable; the group waits, one message probing it",
			"group", c.cfg.Group, "err", err)
	case down > 0:
		c.cfg.Logger.Info("consumer: the database answers again; the group goes on", "group", c.cfg.Group,
			"down", down.Round(time.Millisecond))
	}
}

// markDead stamps msg as a dead letter, its cause, when, and after how
// many attempts, and logs it at Warn level with what an operator needs to
// find it: every dead letter the consumer makes passes here.
func (c *Consumer) markDead(msg *message.Message, cause string, attempts int, err error) {
	msg.Metadata.Set(MetaDeadCause, cause)
	msg.Metadata.Set(MetaDeadAt, time.Now().UTC().Format(time.RFC3339Nano))
	msg.Metadata.Set(MetaDeadAttempts, strconv.Itoa(attempts))
	c.logDead(msg, cause, attempts, err, deadByConsumer)
}

// Who made a dead letter, as logDead logs it.
const (
	deadByConsumer = "consumer"
	deadByBroker   = "broker" // past a partition queue's delivery limit
)

// logDead logs the dead letter msg at Warn: its group, event, aggregate,
// cause, attempts and error, and who made it (deadByConsumer or
// deadByBroker).
func (c *Consumer) logDead(msg *message.Message, cause string, attempts int, err error, by string) {
	md := msg.Metadata
	c.cfg.Logger.Warn("consumer: dead letter", "group", c.cfg.Group, "message_id", msg.UUID,
		"event_type", md.Get(messaging.MetaEventType), "tenant_id", md.Get(messaging.MetaTenantID),
		"aggregate_type", md.Get(messaging.MetaAggregateType), "aggregate_id", md.Get(messaging.MetaAggregateID),
		"version", md.Get(messaging.MetaAggregateVersion), "cause", cause, "attempts", attempts, "err", err, "by", by)
}

// attempt runs h on msg once, within HandlerTimeout when there is one: the
// message's context is bounded for the attempt, then restored.
func (c *Consumer) attempt(ctx context.Context, msg *message.Message, h message.HandlerFunc) ([]*message.Message, error) {
	if c.cfg.HandlerTimeout <= 0 {
		return h(msg)
	}
	actx, cancel := context.WithTimeout(ctx, c.cfg.HandlerTimeout)
	defer cancel()
	msg.SetContext(actx)
	defer msg.SetContext(ctx)
	out, err := h(msg)
	if err != nil && actx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
		// Not wrapped: a timeout counts toward MaxRetries, whatever the
		// cancelled query says (a cancellation, a lost connection).
		err = fmt.Errorf("%w after %v (%v)", ErrHandlerTimeout, c.cfg.HandlerTimeout, err)
	}
	return out, err
}

// isDecode reports whether err says a message could not be decoded.
func isDecode(err error) bool {
	for _, target := range []error{messaging.ErrMalformedMessage, messaging.ErrUnknownEventType,
		messaging.ErrUnknownSchemaVersion, messaging.ErrMalformedPayload, messaging.ErrUpcast} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// poison is the middleware that dead-letters what retry gave up on. A
// handler that fails because the consumer is stopping (its message's
// context was cancelled) has not failed on the message: leave it to be
// nacked and redelivered, never dead-lettered.
func (c *Consumer) poison() (message.HandlerMiddleware, error) {
	poison, err := middleware.PoisonQueueWithFilter(c.dead, c.deadTopic, func(err error) bool {
		return !errors.Is(err, context.Canceled)
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: dead-letter middleware: %w", err)
	}
	return poison, nil
}

// chain is the handler of a partitioned consumer: the router's middlewares
// around dispatch, outermost first.
func (c *Consumer) chain() (message.HandlerFunc, error) {
	poison, err := c.poison()
	if err != nil {
		return nil, err
	}
	h := func(msg *message.Message) ([]*message.Message, error) { return nil, c.dispatch(msg) }
	return poison(c.guard(c.retry(middleware.Recoverer(c.inbox.Middleware(h))))), nil
}
