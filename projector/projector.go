package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/tracing"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

var (
	// ErrInvalidConfig is returned by New for a bad configuration; the
	// message names every bad field.
	ErrInvalidConfig = errors.New("projector: invalid config")
	// ErrPublishTimeout is recorded for a publish that did not return
	// within Config.PublishTimeout.
	ErrPublishTimeout = errors.New("projector: publish timed out")
)

// OutboxProjector relays outbox rows to a message bus. Create it with New;
// it is safe for concurrent use, and several may run against one database.
type OutboxProjector struct {
	store   *outbox.Store
	pub     message.Publisher
	txPub   TxPublisher // pub, when it publishes in the store's transactions
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	notify  bool
	tracing tracing.Tracing
	system  string // messaging.system of pub, "" when unknown

	sem  chan struct{} // publishes in flight
	wake chan struct{}

	runMu   sync.Mutex
	running bool
}

// New returns a projector that relays the rows of store through pub. cfg
// may be nil: nil and zero fields mean the defaults. When pub is a
// [TxPublisher] on store's database (a dbbus.Bus on the same *gorm.DB),
// the projector publishes each batch in the transaction that marks it
// sent, exactly once.
//
// Errors: ErrInvalidConfig (naming each bad field), or an error registering
// metrics.
func New(store *outbox.Store, pub message.Publisher, cfg *Config) (*OutboxProjector, error) {
	c, err := cfg.validate()
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if store == nil {
		errs = append(errs, fmt.Errorf("%w: nil outbox store", ErrInvalidConfig))
	}
	if pub == nil {
		errs = append(errs, fmt.Errorf("%w: nil publisher", ErrInvalidConfig))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	m, err := newMetrics(c.Registerer, store, c.Tenant)
	if err != nil {
		return nil, fmt.Errorf("projector: metrics: %w", err)
	}
	d, _ := dialect.Of(store.DB())
	return &OutboxProjector{
		store:   store,
		pub:     pub,
		txPub:   txPublisherOn(pub, store.DB()),
		cfg:     c,
		log:     c.Logger.With("component", "bento.projector", "worker", c.WorkerID),
		metrics: m,
		notify:  d == dialect.Postgres && !c.DisableNotify,
		tracing: tracing.New(c.TracerProvider, c.Propagator),
		system:  messagingSystem(pub),
		sem:     make(chan struct{}, c.Concurrency),
		wake:    make(chan struct{}, 1),
	}, nil
}

// WorkerID returns the id the projector leases rows under.
func (p *OutboxProjector) WorkerID() string { return p.cfg.WorkerID }

// Config returns the configuration with defaults filled in.
func (p *OutboxProjector) Config() Config { return p.cfg }

// Wake makes a running projector claim at once instead of finishing its
// sleep. It never blocks.
func (p *OutboxProjector) Wake() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Result counts what a Drain (or one batch) did.
type Result struct {
	// Claimed rows, Published (confirmed) ones, Failed attempts (including
	// the ones that went Dead), and Released rows that were not tried.
	Claimed, Published, Failed, Dead, Released int
}

func (r *Result) add(o Result) {
	r.Claimed += o.Claimed
	r.Published += o.Published
	r.Failed += o.Failed
	r.Dead += o.Dead
	r.Released += o.Released
}

// Drain relays everything that is due, scheduled messages that fell due
// included, and returns once a claim comes back empty: rows waiting for a retry later are left for later. It is meant for
// tests, scripts and benchmarks; Run is the long-running form.
func (p *OutboxProjector) Drain(ctx context.Context) (Result, error) {
	var total Result
	for {
		if _, err := p.store.ReleaseDue(ctx, outbox.ReleaseOpts{Tenant: p.cfg.Tenant, Limit: p.cfg.BatchSize}); err != nil {
			return total, err
		}
		r, _, err := p.batch(ctx, nil)
		total.add(r)
		if err != nil {
			return total, err
		}
		if r.Claimed == 0 {
			return total, nil
		}
	}
}

// ErrRunning is returned by Run when the projector is already running.
var ErrRunning = errors.New("projector: already running")

// Run relays the outbox until ctx is done: it claims a batch, publishes it,
// records the outcome, and sleeps BusySleep after a partial batch or
// IdleSleep when nothing was due (a notification or Wake ends the sleep).
// It stays recorded busy, so that commits need not notify it, until a claim
// finds nothing. On PostgreSQL it listens for commits, and for a moment
// after going idle it claims sooner than IdleSleep, until the writers that
// may have seen it busy (and so will not notify) have ended; it never waits
// for them. When ctx ends, Run waits for the publishes in flight, records
// them, releases what it did not try, and returns nil. Database errors are
// logged and retried with backoff; they do not stop Run.
func (p *OutboxProjector) Run(ctx context.Context) error {
	p.runMu.Lock()
	if p.running {
		p.runMu.Unlock()
		return ErrRunning
	}
	p.running = true
	p.runMu.Unlock()
	defer p.metrics.runs()()
	defer func() {
		p.runMu.Lock()
		p.running = false
		p.runMu.Unlock()
	}()

	var wg sync.WaitGroup
	if p.notify {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.listen(ctx)
		}()
	}
	defer wg.Wait()

	rs := p.registerRelay(ctx)
	defer rs.remove(ctx)

	p.log.Info("projector started", "batch", p.cfg.BatchSize, "concurrency", p.cfg.Concurrency,
		"tenant", p.cfg.Tenant, "notify", p.notify)
	errDelay := p.cfg.BusySleep
	rel := &releaser{p: p}
	for ctx.Err() == nil {
		due, leased := rel.run(ctx)
		r, more, err := p.batch(ctx, leased)
		var sleep time.Duration
		switch {
		case err != nil && ctx.Err() == nil:
			p.log.Error("relay batch failed", "err", err)
			errDelay = min(max(2*errDelay, 50*time.Millisecond), p.cfg.IdleSleep)
			sleep = errDelay
		case r.Claimed == p.cfg.BatchSize || more:
			// Working through a backlog, or settling the batch made later
			// events of its aggregates due: claim again at once. Writers
			// need not notify meanwhile.
			errDelay = p.cfg.BusySleep
			rs.busy(ctx)
			continue
		case r.Claimed > 0:
			// Events are flowing: stay recorded busy, so writers do not
			// notify (a notification serializes their commits), and claim
			// again after BusySleep (or at once on Wake). Only an empty
			// claim makes the projector idle.
			errDelay = p.cfg.BusySleep
			rs.busy(ctx)
			if p.sleep(ctx, min(p.cfg.BusySleep, due), p.wake) {
				rel.woken()
			}
			continue
		default:
			sleep = p.cfg.IdleSleep
		}
		claim, within := rs.idle(ctx)
		if claim {
			rel.woken() // and release what they scheduled
			continue    // settled: claim once more what busy-time writers did not announce
		}
		if p.sleep(ctx, min(sleep, within, due, rel.wakeBound(time.Now())), p.wake) {
			rel.woken()
		}
	}
	p.log.Info("projector stopped")
	return nil
}

