package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/rabbitmq"
	"github.com/bentoevents/bento/uow"
)

// steadyConfig sizes the steady scenario.
type steadyConfig struct {
	Rates    []float64     `json:"rates"`
	Duration time.Duration `json:"duration_ns"`
	// Warmup is run at the same rate before Duration; its events are not
	// counted.
	Warmup  time.Duration `json:"warmup_ns"`
	Writers int           `json:"writers"`
	// Accounts are the aggregates the events change, dealt out to the
	// writers, each of which takes its own in turn (per-aggregate order
	// lets one claim take at most one event of each account).
	Accounts int           `json:"accounts"`
	Idle     time.Duration `json:"idle_ns"`
	// PeerPolls are the poll intervals Watermill's forwarder is run with,
	// at the rates up to PeerMaxRate.
	PeerPolls   []time.Duration `json:"peer_polls_ns"`
	PeerMaxRate float64         `json:"peer_max_rate"`
	// NoNotify disables the outbox's NOTIFY trigger: an experiment that
	// shows what the wake-up costs the writers (the projector then finds
	// commits by polling every BusySleep or IdleSleep).
	NoNotify bool `json:"no_notify,omitempty"`
}

// steadyTick is how often the schedule hands out the events that came due.
const steadyTick = time.Millisecond

// refPrefix starts the Reference of every steady event; the sequence
// number follows.
const refPrefix = "seq-"

func seqRef(seq int) string { return refPrefix + strconv.Itoa(seq) }

