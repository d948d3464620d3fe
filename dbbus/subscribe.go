package dbbus

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/internal/ack"
	"github.com/bentoevents/bento/internal/closing"
	"github.com/bentoevents/bento/messaging"
)

// settleTimeout bounds an ack, nack or give-back that runs after the
// subscription's context ended.
const settleTimeout = 10 * time.Second

// Subscriber is a message.Subscriber of the bus: Subscribe(ctx, group)
// consumes a declared group. Get one from [Bus.Subscriber] or
// [Bus.BatchSubscriber].
type Subscriber struct {
	bus   *Bus
	batch int           // the most deliveries one claim leases
	mu    closing.Guard // closed by Close
	wg    sync.WaitGroup
}

// Subscriber returns a new subscriber of the bus whose claims lease up to
// Config.BatchSize deliveries. [Bus.Close] closes it too.
func (b *Bus) Subscriber() *Subscriber { return b.BatchSubscriber(b.cfg.BatchSize) }

// BatchSubscriber is [Bus.Subscriber] with claims of up to n deliveries
// (1 when n < 1, at most 1,000). A claim takes every ready delivery up to
// its size, and the subscription hands them out one at a time: a large
// claim serves a fast handler with fewer statements, but among competing
// subscriptions the first to claim takes what is ready while the others
// wait. n = 1 shares the messages out one at a time, as a broker's
// round-robin with a prefetch of 1 does.
func (b *Bus) BatchSubscriber(n int) *Subscriber {
	s := &Subscriber{bus: b, batch: min(max(n, 1), maxBatchSize)}
	b.mu.Lock()
	if b.mu.Closed() {
		_ = s.mu.Close(nil)
	} else {
		b.subs = append(b.subs, s)
	}
	b.mu.Unlock()
	return s
}

// Subscribe implements message.Subscriber: it consumes group, which
// [DeclareGroup] declared (or [UnroutableGroup]). Several subscriptions of
// one group, in one process or several, are competing consumers: each
// claim leases up to the subscriber's batch (Config.BatchSize, or
// BatchSubscriber's n) of ready deliveries, lowest id first, in
// one statement that skips rows another claim holds. The subscription hands
// them out one at a time, in order, and waits for each one's Ack or Nack:
// an Ack deletes the delivery as [Ack] does, together with the claim's
// other acks in one transaction, at the latest 10 ms (or a quarter of the
// visibility timeout) after it; a Nack makes it ready again at once,
// counting a failed attempt ([Nack]). Each message's context derives from
// ctx, carries its [Lease] ([LeaseOf]) and is cancelled once it is settled.
//
// When ctx ends or the subscriber is closed, the channel is closed and the
// deliveries the subscription holds unsettled are given back at once,
// without counting an attempt. Those of a subscription that could not give
// them back (its process died) become ready again once their lease expires
// (Config.VisibilityTimeout), counting an attempt.
//
// Errors: messaging.ErrInvalidName for a bad group name,
// messaging.ErrQueueNotFound for a group never declared, ErrClosed after
// Close.
func (s *Subscriber) Subscribe(ctx context.Context, group string) (<-chan *message.Message, error) {
	if err := messaging.ValidateGroup(group); err != nil {
		return nil, fmt.Errorf("dbbus: subscribe: %w", err)
	}
	if err := requireGroup(ctx, s.bus.db, group); err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	err := s.mu.Use(ErrClosed, func() error {
		s.wg.Add(1)
		return nil
	})
	if err != nil {
		return nil, err
	}
	go func() {
		defer s.wg.Done()
		defer close(out)
		s.consume(ctx, group, out)
	}()
	return out, nil
}

// Close ends the subscriber's subscriptions, gives back what they hold and
// closes their channels; it returns once they are done.
func (s *Subscriber) Close() error {
	_ = s.mu.Close(nil)
	s.wg.Wait()
	b := s.bus
	b.mu.Lock()
	b.subs = slices.DeleteFunc(b.subs, func(x *Subscriber) bool { return x == s })
	b.mu.Unlock()
	return nil
}

// claimed is a leased delivery with its message's body.
type claimed struct {
	lease Lease
	msg   *message.Message
}

