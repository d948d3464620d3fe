package dbbus

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/internal/ack"
	"github.com/bentoevents/bento/messaging"
)

// partitionSubscriber is the subscriber [Bus.PartitionSubscriber] returns.
type partitionSubscriber struct {
	*Subscriber     // its closing, registration and wait group
	prefetch    int // at least 1
}

// PartitionSubscriber returns a message.Subscriber whose Subscribe(ctx,
// queue) consumes one queue with a single active consumer across every Bus
// on the database: typically a partition queue,
// messaging.PartitionQueue(group, p) of a group declared with
// [DeclarePartitions], but any declared queue will do. It is the database
// bus's counterpart of MemoryBus.PartitionSubscriber and
// rabbitmq.NewPartitionSubscriber, with the same contract:
//
//   - The subscription owns the queue while it lives: an owner row in
//     dbbus_queue_owners with a random token and an expiry by the
//     database's clock, renewed three times per Config.VisibilityTimeout.
//     Another subscription of the queue, of this Bus or another one in
//     another process, receives nothing until the owner ends (its ctx is
//     cancelled, its subscriber or bus is closed) or its ownership lapses
//     (its process died or lost the database for a visibility timeout);
//     it then takes over, and what its predecessor held comes first again,
//     in order (what a dead owner held counts a failed attempt).
//   - It hands out the queue's messages in publish order with up to
//     prefetch (0 means 1) in hand, and renews their leases while they are
//     in hand, however slow the handler.
//   - Acks are taken in order: one acked while an older message is in hand
//     lets nothing more in. Acked deliveries are deleted as by [Ack], a
//     few at a time.
//   - A Nack makes the nacked message ready again, counting a failed
//     attempt, and gives back every later one in hand, uncounted, so they
//     come again, to this subscription, in order.
//
// An owner that finds its ownership lost (another subscription took the
// queue over) closes its channel. The subscriber errors are those of
// [Subscriber.Subscribe].
func (b *Bus) PartitionSubscriber(prefetch int) message.Subscriber {
	return &partitionSubscriber{Subscriber: b.Subscriber(), prefetch: min(max(prefetch, 1), maxBatchSize)}
}

// Subscribe implements message.Subscriber; see [Bus.PartitionSubscriber].
func (s *partitionSubscriber) Subscribe(ctx context.Context, queue string) (<-chan *message.Message, error) {
	if err := messaging.ValidateGroup(queue); err != nil {
		return nil, fmt.Errorf("dbbus: subscribe: %w", err)
	}
	if err := requireGroup(ctx, s.bus.db, queue); err != nil {
		return nil, err
	}
	if err := s.mu.Use(ErrClosed, func() error {
		s.wg.Add(1)
		return nil
	}); err != nil {
		return nil, err
	}
	o := &owner{bus: s.bus, sub: s.Subscriber, queue: queue, token: newToken(), prefetch: s.prefetch}
	// The first subscription takes the queue before Subscribe returns, so
	// that of two subscriptions the first one subscribed owns it. The
	// wake-up channel is taken before: a disown or publish between this
	// attempt and the goroutine's first wait is kept, not slept through.
	woken := s.bus.wakes.wakeup(queue)
	o.owned = o.own(ctx)
	out := make(chan *message.Message)
	go func() {
		defer s.wg.Done()
		defer close(out)
		o.run(ctx, out, woken)
	}()
	return out, nil
}

// owner is one subscription of a [Bus.PartitionSubscriber].
type owner struct {
	bus      *Bus
	sub      *Subscriber
	queue    string
	token    string // the owner token and the lease token of its deliveries
	prefetch int

	owned   bool
	renewed time.Time // when ownership was last taken or renewed
}

