package consumer

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/messaging"
)

// applyBatch applies, in one transaction, the longest run at the head of
// batch that it can (see inbox.ApplyBatch) and returns its length. It
// stops before a message whose aggregate is held back or has parked
// events, and at the first message that fails: the caller hands that one
// to the single-message path, with its retry rules, before the rest.
func (c *Consumer) applyBatch(ctx context.Context, batch []*message.Message) int {
	start := time.Now()
	for i, m := range batch { // one decode per delivery, before the inbox
		if _, err := messaging.EnvelopeOf(m); err != nil {
			batch = batch[:i] // the single-message path dead-letters it
			break
		}
	}
	if len(batch) == 0 {
		return 0
	}
	if !c.cfg.DisableHoldBack {
		tangled, err := c.inbox.Entangled(ctx, batch)
		if err != nil {
			return 0 // the single-message path retries what failed
		}
		for i, m := range batch {
			if tangled[aggregateOf(m)] {
				batch = batch[:i]
				break
			}
		}
	}
	if len(batch) == 0 {
		return 0
	}
	probe, err := c.breaker.enter(ctx)
	if err != nil {
		return 0
	}
	actx := ctx
	if c.cfg.HandlerTimeout > 0 {
		// The batch gets HandlerTimeout per message, and so do its
		// handlers, whose contexts derive from their messages'.
		deadline := time.Now().Add(c.cfg.HandlerTimeout * time.Duration(len(batch)))
		var cancel context.CancelFunc
		actx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
		for _, m := range batch {
			orig := m.Context()
			mctx, cancel := context.WithDeadline(orig, deadline)
			m.SetContext(mctx)
			defer m.SetContext(orig)
			defer cancel()
		}
	}
	n, err := c.inbox.ApplyBatch(actx, batch, func(msg *message.Message) ([]*message.Message, error) {
		return nil, c.dispatch(msg)
	})
	if n > 0 {
		err = nil // the database answered
	}
	cl := failed
	if err != nil && ctx.Err() == nil {
		cl = c.classify(ctx, err)
	}
	c.leaveBreaker(ctx, probe, err, cl)
	if n > 0 {
		c.metrics.observe(n, start)
	}
	return n
}