// relayState is the projector's row in bento_outbox_relays, which tells
// writers whether a notification is wanted, and the handshake of going idle
// (see outbox.Store.SetRelayIdle and outbox.Store.WritersOpen).
//
// Going idle never waits for a writer. The projector commits its row as
// idle, from when on new writers notify, and is then unsettled: writers
// that read it busy may still be open, and their events will not notify.
// While unsettled it asks WritersOpen (which never makes writers wait) and
// claims again after firstWritersCheck, doubling the wait up to IdleSleep,
// until the answer is no; then it claims once more and is settled: from
// then on every event committed after its last claim notifies, and it
// sleeps IdleSleep between polls. Notifications still wake it meanwhile. A
// writer that stays open holds up no one: its own events, if they did not
// notify, are claimed at most about as long after its commit as it stayed
// open after the projector went idle, and never more than IdleSleep after.
type relayState struct {
	p       *OutboxProjector
	enabled bool // listening on PostgreSQL, and the row could be written
	recIdle bool // the state recorded
	settled bool // recIdle, and no writer that may have read the projector busy is open
	// While idle and unsettled: when to ask WritersOpen next, and the wait
	// after that if the answer is still yes.
	checkAt   time.Time
	nextCheck time.Duration
}

// registerRelay records the projector as idle before its first claim, so
// every commit from then on notifies until it is busy.
func (p *OutboxProjector) registerRelay(ctx context.Context) *relayState {
	rs := &relayState{p: p}
	if !p.notify {
		return rs
	}
	if err := p.store.SetRelayIdle(ctx, p.cfg.WorkerID, true); err != nil {
		p.log.Warn("cannot record the projector as idle; commits may not wake it (is outbox migration 004 applied?)",
			"err", err)
		return rs
	}
	rs.enabled = true
	rs.wentIdle()
	return rs
}

