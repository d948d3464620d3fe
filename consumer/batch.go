package consumer

import (
	"context"
	"slices"
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
	var again []string // redelivered messages in the batch: their attempts are recorded
	if c.crashes != nil {
		batch, again = c.startBatch(ctx, batch)
	} else if i := slices.IndexFunc(batch, c.nearLimit); i >= 0 {
		batch = batch[:i] // the single-message path dead-letters it (see Consumer.guard)
	}
	if len(batch) == 0 {
		return 0
	}
	probe, err := c.breaker.enter(ctx)
	if err != nil {
		c.settleBatch(ctx, batch[:0], again)
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
	c.settleBatch(ctx, batch[:n], again)
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

// startBatch cuts batch before its first message whose attempts died
// before (or that must be dead-lettered as poison): those go to the
// single-message path, one at a time (see Consumer.guard). It records the
// attempts at the redelivered messages of what remains and returns it,
// with their ids. When the ledger cannot be read or written, nothing is
// applied in a batch.
func (c *Consumer) startBatch(ctx context.Context, batch []*message.Message) ([]*message.Message, []string) {
	again := redeliveredIDs(batch)
	if len(again) == 0 {
		return batch, nil
	}
	crashes, err := c.crashes.account(ctx, again)
	if err != nil {
		return batch[:0], nil
	}
	for i, m := range batch {
		if n := crashes[m.UUID]; n > 0 || c.doomed(m, n) {
			batch = batch[:i]
			break
		}
	}
	again = redeliveredIDs(batch)
	if len(again) == 0 {
		return batch, nil
	}
	if err := c.crashes.start(ctx, again); err != nil {
		return batch[:0], nil
	}
	return batch, again
}

// settleBatch records that the attempts at again returned: those of
// settled messages are done, the others are kept for their next try.
func (c *Consumer) settleBatch(ctx context.Context, settled []*message.Message, again []string) {
	if len(again) == 0 {
		return
	}
	var done, kept []string
	for _, id := range again {
		if slices.ContainsFunc(settled, func(m *message.Message) bool { return m.UUID == id }) {
			done = append(done, id)
		} else {
			kept = append(kept, id)
		}
	}
	c.crashes.settle(ctx, done, kept)
}