// own takes or renews the ownership of the queue, and reports whether the
// subscription owns it.
func (o *owner) own(ctx context.Context) bool {
	b := o.bus
	var got []string
	err := b.write(func() error {
		return b.db.WithContext(ctx).Raw(b.sql.own, map[string]any{
			"queue": o.queue, "owner": o.token, "ms": b.cfg.VisibilityTimeout.Milliseconds(),
		}).Scan(&got).Error
	})
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("dbbus: taking or renewing a queue's ownership failed", "queue", o.queue, "err", wrapDB("own", err))
		}
		// Still owned as long as the last renewal holds.
		return o.owned && time.Since(o.renewed) < b.cfg.VisibilityTimeout
	}
	if len(got) == 0 {
		return false
	}
	o.renewed = time.Now()
	return true
}

// stopped reports whether ctx ended or the subscriber or bus closed.
func (o *owner) stopped(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	case <-o.sub.mu.Done():
		return true
	default:
		return false
	}
}

// run waits to own the queue, takes over what a predecessor held, then
// consumes it until ctx ends, the subscriber closes or the ownership is
// lost, and gives the queue up. woken is the bus's wake-up channel as it
// was before the last attempt to own the queue, so that a wake-up after
// that attempt ends the wait.
func (o *owner) run(ctx context.Context, out chan<- *message.Message, woken <-chan struct{}) {
	b := o.bus
	poll := time.NewTicker(b.cfg.PollInterval)
	defer poll.Stop()
	// Give the queue up however the subscription ends, owned or not: a
	// statement taking the ownership may have committed on the server
	// after ctx ended, its answer unread, and would leave the queue owned
	// by nobody until the ownership lapses.
	defer o.disown(ctx)
	for {
		if o.owned {
			if o.takeOver(ctx) {
				break
			}
			o.disown(ctx)
			o.owned = false
			woken = b.wakes.wakeup(o.queue) // not woken by its own disown: wait to retry
		}
		select {
		case <-ctx.Done():
			return
		case <-o.sub.mu.Done():
			return
		case <-woken:
		case <-poll.C:
		}
		woken = b.wakes.wakeup(o.queue) // before the attempt: a wake-up during it is kept
		o.owned = o.own(ctx)
	}
	// An owner on a bus that listens does not poll: it is its queue's only
	// consumer, every publish to the queue (from any process) notifies it,
	// a lost connection wakes it once listening again, and its renewals
	// (three per visibility timeout) look for deliveries too, as a
	// backstop. Polling, eight partitions' owners claimed in vain every
	// few seconds, most of an idle consumer's statements.
	var polls <-chan time.Time
	if !b.listens {
		polls = poll.C
	}
	o.consume(ctx, out, polls)
}

// takeOver makes what other tokens hold of the queue ready again.
func (o *owner) takeOver(ctx context.Context) bool {
	b := o.bus
	err := b.write(func() error {
		return b.db.WithContext(ctx).Exec(takeOver, map[string]any{"queue": o.queue, "owner": o.token}).Error
	})
	if err != nil && ctx.Err() == nil {
		b.log.Warn("dbbus: taking over a queue failed", "queue", o.queue, "err", wrapDB("take over", err))
	}
	return err == nil
}

// disown gives the queue up, if the subscription still owns it, and wakes
// the bus's other subscriptions so that a waiting one takes it at once.
func (o *owner) disown(ctx context.Context) {
	b := o.bus
	sctx, done := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer done()
	err := b.write(func() error {
		return b.db.WithContext(sctx).Exec(disown, map[string]any{"queue": o.queue, "owner": o.token}).Error
	})
	if err != nil {
		b.log.Warn("dbbus: giving a queue up failed; another subscription takes it when the ownership lapses", "queue", o.queue, "err", wrapDB("disown", err))
	}
	b.wakes.queues(o.queue)
}

// inHand is a delivery the owner claimed: handed out (or about to be),
// not settled.
type inHand struct {
	claimed
	cancel context.CancelFunc
}