// firstWritersCheck is the wait before asking WritersOpen again after its
// first yes. Writers' transactions usually last milliseconds, and the waits
// double, so a long writer costs a few cheap statements, not a poll.
const firstWritersCheck = time.Millisecond

// wentIdle starts the wait for the writers that may have read the
// projector as busy.
func (rs *relayState) wentIdle() {
	rs.recIdle, rs.settled = true, false
	rs.checkAt, rs.nextCheck = time.Time{}, min(firstWritersCheck, rs.p.cfg.IdleSleep)
}

// busy records the projector as busy, if it was idle.
func (rs *relayState) busy(ctx context.Context) {
	if !rs.enabled || !rs.recIdle || ctx.Err() != nil {
		return
	}
	if err := rs.p.store.SetRelayIdle(ctx, rs.p.cfg.WorkerID, false); err != nil {
		rs.p.log.Warn("cannot record the projector's state", "idle", false, "err", err)
		return
	}
	rs.recIdle, rs.settled = false, false
}

// idle is called after a claim that was not full. It records the projector
// as idle if it was busy and advances the handshake. It reports claim when
// the projector just settled and must claim once more at once; otherwise
// the projector may sleep at most within before it calls idle again.
func (rs *relayState) idle(ctx context.Context) (claim bool, within time.Duration) {
	const forever = time.Duration(math.MaxInt64)
	if !rs.enabled || ctx.Err() != nil {
		return false, forever
	}
	if !rs.recIdle {
		if err := rs.p.store.SetRelayIdle(ctx, rs.p.cfg.WorkerID, true); err != nil {
			rs.p.log.Warn("cannot record the projector's state", "idle", true, "err", err)
			return false, forever // still recorded busy: writers do not count on a notification
		}
		rs.wentIdle()
	}
	if rs.settled {
		return false, forever
	}
	if now := time.Now(); now.Before(rs.checkAt) {
		return false, rs.checkAt.Sub(now)
	}
	open, err := rs.p.store.WritersOpen(ctx)
	if err == nil && !open {
		rs.settled = true
		return true, 0
	}
	if err != nil && ctx.Err() == nil {
		rs.p.log.Warn("cannot check for open outbox writers", "err", err)
	}
	d := rs.nextCheck
	rs.nextCheck = min(2*d, rs.p.cfg.IdleSleep)
	rs.checkAt = time.Now().Add(d)
	return false, d
}

// remove deletes the projector's row when Run ends.
func (rs *relayState) remove(ctx context.Context) {
	if !rs.enabled {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if err := rs.p.store.RemoveRelay(rctx, rs.p.cfg.WorkerID); err != nil {
		rs.p.log.Warn("cannot remove the projector's relay row", "err", err)
	}
}

// sleep waits for d, ctx, or a signal on wake (nil: none).
func (p *OutboxProjector) sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) (woken bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-wake:
		return true
	case <-t.C:
	}
	return false
}

// settleTimeout bounds the database calls that record outcomes, which run
// even after the projector's context ended.
const settleTimeout = 10 * time.Second

