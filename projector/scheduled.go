package projector

import (
	"context"
	"time"

	"github.com/bentoevents/bento/outbox"
)

// releaseRecheck is how long a projector goes at most without looking for
// due scheduled messages while it runs: a message scheduled for sooner
// than the one it knows of is found within it. It is also the least time
// between two looks while the projector stays busy: a wake-up (Wake, or
// PostgreSQL's notification of the scheduling commit) makes it look at
// once, or releaseRecheck after its last look if that was sooner, so that
// writers waking a busy projector after every commit do not add two
// statements to each of its loops.
const releaseRecheck = 50 * time.Millisecond

// releaser moves due scheduled messages into the outbox before the
// projector claims (outbox.Store.ReleaseDue), leased to the projector, so
// that its next batch publishes them without claiming them first; and it
// knows when the next one falls due, so the projector sleeps no longer
// than that.
type releaser struct {
	p    *OutboxProjector
	next time.Time // when to look again, by the host's monotonic clock
	due  time.Time // when the next known message falls due; zero: none known
	last time.Time // when it last looked
	// woke is set by a wake-up since the last look: an idle projector must
	// not sleep past next, even when it knows of no due time (wakeBound).
	woke bool
	// errDelay is the wait before looking again after a failed look: it
	// doubles from releaseRecheck up to IdleSleep while looks fail.
	errDelay time.Duration
}

// woken makes the releaser look at once, or releaseRecheck after its last
// look if that is sooner, and keeps the projector from sleeping past that
// look: the projector was woken, and the wake may be the news of a message
// that falls due before any it knows of. A look that failed keeps its
// backoff.
func (r *releaser) woken() {
	r.woke = true
	if at := r.last.Add(releaseRecheck); r.errDelay == 0 && at.Before(r.next) {
		r.next = at
	}
}

// run releases what is due when it is time to look, and returns how long
// the projector may sleep before it must look again, and the messages it
// released, leased to the projector, for its next batch.
//
// Like the claim, the release is not cancelled with ctx (it is bounded by
// settleTimeout): one cancelled after the server committed it would leave
// what it released leased to a stopped projector for the whole lease. The
// batch releases what it gets after ctx ended as untried.
func (r *releaser) run(ctx context.Context) (time.Duration, []*outbox.Message) {
	now := time.Now()
	if now.Before(r.next) || ctx.Err() != nil {
		return r.sleep(now), nil
	}
	r.last, r.woke = now, false
	cfg := r.p.cfg
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	res, err := r.p.store.ReleaseDue(rctx, outbox.ReleaseOpts{Tenant: cfg.Tenant, Limit: cfg.BatchSize,
		MaxBytes: max(cfg.MaxBatchBytes, 0), Worker: cfg.WorkerID, Lease: cfg.Lease})
	if err != nil {
		if ctx.Err() == nil {
			r.p.log.Error("releasing due scheduled messages failed", "err", err)
		}
		// Look again soon, backing off while it fails: a transient error
		// must not hold back what falls due meanwhile for a whole
		// IdleSleep. The projector sleeps until that try (or until a due
		// time it knows of that comes sooner), never less: a due time
		// already past would have it spin.
		r.errDelay = min(max(2*r.errDelay, releaseRecheck), max(r.p.cfg.IdleSleep, releaseRecheck))
		r.next = now.Add(r.errDelay)
		if !r.due.After(now) || r.due.After(r.next) {
			r.due = r.next
		}
		return r.sleep(now), nil
	}
	r.errDelay = 0
	r.p.metrics.released(res.Late)
	r.due = time.Time{}
	r.next = now.Add(releaseRecheck)
	if res.Waiting {
		r.due = now.Add(max(res.Next, 0))
		if r.due.Before(r.next) {
			r.next = r.due
		}
	}
	return r.sleep(now), res.Leased
}

// sleep is how long from now the projector may sleep: until the next known
// due time, unbounded (its own IdleSleep) when none is known.
func (r *releaser) sleep(now time.Time) time.Duration {
	if r.due.IsZero() {
		return time.Duration(1<<63 - 1)
	}
	return max(r.due.Sub(now), 0)
}

// wakeBound is how long from now an idle projector may sleep when a
// wake-up asked for a look: until that look (unbounded when none was
// asked for). A busy projector needs no bound: it turns its loop every
// BusySleep and looks when the time comes, and a shorter sleep there
// would find claims empty, record it idle and make writers notify.
func (r *releaser) wakeBound(now time.Time) time.Duration {
	if !r.woke {
		return time.Duration(1<<63 - 1)
	}
	return max(r.next.Sub(now), 0)
}