// consume claims and hands out group's deliveries until ctx ends or the
// subscriber closes.
func (s *Subscriber) consume(ctx context.Context, group string, out chan<- *message.Message) {
	b := s.bus
	poll := time.NewTimer(0)
	defer poll.Stop()
	var rescued time.Time
	for {
		woken := b.wakes.wakeup(group) // before the claim: a wake-up during it is kept
		if time.Since(rescued) >= b.cfg.PollInterval {
			rescued = time.Now()
			if err := b.rescue(ctx, group); err != nil && ctx.Err() == nil {
				b.log.Warn("dbbus: rescue of expired leases failed", "group", group, "err", err)
			}
		}
		batch, err := b.claim(ctx, group, newToken(), s.batch)
		if err != nil && ctx.Err() == nil {
			b.log.Warn("dbbus: claim failed", "group", group, "err", err)
		}
		if len(batch) > 0 {
			if !s.handOut(ctx, batch, out) {
				return
			}
			continue
		}
		poll.Reset(b.cfg.PollInterval)
		select {
		case <-ctx.Done():
			return
		case <-s.mu.Done():
			return
		case <-woken:
		case <-poll.C:
		}
	}
}

// handOut delivers batch in order, settling each message as it is acked
// or nacked: acks go to the bus's acker, which deletes them within
// ackDelay. It returns false, after giving back what it still holds (and
// waiting for its acks to be deleted), when ctx ends or the subscriber
// closes.
func (s *Subscriber) handOut(ctx context.Context, batch []claimed, out chan<- *message.Message) bool {
	b := s.bus
	renew := time.NewTicker(b.renewEvery())
	defer renew.Stop()
	for i, c := range batch {
		mctx, cancel := context.WithCancel(context.WithValue(ctx, leaseKey{}, c.lease))
		c.msg.SetContext(mctx)
		sent, stopped := false, false
	wait:
		for {
			send := out
			var ackC, nackC <-chan struct{}
			if sent {
				send, ackC, nackC = nil, c.msg.Acked(), c.msg.Nacked()
			}
			select {
			case send <- c.msg:
				sent = true
			case <-ackC:
				break wait
			case <-nackC:
				break wait
			case <-renew.C:
				// A slow handler keeps what the subscription holds.
				b.renew(ctx, c.lease.Token, leasesOf(batch[i:]))
			case <-ctx.Done():
				stopped = true
				break wait
			case <-s.mu.Done():
				stopped = true
				break wait
			}
		}
		cancel()
		giveBack := i + 1 // the first delivery to give back when stopped
		switch {
		case ack.Acked(c.msg):
			b.acks.add(c.lease)
		case nacked(c.msg):
			sctx, done := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
			if err := b.write(func() error { return Nack(sctx, b.db, c.lease) }); err != nil {
				b.log.Warn("dbbus: nack failed", "group", c.lease.Group, "message", c.lease.MessageID, "err", err)
			}
			done()
			b.wakes.queues(c.lease.Group)
		default: // not settled: given back with the rest
			giveBack = i
		}
		if stopped {
			b.acks.flush()
			ids := make([]int64, 0, len(batch)-giveBack)
			for _, r := range batch[giveBack:] {
				ids = append(ids, r.lease.Delivery)
			}
			sctx, done := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
			if err := b.write(func() error { return release(sctx, b.db, c.lease.Token, ids) }); err != nil {
				b.log.Warn("dbbus: give-back failed; the messages come back when their lease expires", "group", c.lease.Group, "err", err)
			}
			done()
			b.wakes.queues(c.lease.Group)
			return false
		}
	}
	return true
}

// claimedRow is a delivery row a claim leased, with its message's body
// when the claim reads it (statements.claimBodies).
type claimedRow struct {
	ID        int64
	MessageID string
	Topic     string
	Attempts  int
	Metadata  *string // nil: the body is missing, or was not read
	Payload   []byte
}