// batch claims, publishes and settles one batch. It tries to record every
// outcome even when recording one fails, the confirmed publishes first (a
// row left leased after its publish was confirmed would be published again
// when the lease ends), and returns the errors joined. more reports that a
// claimed row had a later event of its aggregate waiting behind it, which
// settling the batch made due.
//
// The claim is not cancelled with ctx (it is bounded by settleTimeout): a
// claim cancelled after the server committed it, before its answer was
// read, would leave its rows leased to a stopped projector for the whole
// lease, and then count a failed attempt against each. What it claims
// after ctx ended is published or released as untried.
//
// leased are rows already leased to the projector (scheduled messages its
// releaser released to it): the batch publishes them with what it claims,
// claiming only what room they leave, and settles them the same way.
func (p *OutboxProjector) batch(ctx context.Context, leased []*outbox.Message) (r Result, more bool, err error) {
	rows := leased
	budget := max(p.cfg.MaxBatchBytes, 0) // negative: no bound
	for _, row := range leased {
		budget -= int64(row.SizeBytes)
	}
	var claimErr error
	if err := ctx.Err(); err != nil {
		claimErr = err
	} else if len(rows) < p.cfg.BatchSize && (len(rows) == 0 || p.cfg.MaxBatchBytes < 0 || budget > 0) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		defer cancel()
		claimed, err := p.store.Claim(cctx, outbox.ClaimOpts{
			Worker: p.cfg.WorkerID, Limit: p.cfg.BatchSize - len(rows), Lease: p.cfg.Lease, Tenant: p.cfg.Tenant,
			MaxBytes: max(budget, 0),
		})
		claimErr = err
		rows = append(rows, claimed...)
	}
	r.Claimed = len(rows)
	if len(rows) == 0 {
		return r, false, claimErr
	}
	outcomes := p.publish(ctx, rows)

	// Record outcomes even if ctx ended meanwhile: the publishes happened.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	var (
		sent, untried []string
		failed        []int
		errs          []error
	)
	now := p.now()
	for i, row := range rows {
		switch err := outcomes[i]; {
		case err == nil:
			sent = append(sent, row.ID)
			more = more || row.NextWaits
			p.metrics.sent(row.Topic, row.OccurredAt, now)
		case errors.Is(err, errNotTried):
			untried = append(untried, row.ID)
		default:
			failed = append(failed, i)
		}
	}
	if len(sent) > 0 && p.txPub != nil {
		r.Published = len(sent) // marked in the transaction that published them
	} else if len(sent) > 0 {
		settle := p.store.MarkSent
		if p.cfg.DeleteOnSuccess {
			settle = p.store.DeleteSent
		}
		n, err := settle(sctx, p.cfg.WorkerID, sent)
		if err != nil {
			errs = append(errs, fmt.Errorf("projector: record %d sent events: %w", len(sent), err))
		} else {
			r.Published = len(sent)
			if int(n) != len(sent) {
				p.log.Warn("lease lost before marking sent; another projector owns the rows",
					"published", len(sent), "marked", n)
			}
		}
	}
	for _, i := range failed {
		dead, err := p.fail(sctx, rows[i], outcomes[i])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.Failed++
		if dead {
			r.Dead++
		}
	}
	if len(untried) > 0 {
		if _, err := p.store.Release(sctx, p.cfg.WorkerID, untried); err != nil {
			errs = append(errs, fmt.Errorf("projector: release %d untried events: %w", len(untried), err))
		} else {
			r.Released = len(untried)
		}
	}
	return r, more, errors.Join(append(errs, claimErr)...)
}

var errNotTried = errors.New("not tried")

// BatchPublisher is implemented by publishers that can publish a batch of
// messages of any topics without a broker round trip per message, reporting
// each message's outcome (such as rabbitmq.ConfirmPublisher). The projector
// hands such a publisher each claimed batch in one call; other publishers
// get concurrent Publish calls, at most Concurrency at a time.
type BatchPublisher interface {
	PublishBatch(ctx context.Context, batch []messaging.Outgoing) []error
}

// publishBatch publishes rows through a BatchPublisher in one call, bounded
// by PublishTimeout. The call finishes even when ctx ends meanwhile, so the
// outcomes it reports are of publishes that really happened.
func (p *OutboxProjector) publishBatch(ctx context.Context, bp BatchPublisher, rows []*outbox.Message) []error {
	outcomes := make([]error, len(rows))
	batch := make([]messaging.Outgoing, 0, len(rows))
	index := make([]int, 0, len(rows))
	for i, row := range rows {
		msg, err := messaging.NewMessage(row)
		if err != nil {
			outcomes[i] = err
			continue
		}
		batch = append(batch, messaging.Outgoing{Topic: row.Topic, Message: msg})
		index = append(index, i)
	}
	if ctx.Err() != nil {
		for _, i := range index {
			outcomes[i] = errNotTried
		}
		return outcomes
	}
	spans := make([]trace.Span, len(batch))
	for j, i := range index {
		spans[j] = p.startPublish(ctx, rows[i], batch[j].Message)
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.PublishTimeout)
	defer cancel()
	errs := bp.PublishBatch(pctx, batch)
	for j, i := range index {
		if j < len(errs) {
			outcomes[i] = errs[j]
		} else {
			outcomes[i] = fmt.Errorf("projector: publisher reported %d outcomes for %d messages", len(errs), len(batch))
		}
		tracing.End(spans[j], outcomes[i])
	}
	return outcomes
}

