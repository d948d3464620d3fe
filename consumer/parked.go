package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/tenant"
)

// sweepEvery is how often a partitioned consumer with hold-back turns
// expired waits into gap dead letters and applies the parked events of its
// partitions that nothing holds back any more.
const sweepEvery = time.Second

// quietSweepEvery is how often it sweeps while the group has no parked
// event: its last sweep applied and expired nothing and the group's
// parked events were counted at none, it has parked none since, and its
// partitions are the same. Only an instance that owns a partition parks
// its events, so nothing is missed; the sweep still runs at this pace as
// a backstop.
const quietSweepEvery = 30 * time.Second

// noneParked reports whether the group has no parked event at all, on
// any partition (false when they cannot be counted).
func (c *Consumer) noneParked(ctx context.Context) bool {
	counts, err := c.inbox.ParkedCounts(ctx)
	if err != nil {
		return false
	}
	for _, n := range counts {
		if n > 0 {
			return false
		}
	}
	return true
}

// sweepWindow bounds the parked events one sweep looks at: a window of
// them, in key order from where the previous sweep stopped (see
// inbox.ParkedAggregates).
const sweepWindow = 2000

// ErrStaleRelease is returned by Release when the aggregate is not held
// back by what the release names (it is inbox.ErrStaleRelease).
var ErrStaleRelease = inbox.ErrStaleRelease

type partitionCtxKey struct{}

// withPartition records in ctx the partition a message arrived on.
func withPartition(ctx context.Context, p int) context.Context {
	return context.WithValue(ctx, partitionCtxKey{}, p)
}

// partitionOf returns the partition recorded in ctx, or -1.
func partitionOf(ctx context.Context) int {
	if p, ok := ctx.Value(partitionCtxKey{}).(int); ok {
		return p
	}
	return -1
}

// Parked returns up to limit events this consumer group parked instead of
// applying them out of order (see Config.DisableHoldBack), oldest first: those
// waiting behind a dead letter ("held"), those waiting for a predecessor
// ("waiting"), and those that waited past GapTimeout ("gap"). It is
// Inspector.Parked with no filter; Inspect reads them without a consumer.
func (c *Consumer) Parked(ctx context.Context, limit int) ([]inbox.Parked, error) {
	return c.inspector().Parked(ctx, inbox.ParkedFilter{}, limit)
}

// Release gives up what holds an aggregate back (see
// Config.DisableHoldBack), named by messageID, so that its parked events
// go on: the dead letter it is held behind, for when that was discarded
// (name it by DeadLetter.MessageID, with DeadLetter.Aggregate), or, under
// inbox.VersionsContiguous, its first parked event, waiting for versions
// that are lost for good (name it by inbox.Parked.MessageID, with
// Parked.Aggregate): they are skipped. Releasing a hold under
// VersionsContiguous also skips the versions the first parked event waits
// for. The consumer of the events' partition applies them within about a
// second. Release compares and gives up in one transaction: a release
// that is stale (the aggregate was released or its dead letter applied
// already, or it is held behind another message now, such as a parked
// event that failed in its turn) changes nothing and returns
// ErrStaleRelease, so a retried Release never lifts a hold it did not
// name. An empty tenant means the default tenant. Inspector.Release does
// the same without a consumer.
//
// Errors: ErrStaleRelease, inbox.ErrClosed, or the database error.
func (c *Consumer) Release(ctx context.Context, agg inbox.Aggregate, messageID string) error {
	return c.inspector().Release(ctx, agg, messageID)
}

// Aggregate returns the aggregate d belongs to: with d.MessageID it names
// the hold Release gives up when d is discarded.
func (d DeadLetter) Aggregate() inbox.Aggregate {
	return inbox.Aggregate{TenantID: d.TenantID, Type: d.AggregateType, ID: d.AggregateID}
}

