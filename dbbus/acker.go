package dbbus

import (
	"context"
	"sync"
	"time"
)

// ackDelay is how long an acked delivery may wait to be deleted together
// with the other acks of the bus (at most a quarter of the visibility
// timeout).
const ackDelay = 10 * time.Millisecond

// maxAckBatch bounds the leases one ack transaction deletes; more pending
// acks than that are deleted at once rather than at the end of ackDelay.
const maxAckBatch = 1000

// acker deletes the acked deliveries of all the bus's subscriptions
// together: one transaction (ackAll) for what they acked within ackDelay
// of each other, each delivery fenced by its own subscription's lease.
// With many partitions under a steady load each owner seldom holds more
// than one ack at a time, and a transaction per owner cost five statements
// per message.
//
// Until its ack is deleted a delivery stays leased to the subscription,
// which no longer renews it: ackDelay is far shorter than the lease. An
// ack that fails (the lease lapsed, the database was unreachable) leaves
// the delivery to be delivered again; the inbox skips it.
type acker struct {
	b *Bus

	mu      sync.Mutex
	pending []Lease
	timer   *time.Timer // runs flush; armed while pending is not empty

	flushing sync.Mutex // one flush at a time, so that flush waits for one in progress
}

// add queues l for deletion within ackDelay.
func (a *acker) add(l Lease) {
	a.mu.Lock()
	a.pending = append(a.pending, l)
	switch {
	case len(a.pending) >= maxAckBatch:
		go a.flush()
	case a.timer == nil:
		a.timer = time.AfterFunc(min(ackDelay, a.b.cfg.VisibilityTimeout/4), a.flush)
	}
	a.mu.Unlock()
}

// flush deletes every ack queued before it was called, and returns when
// they are deleted (or their deletion failed, which it logs).
func (a *acker) flush() {
	a.flushing.Lock()
	defer a.flushing.Unlock()
	a.mu.Lock()
	batch := a.pending
	a.pending = nil
	if a.timer != nil {
		a.timer.Stop()
		a.timer = nil
	}
	a.mu.Unlock()
	for len(batch) > 0 {
		n := min(len(batch), maxAckBatch)
		a.delete(batch[:n])
		batch = batch[n:]
	}
}

// delete deletes the acked deliveries of leases in one transaction.
func (a *acker) delete(leases []Lease) {
	b := a.b
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	if err := b.write(func() error { return ackAll(ctx, b.db, leases, true) }); err != nil {
		b.log.Warn("dbbus: ack failed; the messages will be delivered again", "group", leases[0].Group, "err", err)
	}
}