// publish sends every row, at most Concurrency at a time, and returns each
// row's outcome: nil, an error, ErrPublishTimeout, or errNotTried for rows
// it did not start because ctx ended or the deadline passed first. Through
// a TxPublisher, nil also means that the row is marked sent (publishTx).
func (p *OutboxProjector) publish(ctx context.Context, rows []*outbox.Message) []error {
	if p.txPub != nil {
		return p.publishTx(ctx, rows)
	}
	if bp, ok := p.pub.(BatchPublisher); ok {
		return p.publishBatch(ctx, bp, rows)
	}
	outcomes := make([]error, len(rows))
	type done struct {
		i   int
		err error
	}
	results := make(chan done, len(rows))
	deadline := time.NewTimer(p.cfg.PublishTimeout)
	defer deadline.Stop()
	started := 0
	pending := map[int]bool{}
start:
	for i, row := range rows {
		msg, err := messaging.NewMessage(row)
		if err != nil {
			outcomes[i] = err
			continue
		}
		select {
		case p.sem <- struct{}{}:
		case <-ctx.Done():
			for j := i; j < len(rows); j++ {
				if outcomes[j] == nil {
					outcomes[j] = errNotTried
				}
			}
			break start
		case <-deadline.C:
			for j := i; j < len(rows); j++ {
				if outcomes[j] == nil {
					outcomes[j] = errNotTried
				}
			}
			deadline.Reset(0)
			break start
		}
		started++
		pending[i] = true
		span := p.startPublish(ctx, row, msg)
		go func(i int, topic string, msg *message.Message) {
			defer func() { <-p.sem }()
			err := p.pub.Publish(topic, msg)
			tracing.End(span, err)
			results <- done{i, err}
		}(i, row.Topic, msg)
	}
	for len(pending) > 0 {
		select {
		case d := <-results:
			outcomes[d.i] = d.err
			delete(pending, d.i)
		case <-deadline.C:
			for i := range pending {
				outcomes[i] = fmt.Errorf("%w after %v", ErrPublishTimeout, p.cfg.PublishTimeout)
			}
			return outcomes
		}
	}
	return outcomes
}

// unpublishable reports whether err says the event can never be published
// as it is stored (its headers exceed the broker's frame, its topic is not a
// valid routing key), so retrying it only wastes attempts: it goes dead at
// once, its error kept, for an operator to discard or fix and requeue.
func unpublishable(err error) bool {
	return errors.Is(err, messaging.ErrMessageTooLarge) || errors.Is(err, messaging.ErrInvalidName)
}

// fail records a failed attempt and reports whether the row went dead.
func (p *OutboxProjector) fail(ctx context.Context, row *outbox.Message, cause error) (bool, error) {
	attempts := row.Attempts + 1
	dead := attempts >= p.cfg.MaxAttempts || unpublishable(cause)
	delay := p.backoff(attempts)
	if _, err := p.store.MarkFailed(ctx, p.cfg.WorkerID, outbox.Failure{
		ID: row.ID, Err: cause, RetryAfter: delay, Dead: dead,
	}); err != nil {
		return false, fmt.Errorf("projector: record failure of %s: %w", row.ID, err)
	}
	p.metrics.failure(row.Topic, dead)
	attrs := []any{"event_id", row.ID, "topic", row.Topic, "tenant", row.TenantID,
		"aggregate_id", row.AggregateID, "attempts", attempts, "err", cause}
	if dead {
		p.log.Error("event is dead after its last attempt", attrs...)
	} else {
		p.log.Warn("publish failed; will retry", append(attrs, "retry_in", delay)...)
	}
	return dead, nil
}

// now reads the store's Clock, for the latency metrics only: leases and
// retry times are the database's.
func (p *OutboxProjector) now() time.Time { return p.store.Config().Clock.Now() }

// backoff returns the delay before attempt+1: BackoffFloor doubled per
// attempt, capped at BackoffCeiling, jittered to [d/2, d].
func (p *OutboxProjector) backoff(attempts int) time.Duration {
	d := p.cfg.BackoffFloor
	for i := 1; i < attempts && d < p.cfg.BackoffCeiling; i++ {
		d *= 2
	}
	d = min(d, p.cfg.BackoffCeiling)
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(d-half)+1))
}