// park parks msg for reason, logging it.
func (c *Consumer) park(ctx context.Context, msg *message.Message, reason string, cause error) error {
	err := c.inbox.Park(ctx, msg, partitionOf(ctx), reason)
	// After the park (committed or not): a sweep that started before it
	// committed runs again.
	c.parkedSince.Store(true)
	if err != nil {
		return err
	}
	c.cfg.Logger.Info("consumer: event parked until its aggregate's earlier events are applied", "group", c.cfg.Group,
		"message_id", msg.UUID, "reason", reason, "cause", cause)
	return nil
}

// drain applies the parked events of agg in version order, until one
// cannot be applied yet (or fails) or none is left.
func (c *Consumer) drain(ctx context.Context, agg inbox.Aggregate) {
	c.drainMu.Lock()
	defer c.drainMu.Unlock()
	for ctx.Err() == nil {
		p, err := c.inbox.NextParked(ctx, agg)
		if err != nil {
			c.cfg.Logger.Warn("consumer: cannot read parked events; the next sweep tries again", "group", c.cfg.Group,
				"aggregate_id", agg.ID, "err", err)
			return
		}
		if p == nil || !c.applyParked(ctx, p) {
			return
		}
	}
}

// applyParked tries once to apply p, deleting its row in the transaction
// that applies it, and reports whether it left inbox_parked (so the next
// one may follow). A failure that retrying cannot fix, or one that
// outlasts MaxRetries attempts, dead-letters it and holds its aggregate
// behind it; others leave it parked for the next sweep.
func (c *Consumer) applyParked(ctx context.Context, p *inbox.Parked) bool {
	msg := p.Message()
	msg.SetContext(withPartition(ctx, p.Partition))
	st, err := c.inbox.CheckHold(ctx, msg)
	if err == nil {
		unpark := func(msg *message.Message) ([]*message.Message, error) {
			if err := c.inbox.Unpark(msg.Context(), msg.UUID); err != nil {
				return nil, err
			}
			return nil, c.dispatch(msg)
		}
		_, err = c.attempt(ctx, msg, middleware.Recoverer(c.inbox.Middleware(unpark)))
	}
	switch {
	case err == nil:
		// A duplicate was skipped without running unpark: delete it here.
		if err := c.inbox.Unpark(ctx, p.MessageID); err != nil {
			c.cfg.Logger.Warn("consumer: applied a parked event but cannot delete it; the next sweep skips it as a duplicate",
				"group", c.cfg.Group, "message_id", p.MessageID, "err", err)
			return false
		}
		if st.Own {
			c.unhold(ctx, msg)
		}
		return true
	case ctx.Err() != nil, errors.Is(err, inbox.ErrHeld), errors.Is(err, inbox.ErrGap), errors.Is(err, ErrFenced),
		c.classify(ctx, err) != failed:
		return false // not yet, or not now
	}
	cause := ""
	switch {
	case errors.Is(err, ErrNoHandler) || isDecode(err):
		cause = CauseDecode
	case IsPermanent(err):
		cause = CausePermanent
	case p.Attempts+1 > c.cfg.MaxRetries:
		cause = CauseFailed
	}
	if cause == "" {
		if ferr := c.inbox.ParkFailed(ctx, p.MessageID, err); ferr != nil {
			c.cfg.Logger.Warn("consumer: cannot record a failed attempt at a parked event", "group", c.cfg.Group,
				"message_id", p.MessageID, "err", ferr)
		}
		c.cfg.Logger.Warn("consumer: parked event failed; the next sweep tries again", "group", c.cfg.Group,
			"message_id", p.MessageID, "attempts", p.Attempts+1, "err", err)
		return false
	}
	// Hold the aggregate behind it before it leaves inbox_parked.
	if herr := c.inbox.Hold(ctx, msg); herr != nil {
		c.cfg.Logger.Warn("consumer: cannot hold the aggregate back; keeping the parked event", "group", c.cfg.Group,
			"message_id", p.MessageID, "err", herr)
		return false
	}
	msg.Metadata.Set(MetaDeadReason, err.Error())
	c.markDead(msg, cause, p.Attempts+1, err)
	if perr := c.dead.Publish(c.deadTopic, msg); perr != nil {
		c.cfg.Logger.Warn("consumer: cannot dead-letter a parked event; keeping it", "group", c.cfg.Group,
			"message_id", p.MessageID, "err", perr)
		return false
	}
	if uerr := c.inbox.Unpark(ctx, p.MessageID); uerr != nil {
		c.cfg.Logger.Warn("consumer: dead-lettered a parked event but cannot delete it", "group", c.cfg.Group,
			"message_id", p.MessageID, "err", uerr)
	}
	return false
}