// claim leases up to limit ready deliveries of group under token and loads
// their messages, in delivery order, each with its delivery count
// (setDeliveryCount). Those past the delivery limit are dead-lettered
// instead (deadLetter), and not returned.
//
// The claim statement itself is not cancelled with ctx (it is bounded by
// settleTimeout instead): a claim cancelled after the server committed it,
// before its answer was read, would leave its deliveries leased to nobody
// for a whole visibility timeout, and a subscription ends at any moment (a
// partition move ends one). What it returns after ctx ended, the caller
// gives back.
func (b *Bus) claim(ctx context.Context, group, token string, limit int) ([]claimed, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rows []claimedRow
	qctx, done := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer done()
	err := b.write(func() error {
		return b.db.WithContext(qctx).Raw(b.sql.claim, map[string]any{
			"group": group, "limit": limit, "token": token,
			"ms": b.cfg.VisibilityTimeout.Milliseconds(),
		}).Scan(&rows).Error
	})
	if err != nil {
		return nil, wrapDB("claim", err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	var msgs map[messageKey]*message.Message
	var unreadable map[messageKey]error
	if b.sql.claimBodies {
		bodies := make([]body, 0, len(rows))
		for _, r := range rows {
			if r.Metadata != nil { // nil: missing
				bodies = append(bodies, body{ID: r.MessageID, Topic: r.Topic, Metadata: *r.Metadata, Payload: r.Payload})
			}
		}
		msgs, unreadable = decodeBodies(bodies)
	} else {
		keys := make([]messageKey, len(rows))
		for i, r := range rows {
			keys[i] = messageKey{r.MessageID, r.Topic}
		}
		if msgs, unreadable, err = readMessages(b.db.WithContext(ctx), keys); err != nil {
			// Give the claim back rather than leave it to expire.
			sctx, done := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
			defer done()
			dids := make([]int64, len(rows))
			for i, r := range rows {
				dids[i] = r.ID
			}
			_ = b.write(func() error { return release(sctx, b.db, token, dids) })
			return nil, wrapDB("claim: read messages", err)
		}
	}
	slices.SortFunc(rows, func(x, y claimedRow) int { return cmp.Compare(x.ID, y.ID) })
	out := make([]claimed, 0, len(rows))
	var doomed []claimed // past the delivery limit
	for _, r := range rows {
		// A delivery that cannot be read stays leased, and comes back when
		// its lease expires, counted as a failed attempt; the others go on.
		k := messageKey{r.MessageID, r.Topic}
		msg, ok := msgs[k]
		if err := unreadable[k]; err != nil {
			b.log.Warn("dbbus: message metadata unreadable; skipped until its lease expires", "group", group, "message", r.MessageID, "err", err)
			continue
		}
		if !ok {
			b.log.Warn("dbbus: delivery references a missing message; skipped until its lease expires", "group", group, "delivery", r.ID, "message", r.MessageID)
			continue
		}
		c := claimed{
			lease: Lease{Group: group, Delivery: r.ID, MessageID: r.MessageID, Topic: r.Topic, Token: token, Attempts: r.Attempts},
			msg:   msg,
		}
		if b.pastLimit(r.Attempts) {
			doomed = append(doomed, c)
			continue
		}
		setDeliveryCount(msg, r.Attempts)
		out = append(out, c)
	}
	if len(doomed) > 0 {
		b.deadLetter(ctx, group, token, doomed)
	}
	return out, nil
}

// renewEvery is how often a subscription renews its leases: three times
// per visibility timeout.
func (b *Bus) renewEvery() time.Duration { return max(b.cfg.VisibilityTimeout/3, time.Millisecond) }

// renew extends the leases, under token, of the deliveries given to a
// visibility timeout from now. A failure is logged: the deliveries whose
// lease lapses come back to the group, and their acks fail.
func (b *Bus) renew(ctx context.Context, token string, leases []Lease) {
	if len(leases) == 0 {
		return
	}
	ids := make([]int64, len(leases))
	for i, l := range leases {
		ids[i] = l.Delivery
	}
	err := b.write(func() error {
		return b.db.WithContext(ctx).Exec(b.sql.renew, b.cfg.VisibilityTimeout.Milliseconds(), ids, token).Error
	})
	if err != nil && ctx.Err() == nil {
		b.log.Warn("dbbus: lease renewal failed", "group", leases[0].Group, "err", wrapDB("renew", err))
	}
}

// leasesOf returns the leases of batch.
func leasesOf(batch []claimed) []Lease {
	out := make([]Lease, len(batch))
	for i, c := range batch {
		out[i] = c.lease
	}
	return out
}

// rescue makes the expired leases of group ready again, in bounded
// batches.
func (b *Bus) rescue(ctx context.Context, group string) error {
	for {
		var n int64
		err := b.write(func() error {
			res := b.db.WithContext(ctx).Exec(b.sql.rescue, map[string]any{"group": group, "limit": maxBatchSize})
			n = res.RowsAffected
			return res.Error
		})
		if err != nil {
			return wrapDB("rescue", err)
		}
		if n < maxBatchSize {
			return nil
		}
	}
}

// nacked reports, without waiting, whether msg has been nacked.
func nacked(msg *message.Message) bool {
	select {
	case <-msg.Nacked():
		return true
	default:
		return false
	}
}