// consume hands out the queue's deliveries in order, up to prefetch in
// hand, until ctx ends, the subscriber closes or the ownership is lost,
// looking for more when woken, at each poll (nil: none) and at each
// renewal;
// then it deletes what was acked and gives back the rest (what it claimed
// ahead and did not hand out too).
func (o *owner) consume(ctx context.Context, out chan<- *message.Message, poll <-chan time.Time) {
	b := o.bus
	var (
		window  []inHand // handed out, in order
		pending []inHand // claimed, not handed out yet, in order
		more    = true   // the queue may have ready deliveries
	)
	settleCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	}
	// giveBack deletes the acked among rest (and every ack the bus holds)
	// and gives the others back, uncounted, after nacking nacked (counted)
	// when it is not nil.
	giveBack := func(nacked *inHand, rest []inHand) {
		var ids []int64
		for _, h := range rest {
			h.cancel()
			if ack.Acked(h.msg) {
				b.acks.add(h.lease)
			} else {
				ids = append(ids, h.lease.Delivery)
			}
		}
		b.acks.flush()
		sctx, done := settleCtx()
		defer done()
		if nacked != nil {
			nacked.cancel()
			if err := b.write(func() error { return Nack(sctx, b.db, nacked.lease) }); err != nil {
				b.log.Warn("dbbus: nack failed", "queue", o.queue, "message", nacked.lease.MessageID, "err", err)
			}
		}
		if err := b.write(func() error { return release(sctx, b.db, o.token, ids) }); err != nil {
			b.log.Warn("dbbus: give-back failed; the messages come back when the queue is taken over", "queue", o.queue, "err", err)
		}
	}
	defer func() {
		giveBack(nil, slices.Concat(window, pending))
	}()
	renew := time.NewTicker(b.renewEvery())
	defer renew.Stop()
	woken := b.wakes.wakeup(o.queue)
	// The owner claims ahead, up to a batch (BatchSize, or prefetch when
	// larger) at a time, when nothing claimed is waiting: no other
	// subscription may take the queue's messages, so claiming ahead costs
	// nobody, and one claim serves many messages even at prefetch 1.
	lookahead := max(o.prefetch, b.cfg.BatchSize)
	for {
		if limit := lookahead - len(window); more && len(pending) == 0 && limit > 0 && !o.stopped(ctx) {
			woken = b.wakes.wakeup(o.queue) // before the claim: a wake-up during it is kept
			got, err := b.claim(ctx, o.queue, o.token, limit)
			if err != nil && ctx.Err() == nil {
				b.log.Warn("dbbus: claim failed", "queue", o.queue, "err", err)
			}
			for _, c := range got {
				mctx, cancel := context.WithCancel(context.WithValue(ctx, leaseKey{}, c.lease))
				c.msg.SetContext(mctx)
				pending = append(pending, inHand{claimed: c, cancel: cancel})
			}
			more = err == nil && len(got) == limit
		}
		var (
			send          chan<- *message.Message
			sending       *message.Message
			acks, nackedC <-chan struct{}
		)
		if len(pending) > 0 && len(window) < o.prefetch {
			send, sending = out, pending[0].msg
		}
		if len(window) > 0 {
			acks, nackedC = window[0].msg.Acked(), window[0].msg.Nacked()
		}
		select {
		case send <- sending:
			window = append(window, pending[0])
			pending = pending[1:]
		case <-acks:
			for len(window) > 0 && ack.Acked(window[0].msg) {
				window[0].cancel()
				b.acks.add(window[0].lease)
				window = window[1:]
			}
		case <-nackedC:
			head := window[0]
			giveBack(&head, slices.Concat(window[1:], pending))
			window, pending = nil, nil
			more = true
			b.wakes.queues(o.queue)
		case <-woken:
			more = true
			woken = b.wakes.wakeup(o.queue)
		case <-poll:
			more = true
		case <-renew.C:
			more = true
			if o.owned = o.own(ctx); !o.owned {
				b.log.Warn("dbbus: queue taken over by another subscription; ending this one", "queue", o.queue)
				return
			}
			var leases []Lease
			for _, h := range slices.Concat(window, pending) {
				leases = append(leases, h.lease)
			}
			b.renew(ctx, o.token, leases)
		case <-ctx.Done():
			return
		case <-o.sub.mu.Done():
			return
		}
	}
}