// unhold lifts the hold msg's aggregate was held behind, msg being applied.
func (c *Consumer) unhold(ctx context.Context, msg *message.Message) {
	if err := c.inbox.Unhold(ctx, msg); err != nil {
		c.cfg.Logger.Error("consumer: applied the message its aggregate was held behind, but could not lift the hold; "+
			"a redelivery of it lifts it", "group", c.cfg.Group, "message_id", msg.UUID, "err", err)
	}
}

// sweep turns the waits that outlasted GapTimeout into gap dead letters and
// applies the parked events of partitions that nothing holds back any more
// (a hold released, a drain cut short by an outage or a handover), looking
// at sweepWindow parked events at a time.
//
// It reports whether it did or may have work: false only when it read
// every parked event of the partitions (its window started at the
// beginning), found none to apply, and expired nothing.
func (c *Consumer) sweep(ctx context.Context, partitions []int) (busy bool) {
	busy = c.sweepFrom != (inbox.Aggregate{})
	if c.cfg.GapTimeout > 0 {
		expired, err := c.inbox.ExpireParked(ctx, time.Now().Add(-c.cfg.GapTimeout))
		if err != nil && ctx.Err() == nil {
			c.cfg.Logger.Warn("consumer: cannot expire parked events", "group", c.cfg.Group, "err", err)
		}
		busy = busy || err != nil || len(expired) > 0
		for _, p := range expired {
			c.metrics.deadLettered.WithLabelValues(CauseGap).Inc()
			c.cfg.Logger.Warn("consumer: dead letter: an event waited for its predecessor longer than GapTimeout; "+
				"it stays parked and is applied if the predecessor arrives, or after Release",
				"group", c.cfg.Group, "message_id", p.MessageID, "event_type", p.Metadata.Get(messaging.MetaEventType),
				"tenant_id", p.TenantID, "aggregate_type", p.AggregateType, "aggregate_id", p.AggregateID,
				"version", p.Version, "cause", CauseGap, "gap_timeout", c.cfg.GapTimeout)
		}
	}
	// Page on from where the previous sweep stopped, wrapping around at
	// the end: every releasable aggregate is reached within a bounded
	// number of sweeps, however many are held, and one that keeps failing
	// does not keep the others out.
	aggs, next, err := c.inbox.ParkedAggregates(ctx, partitions, c.sweepFrom, sweepWindow)
	if err != nil {
		if ctx.Err() == nil {
			c.cfg.Logger.Warn("consumer: cannot list parked events", "group", c.cfg.Group, "err", err)
		}
		return true
	}
	c.sweepFrom = next
	for _, agg := range aggs {
		c.drain(ctx, agg)
	}
	return busy || len(aggs) > 0
}

// parkReason returns how a message refused with err is parked, or "" when
// it is not refused for its order.
func parkReason(err error) string {
	switch {
	case errors.Is(err, inbox.ErrHeld):
		return inbox.ParkedHeld
	case errors.Is(err, inbox.ErrGap):
		return inbox.ParkedWaiting
	}
	return ""
}

// aggregateOf returns the aggregate msg belongs to.
func aggregateOf(msg *message.Message) inbox.Aggregate {
	tid := msg.Metadata.Get(messaging.MetaTenantID)
	if tid == "" {
		tid = tenant.Default
	}
	return inbox.Aggregate{TenantID: tid, Type: msg.Metadata.Get(messaging.MetaAggregateType),
		ID: msg.Metadata.Get(messaging.MetaAggregateID)}
}