// parseSeq reads the sequence number back from an event's JSON payload.
func parseSeq(payload []byte) (int, error) {
	var p struct {
		Reference string `json:"reference"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		return 0, err
	}
	s, ok := strings.CutPrefix(p.Reference, refPrefix)
	if !ok {
		return 0, fmt.Errorf("reference %q is not %s<n>", p.Reference, refPrefix)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("reference %q is not %s<n>", p.Reference, refPrefix)
	}
	return n, nil
}

// tracker records, per scheduled event, when (since t0, on the monotonic
// clock) its commit started, when Commit returned and when the consumer
// received it. Zero means never.
type tracker struct {
	t0                      time.Time
	started, commit, recv   []atomic.Int64
	received, dup, unknowns atomic.Int64
}

func newTracker(n int) *tracker {
	return &tracker{t0: time.Now(), started: make([]atomic.Int64, n), commit: make([]atomic.Int64, n),
		recv: make([]atomic.Int64, n)}
}

func (t *tracker) now() int64 { return int64(time.Since(t.t0)) }

// receive records a receipt of seq; later receipts of it are duplicates.
func (t *tracker) receive(seq int, at int64) {
	if seq < 0 || seq >= len(t.recv) {
		t.unknowns.Add(1)
		return
	}
	if t.recv[seq].CompareAndSwap(0, at) {
		t.received.Add(1)
	} else {
		t.dup.Add(1)
	}
}

// steadyRun is one relay at one rate in one run.
type steadyRun struct {
	Rate      float64 `json:"offered_per_second"`
	Scheduled int     `json:"scheduled"`
	Committed int     `json:"committed"`
	Received  int     `json:"received"`
	// Achieved is the measured events committed per second of the
	// measured window (from its start until the last of them committed).
	Achieved float64 `json:"achieved_per_second"`
	// Latency is commit-return to receipt; Commit is the commit call
	// itself; Lag is how late commits started after their due time.
	Latency  latencies `json:"latency"`
	Commit   latencies `json:"commit"`
	Lag      latencies `json:"schedule_lag"`
	Negative int       `json:"received_before_commit_returned,omitempty"`
	Dups     int64     `json:"duplicate_receipts,omitempty"`
	Unknown  int64     `json:"unknown_receipts,omitempty"`
	// Relay is where bento's projector spent its time (warm-up included).
	Relay *relayPhases `json:"relay_phases,omitempty"`
	// Stalled is set when events committed in the window were not received
	// in time: what held them back.
	Stalled *stall `json:"stalled,omitempty"`
}

// stall is what a run found when some of its committed events were not
// received: the transactions of the cluster that were open (with a
// transaction id) since before the run and still are. A relay that reads
// only below the oldest open transaction, such as watermill-sql's
// subscriber, receives nothing committed after such a transaction began
// until it ends.
type stall struct {
	Missing int `json:"missing"`
	// OpenTransactions counts them; OldestSeconds is the age of the
	// oldest.
	OpenTransactions int     `json:"open_transactions"`
	OldestSeconds    float64 `json:"oldest_open_seconds"`
}

// String describes s for the run's report line.
func (s *stall) String() string {
	if s.OpenTransactions == 0 {
		return fmt.Sprintf("STALLED: %d events not received, no transaction open since before the run", s.Missing)
	}
	return fmt.Sprintf("STALLED: %d events not received, behind %d transaction(s) open since before the run (oldest %.0f s)",
		s.Missing, s.OpenTransactions, s.OldestSeconds)
}

// openSince returns the stall of a run that started at t0 and missed
// missing events.
func openSince(ctx context.Context, db *gorm.DB, t0 time.Time, missing int) (*stall, error) {
	s := &stall{Missing: missing}
	err := db.WithContext(ctx).Raw(`SELECT count(*), coalesce(extract(epoch FROM now() - min(xact_start)), 0)
		FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND xact_start < ?`, t0).
		Row().Scan(&s.OpenTransactions, &s.OldestSeconds)
	return s, err
}

// summarizeTracker turns a tracker into a steadyRun over the measured
// window [from, to) (offsets from t.t0): the events whose commit started
// in it. Events due in it that no writer started (the writers fell behind
// and stopped at the end of the schedule) count as scheduled, not
// committed.
func summarizeTracker(t *tracker, rate float64, start, from, to time.Duration) steadyRun {
	r := steadyRun{Rate: rate, Dups: t.dup.Load(), Unknown: t.unknowns.Load()}
	var lat, commit, lag []time.Duration
	last := to
	for i := range t.commit {
		due := start + time.Duration(float64(i)/rate*float64(time.Second))
		if due >= from && due < to {
			r.Scheduled++
		}
		s, c := time.Duration(t.started[i].Load()), time.Duration(t.commit[i].Load())
		if s < from || c == 0 {
			continue
		}
		r.Committed++
		last = max(last, c)
		commit = append(commit, c-s)
		lag = append(lag, s-due)
		if rv := time.Duration(t.recv[i].Load()); rv != 0 {
			r.Received++
			lat = append(lat, rv-c)
			if rv < c {
				r.Negative++
			}
		}
	}
	r.Latency, r.Commit, r.Lag = summarize(lat), summarize(commit), summarize(lag)
	r.Achieved = float64(r.Committed) / (last - from).Seconds()
	return r
}

// commitFunc commits event seq, changing account a, and returns once the
// commit returned.
type commitFunc func(ctx context.Context, a *Account, seq int) error

// offer runs one goroutine per element of accounts, each changing its own
// accounts in turn, committing the events of an open-loop schedule at rate
// for d. It returns the schedule's start (since tr.t0) once every writer
// has stopped: at the end of the schedule, leaving what they did not
// start by then.
func offer(ctx context.Context, tr *tracker, rate float64, d time.Duration, accounts [][]*Account, commit commitFunc) (time.Duration, error) {
	p := &pacer{rate: rate, total: len(tr.commit)}
	jobs := make(chan job, p.total)
	start := time.Now()
	startOff := start.Sub(tr.t0)
	stopAt := start.Add(d)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go schedule(ctx, p, start, steadyTick, jobs)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, mine := range accounts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				j, ok := <-jobs
				if !ok {
					return
				}
				a := mine[k%len(mine)]
				if time.Now().After(stopAt) {
					return
				}
				tr.started[j.seq].Store(tr.now())
				if err := commit(ctx, a, j.seq); err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("event %d: %w", j.seq, err))
						mu.Unlock()
					}
					cancel()
					return
				}
				tr.commit[j.seq].Store(tr.now())
			}
		}()
	}
	wg.Wait()
	return startOff, errors.Join(errs...)
}

// waitReceived waits until the consumer has received want events, or
// timeout passes (then it returns without error; the run reports what
// arrived).
func waitReceived(ctx context.Context, tr *tracker, want int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for int(tr.received.Load()) < want && time.Now().Before(deadline) && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// consumeQueue consumes queue with amqp091 directly (manual acks, 2,000
// unacked ahead), handing each delivery to handle and then acking it,
// until the returned stop is called.
func consumeQueue(e *env, queue string, handle func(amqp.Delivery)) (stop func(), err error) {
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		return nil, fmt.Errorf("dial AMQP: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Qos(2000, 0, false)
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(queue, "", false, false, false, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("consume %s: %w", queue, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			handle(d)
			_ = d.Ack(false)
		}
	}()
	return func() { _ = conn.Close(); <-done }, nil
}

// startReceiver consumes queue into tr, recording each message's receipt.
func startReceiver(e *env, queue string, tr *tracker) (stop func(), err error) {
	return consumeQueue(e, queue, func(d amqp.Delivery) {
		at := tr.now()
		seq, err := parseSeq(d.Body)
		if err != nil {
			tr.unknowns.Add(1)
			return
		}
		tr.receive(seq, at)
	})
}

// newAccounts creates n accounts named prefix-<i> in one unit of work and
// deals them out to writers (at least one each).
func newAccounts(ctx context.Context, units *uow.Manager, prefix string, n, writers int) ([][]*Account, error) {
	n = max(n, writers)
	accounts := make([]*Account, n)
	err := units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
		for i := range accounts {
			a := &Account{Owner: "ann"}
			a.ID = fmt.Sprintf("%s-%05d", prefix, i)
			accounts[i] = a
			if err := u.Add(a); err != nil {
				return err
			}
		}
		return nil
	})
	return deal(accounts, writers), err
}

// deal splits xs into n hands, dealing one at a time.
func deal[T any](xs []T, n int) [][]T {
	hands := make([][]T, n)
	for i, x := range xs {
		hands[i%n] = append(hands[i%n], x)
	}
	return hands
}

// steadyBed is the schema a steady run works in.
type steadyBed struct {
	e      *env
	schema *pgSchema
	db     *gorm.DB // the writers' pool
	units  *uow.Manager
	admin  *sql.DB
	// relay is the projector running in this process, which the writers'
	// units wake after each commit, as embedded.Open wires them.
	relay atomic.Pointer[projector.OutboxProjector]
	cfg   steadyConfig
}

func newSteadyBed(ctx context.Context, e *env, cfg steadyConfig) (b *steadyBed, err error) {
	s, err := e.newSchema(ctx)
	if err != nil {
		return nil, err
	}
	b = &steadyBed{e: e, schema: s, cfg: cfg}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	if b.db, err = s.gorm(cfg.Writers + 4); err != nil {
		return nil, err
	}
	if err := migrate(ctx, b.db); err != nil {
		return nil, err
	}
	wake := func(int) {
		if p := b.relay.Load(); p != nil {
			p.Wake()
		}
	}
	if b.units, err = uow.New(b.db, &uow.Config{AfterCommit: wake}); err != nil {
		return nil, err
	}
	if cfg.NoNotify {
		if err := b.db.WithContext(ctx).Exec("ALTER TABLE outbox_events DISABLE TRIGGER outbox_events_notify").Error; err != nil {
			return nil, err
		}
	}
	if b.admin, err = sql.Open("pgx", e.pgDSN); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *steadyBed) close() {
	if b.db != nil {
		closeGorm(b.db)
	}
	if b.admin != nil {
		_ = b.admin.Close()
	}
	if err := b.schema.drop(); err != nil {
		b.e.log.Warn("cleanup", "err", err)
	}
}

// reset empties the outbox and checkpoints, so each measurement starts
// alike.
func (b *steadyBed) reset(ctx context.Context) error {
	for _, q := range []string{emptyOutboxSQL, "CHECKPOINT"} {
		if err := b.db.WithContext(ctx).Exec(q).Error; err != nil {
			return err
		}
	}
	return nil
}

// bentoRelay is bento's projector as minishop runs it: DefaultConfig with
// the ConfirmPublisher, Run (LISTEN/NOTIFY wake-up) on its own pool, woken
// in-process by the writers' units after each commit.
type bentoRelay struct {
	proj   *projector.OutboxProjector
	pub    *rabbitmq.ConfirmPublisher
	db     *gorm.DB
	app    string
	timer  *phaseTimer
	bed    *steadyBed
	cancel context.CancelFunc
	done   chan error
}

func startBentoRelay(ctx context.Context, b *steadyBed, cfg *rabbitmq.Config) (*bentoRelay, error) {
	r := &bentoRelay{app: "bench-relay-" + randomHex(4), timer: &phaseTimer{}}
	var err error
	if r.db, err = b.schema.gormAs(r.app, 4); err != nil {
		return nil, err
	}
	store, err := outbox.NewStore(r.db.Session(&gorm.Session{Logger: r.timer}), nil)
	if err != nil {
		closeGorm(r.db)
		return nil, err
	}
	if r.pub, err = rabbitmq.NewConfirmPublisher(ctx, cfg); err != nil {
		closeGorm(r.db)
		return nil, err
	}
	pc := projector.DefaultConfig()
	pc.WorkerID = r.app
	pc.Logger = b.e.log
	if r.proj, err = projector.New(store, timedPublisher{r.pub, r.timer}, pc); err != nil {
		r.closeConns()
		return nil, err
	}
	ctx, r.cancel = context.WithCancel(ctx)
	r.done = make(chan error, 1)
	go func() { r.done <- r.proj.Run(ctx) }()
	b.relay.Store(r.proj)
	r.bed = b
	// Wait until its LISTEN connection is up, so no commit goes unnoticed.
	if err := waitListening(ctx, b, r.proj.ApplicationName()); err != nil {
		r.stop()
		return nil, err
	}
	return r, nil
}

// appNames are the application_names of the relay's PostgreSQL backends.
func (r *bentoRelay) appNames() []string { return []string{r.app, r.proj.ApplicationName()} }

func (r *bentoRelay) stop() error {
	r.bed.relay.Store(nil)
	r.cancel()
	err := <-r.done
	r.closeConns()
	return err
}

func (r *bentoRelay) closeConns() {
	_ = r.pub.Close()
	closeGorm(r.db)
}

// phaseTimer is a GORM logger that times the projector's claim and
// mark-sent statements; with timedPublisher it shows where a relay's time
// goes.
type phaseTimer struct {
	mu           sync.Mutex
	claim, mark  []time.Duration
	release      []time.Duration // ReleaseDue's statement (scheduled messages)
	nextDue      []time.Duration // and its look-up of the next due time after it
	claimedRows  int64
	publish      []time.Duration
	publishedMsg int64
}

// LogMode implements logger.Interface.
func (t *phaseTimer) LogMode(logger.LogLevel) logger.Interface { return t }

// Info implements logger.Interface.
func (*phaseTimer) Info(context.Context, string, ...any) {}

// Warn implements logger.Interface.
func (*phaseTimer) Warn(context.Context, string, ...any) {}

// Error implements logger.Interface.
func (*phaseTimer) Error(context.Context, string, ...any) {}

// Trace implements logger.Interface: it times claims and marks.
func (t *phaseTimer) Trace(_ context.Context, begin time.Time, fc func() (string, int64), _ error) {
	d := time.Since(begin)
	q, rows := fc()
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case strings.HasPrefix(q, "WITH cand AS"):
		t.claim = append(t.claim, d)
		t.claimedRows += rows
	case strings.HasPrefix(q, "UPDATE outbox_events") && strings.Contains(q, "status = 'sent'"):
		t.mark = append(t.mark, d)
	case strings.HasPrefix(q, "WITH released AS"):
		t.release = append(t.release, d)
	case strings.HasPrefix(q, "SELECT EXTRACT(EPOCH FROM (s.due_at"):
		t.nextDue = append(t.nextDue, d)
	}
}

// claims returns how many claims ran.
func (t *phaseTimer) claims() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int64(len(t.claim))
}

// reset forgets what was timed so far.
func (t *phaseTimer) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.claim, t.mark, t.publish, t.claimedRows, t.publishedMsg = nil, nil, nil, 0, 0
	t.release, t.nextDue = nil, nil
}

// phases summarizes what was timed.
func (t *phaseTimer) phases() *relayPhases {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := &relayPhases{Claims: len(t.claim), Claim: summarize(t.claim), MarkSent: summarize(t.mark),
		Batches: len(t.publish), Publish: summarize(t.publish)}
	if len(t.publish) > 0 {
		p.RowsPerBatch = float64(t.publishedMsg) / float64(len(t.publish))
	}
	if len(t.release) > 0 {
		r := summarize(t.release)
		n := summarize(t.nextDue)
		p.Releases, p.Release, p.NextDue = len(t.release), &r, &n
	}
	return p
}

// relayPhases is where bento's projector spent its time during a
// measurement: each claim statement, each PublishBatch call (publish and
// wait for the broker's confirms) and each mark-sent statement.
type relayPhases struct {
	Claims       int       `json:"claims"`
	Batches      int       `json:"batches"`
	RowsPerBatch float64   `json:"rows_per_batch"`
	Claim        latencies `json:"claim"`
	Publish      latencies `json:"publish_and_confirm"`
	MarkSent     latencies `json:"mark_sent"`
	// Releases count outbox.Store.ReleaseDue's statements (scheduled
	// messages only), each timed in Release; RowsPerRelease is the
	// messages released over them, the empty ones included (the driver
	// does not report the rows of a statement read with Rows).
	Releases       int        `json:"releases,omitempty"`
	RowsPerRelease float64    `json:"rows_per_release,omitempty"`
	Release        *latencies `json:"release,omitempty"`
	NextDue        *latencies `json:"next_due,omitempty"`
}

// timedPublisher is a ConfirmPublisher whose PublishBatch calls are timed.
type timedPublisher struct {
	*rabbitmq.ConfirmPublisher
	t *phaseTimer
}

// PublishBatch implements projector.BatchPublisher.
func (p timedPublisher) PublishBatch(ctx context.Context, batch []messaging.Outgoing) []error {
	start := time.Now()
	errs := p.ConfirmPublisher.PublishBatch(ctx, batch)
	d := time.Since(start)
	p.t.mu.Lock()
	p.t.publish = append(p.t.publish, d)
	p.t.publishedMsg += int64(len(batch))
	p.t.mu.Unlock()
	return errs
}

// receiveFunc starts recording the receipts of events into tr and
// returns how to stop.
type receiveFunc func(tr *tracker) (stop func(), err error)

// fromQueue is a receiveFunc that consumes queue (startReceiver).
func fromQueue(e *env, queue string) receiveFunc {
	return func(tr *tracker) (func(), error) { return startReceiver(e, queue, tr) }
}

// measureRate offers rate events/s through commit while relay runs (it is
// already started and delivers where receive reads), and summarizes what
// was received.
func measureRate(ctx context.Context, b *steadyBed, receive receiveFunc, rate float64, prefix string, commit commitFunc) (steadyRun, error) {
	cfg := b.cfg
	total := int(rate * (cfg.Warmup + cfg.Duration).Seconds())
	tr := newTracker(total)
	stop, err := receive(tr)
	if err != nil {
		return steadyRun{}, err
	}
	defer stop()
	accounts, err := newAccounts(ctx, b.units, prefix, cfg.Accounts, cfg.Writers)
	if err != nil {
		return steadyRun{}, err
	}
	start, err := offer(ctx, tr, rate, cfg.Warmup+cfg.Duration, accounts, commit)
	if err != nil {
		return steadyRun{}, err
	}
	committed := 0
	for i := range tr.commit {
		if tr.commit[i].Load() != 0 {
			committed++
		}
	}
	waitReceived(ctx, tr, committed, 30*time.Second)
	r := summarizeTracker(tr, rate, start, start+cfg.Warmup, start+cfg.Warmup+cfg.Duration)
	if missing := r.Committed - r.Received; missing > 0 && ctx.Err() == nil {
		if r.Stalled, err = openSince(ctx, b.db, tr.t0, missing); err != nil {
			return r, fmt.Errorf("find what held back %d events: %w", missing, err)
		}
	}
	return r, ctx.Err()
}

// runSteadyBento measures bento at rate: units of work committing one
// event each, the projector relaying, the receiver consuming.
func runSteadyBento(ctx context.Context, b *steadyBed, rate float64) (steadyRun, error) {
	if err := b.reset(ctx); err != nil {
		return steadyRun{}, err
	}
	names := newAMQPNames()
	defer func() {
		if err := b.e.deleteTopology(names); err != nil {
			b.e.log.Warn("cleanup", "err", err)
		}
	}()
	cfg := &rabbitmq.Config{URL: b.e.amqpURL, Exchange: names.Exchange, Logger: b.e.log}
	if err := rabbitmq.DeclareQueue(ctx, cfg, names.Queue, topic); err != nil {
		return steadyRun{}, err
	}
	relay, err := startBentoRelay(ctx, b, cfg)
	if err != nil {
		return steadyRun{}, err
	}
	relay.timer.reset()
	r, err := measureRate(ctx, b, fromQueue(b.e, names.Queue), rate, "bento-"+randomHex(3), b.commitDeposit)
	r.Relay = relay.timer.phases()
	return r, errors.Join(err, relay.stop())
}

// commitDeposit commits event seq, one deposit to a, in a unit of work.
func (b *steadyBed) commitDeposit(ctx context.Context, a *Account, seq int) error {
	u, err := b.units.Begin(ctx, nil)
	if err != nil {
		return err
	}
	if err := u.Track(a); err != nil {
		_ = u.Rollback()
		return err
	}
	if err := a.DepositRef(1, seqRef(seq)); err != nil {
		_ = u.Rollback()
		return err
	}
	return u.Commit(ctx)
}

// idleBento measures the CPU an idle projector uses: started as in
// runSteadyBento, nothing committed, for cfg.Idle.
func idleBento(ctx context.Context, b *steadyBed) (IdleCPU, error) {
	names := newAMQPNames()
	defer func() {
		if err := b.e.deleteTopology(names); err != nil {
			b.e.log.Warn("cleanup", "err", err)
		}
	}()
	cfg := &rabbitmq.Config{URL: b.e.amqpURL, Exchange: names.Exchange, Logger: b.e.log}
	relay, err := startBentoRelay(ctx, b, cfg)
	if err != nil {
		return IdleCPU{}, err
	}
	idle, err := measureIdle(ctx, b, relay.appNames(), relay.timer.claims)
	idle.Key, idle.Label = "bento", "bento projector (NOTIFY, 2 s fallback poll)"
	return idle, errors.Join(err, relay.stop())
}

// measureIdle lets a started relay settle for a second, then measures the
// CPU of this process and of the backends named by apps for b.cfg.Idle.
// queries, when not nil, counts the relay's polls.
func measureIdle(ctx context.Context, b *steadyBed, apps []string, queries func() int64) (IdleCPU, error) {
	select { // settle: connections opened, first claim done
	case <-ctx.Done():
		return IdleCPU{}, ctx.Err()
	case <-time.After(time.Second):
	}
	var q0 int64
	if queries != nil {
		q0 = queries()
	}
	m, err := startCPU(ctx, b.admin, apps)
	if err != nil {
		return IdleCPU{}, err
	}
	select { // the measured window: nothing but the relay runs
	case <-ctx.Done():
		return IdleCPU{}, ctx.Err()
	case <-time.After(b.cfg.Idle):
	}
	wall, proc, backend, err := m.stop(ctx)
	if err != nil {
		return IdleCPU{}, err
	}
	idle := IdleCPU{Seconds: wall.Seconds(), ProcessPercent: proc, BackendPercent: backend}
	if queries != nil {
		idle.Queries = queries() - q0
	}
	return idle, nil
}

// steadyPoint is one relay at one rate in one run.
type steadyPoint struct {
	Key    string `json:"key"`
	Label  string `json:"label"`
	Family string `json:"family"` // "bento" or "peer"
	steadyRun
}

// steadyResult is one run of the steady scenario.
type steadyResult struct {
	Idle   []IdleCPU     `json:"idle"`
	Points []steadyPoint `json:"points"`
}

// runSteady runs the steady scenario once, in a fresh schema: the idle
// relays first (nothing else runs then), then each rate for bento's
// projector and, up to cfg.PeerMaxRate, for bento on the database bus
// without a broker and for Watermill's forwarder with each poll interval.
func runSteady(ctx context.Context, e *env, cfg steadyConfig, report func(string)) (steadyResult, error) {
	var res steadyResult
	b, err := newSteadyBed(ctx, e, cfg)
	if err != nil {
		return res, err
	}
	defer b.close()
	if cfg.Idle > 0 {
		idle, err := idleBento(ctx, b)
		if err != nil {
			return res, fmt.Errorf("idle bento: %w", err)
		}
		report(fmt.Sprintf("idle %-34s %5.2f%% of a core (its PostgreSQL backends %5.2f%%), %d claims in %.0f s",
			idle.Label, idle.ProcessPercent, idle.BackendPercent, idle.Queries, idle.Seconds))
		res.Idle = append(res.Idle, idle)
		for _, poll := range cfg.PeerPolls {
			idle, err := idlePeer(ctx, b, poll)
			if err != nil {
				return res, fmt.Errorf("idle peer: %w", err)
			}
			report(fmt.Sprintf("idle %-34s %5.2f%% of a core (its PostgreSQL backends %5.2f%%)",
				idle.Label, idle.ProcessPercent, idle.BackendPercent))
			res.Idle = append(res.Idle, idle)
		}
	}
	add := func(key, label, family string, r steadyRun) {
		res.Points = append(res.Points, steadyPoint{Key: key, Label: label, Family: family, steadyRun: r})
		report(fmt.Sprintf("%-40s %6s/s offered, %6s/s achieved (commit p50 %.1f ms): p50 %7.2f ms, p95 %7.2f ms, p99 %7.2f ms (%d/%d received)",
			label, thousands(r.Rate), thousands(r.Achieved), r.Commit.P50, r.Latency.P50, r.Latency.P95, r.Latency.P99, r.Received, r.Committed))
		if r.Stalled != nil {
			report("  " + r.Stalled.String())
		}
		if p := r.Relay; p != nil {
			report(fmt.Sprintf("  relay: %d batches of %.1f rows; claim p50 %.2f ms p99 %.2f ms, publish+confirm p50 %.2f ms p99 %.2f ms, mark sent p50 %.2f ms p99 %.2f ms",
				p.Batches, p.RowsPerBatch, p.Claim.P50, p.Claim.P99, p.Publish.P50, p.Publish.P99, p.MarkSent.P50, p.MarkSent.P99))
		}
	}
	for _, rate := range cfg.Rates {
		r, err := runSteadyBento(ctx, b, rate)
		if err != nil {
			return res, fmt.Errorf("bento at %v/s: %w", rate, err)
		}
		label := "bento projector, ConfirmPublisher"
		if cfg.NoNotify {
			label += ", NOTIFY trigger off"
		}
		add(steadyKey("bento", rate), label, "bento", r)
		if rate > cfg.PeerMaxRate {
			continue
		}
		r, err = runSteadyDatabase(ctx, b, rate)
		if err != nil {
			return res, fmt.Errorf("database bus at %v/s: %w", rate, err)
		}
		add(steadyKey("dbbus", rate), "bento, database bus, no broker", "dbbus", r)
		for _, poll := range cfg.PeerPolls {
			r, err := runSteadyPeer(ctx, b, rate, poll)
			if err != nil {
				return res, fmt.Errorf("peer (%v poll) at %v/s: %w", poll, rate, err)
			}
			add(steadyKey("watermill-forwarder-"+poll.String(), rate), fmt.Sprintf("Watermill forwarder, %v poll (peer)", poll), "peer", r)
		}
	}
	return res, nil
}

// steadyKey names a relay at a rate in the results, e.g. "bento@1000".
func steadyKey(relay string, rate float64) string {
	return relay + "@" + strconv.FormatFloat(rate, 'f', -1, 64)
}
