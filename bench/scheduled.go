package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/rabbitmq"
)

// scheduledConfig sizes the scheduled scenario.
type scheduledConfig struct {
	// Messages fall due evenly over Spread, the first Lead after their
	// scheduling starts (the scheduling must end before).
	Messages int           `json:"messages"`
	Spread   time.Duration `json:"spread_ns"`
	Lead     time.Duration `json:"lead_ns"`
	// Writers schedule the messages, in transactions of scheduleBatch.
	Writers int `json:"writers"`
	// PeerPoll is the bare poller's sleep after a poll that found nothing
	// due (0: no peer).
	PeerPoll time.Duration `json:"peer_poll_ns"`
	// CancelMessages are scheduled for the cancellation measurement (0:
	// none), due over CancelSpread; every other one is cancelled, at
	// CancelRate per second from Cancellers goroutines.
	CancelMessages int           `json:"cancel_messages"`
	CancelSpread   time.Duration `json:"cancel_spread_ns"`
	CancelRate     float64       `json:"cancel_rate"`
	Cancellers     int           `json:"cancellers"`
	// CancelAhead is how long before the first of them falls due the
	// cancels start; negative: after, so that the first cancels race the
	// release of their messages.
	CancelAhead time.Duration `json:"cancel_ahead_ns"`
	// CancelsPerTx is how many cancels one transaction makes (0 or 1:
	// each its own), as a handler that cancels several timeouts does.
	CancelsPerTx int `json:"cancels_per_tx,omitempty"`
	// CancelPeer measures the bare DELETE beside bento's cancels.
	CancelPeer bool `json:"cancel_peer,omitempty"`
}

// cancelsPerTx is CancelsPerTx, at least 1.
func (c scheduledConfig) cancelsPerTx() int { return max(c.CancelsPerTx, 1) }

func (c scheduledConfig) validate() error {
	var errs []error
	if c.Messages < 1 {
		errs = append(errs, fmt.Errorf("-scheduled-messages: %d, must be at least 1", c.Messages))
	}
	if c.Spread < 0 || c.Lead <= 0 || c.PeerPoll < 0 || c.CancelSpread < 0 {
		errs = append(errs, errors.New("-scheduled-lead must be positive; -scheduled-spread, -scheduled-peer-poll and -scheduled-cancel-spread must not be negative"))
	}
	if c.Writers < 1 || c.Cancellers < 1 {
		errs = append(errs, errors.New("-scheduled-writers and -scheduled-cancellers must be at least 1"))
	}
	if c.CancelMessages < 0 || c.CancelMessages > 0 && c.CancelRate <= 0 {
		errs = append(errs, errors.New("-scheduled-cancel-messages must not be negative, -scheduled-cancel-rate positive"))
	}
	if c.CancelsPerTx < 0 {
		errs = append(errs, fmt.Errorf("-scheduled-cancels-per-tx: %d, must not be negative", c.CancelsPerTx))
	}
	return errors.Join(errs...)
}

// scheduleBatch is how many messages one scheduling transaction writes.
const scheduleBatch = 200

// schedIdle is how long a measurement waits, after the last due time, for
// the next delivery before it gives up on the messages not yet received.
const schedIdle = 15 * time.Second

// scheduledTopic is the topic (and routing key) of the scheduled messages.
const scheduledTopic = "reminder.due"

// schedPayload is a scheduled message's payload: its sequence number.
type schedPayload struct {
	Seq int `json:"seq"`
}

// dueTime returns when message i of n falls due: evenly over spread from
// t0.
func dueTime(t0 time.Time, i, n int, spread time.Duration) time.Time {
	if n <= 1 {
		return t0
	}
	return t0.Add(time.Duration(float64(i) / float64(n-1) * float64(spread)))
}

// schedTracker counts the deliveries of each message and records how late
// after its due time (the due_at header) the first one arrived.
type schedTracker struct {
	n        int
	count    []atomic.Int32
	lag      []atomic.Int64 // ns after due, of the first delivery
	received atomic.Int64   // messages delivered at least once
	unknown  atomic.Int64   // deliveries without a sequence number or due time
}

func newSchedTracker(n int) *schedTracker {
	return &schedTracker{n: n, count: make([]atomic.Int32, n), lag: make([]atomic.Int64, n)}
}

// deliver records one delivery of body with the headers h, received at now.
func (t *schedTracker) deliver(body []byte, h amqp.Table, now time.Time) {
	var p schedPayload
	due, _ := h[messaging.MetaDueAt].(string)
	at, err := time.Parse(time.RFC3339Nano, due)
	if json.Unmarshal(body, &p) != nil || err != nil || p.Seq < 0 || p.Seq >= t.n {
		t.unknown.Add(1)
		return
	}
	if t.count[p.Seq].Add(1) == 1 {
		t.lag[p.Seq].Store(int64(now.Sub(at)))
		t.received.Add(1)
	}
}

// duplicates counts the deliveries beyond each message's first.
func (t *schedTracker) duplicates() int {
	d := 0
	for i := range t.count {
		d += max(int(t.count[i].Load())-1, 0)
	}
	return d
}

// startSchedReceiver consumes queue into t until the returned stop is
// called.
func startSchedReceiver(e *env, queue string, t *schedTracker) (stop func(), err error) {
	return consumeQueue(e, queue, func(d amqp.Delivery) { t.deliver(d.Body, d.Headers, time.Now()) })
}

// waitSched waits until want messages were delivered at least once, or
// until, after lastDue, idle passed without a new one (the relay stopped
// delivering), then settle longer for stray deliveries. A relay that falls
// behind is waited for as long as it makes progress, so that its lag
// covers every message rather than those that came in some deadline.
func waitSched(ctx context.Context, t *schedTracker, want int, lastDue time.Time, idle, settle time.Duration) {
	seen, progress := t.received.Load(), time.Now()
	for int(seen) < want && ctx.Err() == nil {
		now := time.Now()
		if n := t.received.Load(); n != seen {
			seen, progress = n, now
		}
		from := progress
		if lastDue.After(from) {
			from = lastDue
		}
		if now.Sub(from) > idle {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
	select {
	case <-ctx.Done():
	case <-time.After(settle):
	}
}

// schedRun is one relay's delivery of the scheduled messages in one run.
type schedRun struct {
	Key   string `json:"key"`
	Label string `json:"label"`
	// Scheduling is how long writing the messages took (bento: through
	// outbox.Store.Schedule; the peer: one COPY), and ScheduledPerSecond
	// its rate.
	SchedulingSeconds  float64 `json:"scheduling_seconds"`
	ScheduledPerSecond float64 `json:"scheduled_per_second"`
	Messages           int     `json:"messages"`
	Received           int     `json:"received"`
	Duplicates         int     `json:"duplicate_deliveries"`
	Unknown            int64   `json:"unknown_deliveries,omitempty"`
	// Lag is each message's first receipt minus its due_at header.
	Lag latencies `json:"lag"`
	// Early counts the messages received before their due time (negative
	// lag).
	Early int `json:"early,omitempty"`
	// Relay is where bento's projector spent its time.
	Relay *relayPhases `json:"relay_phases,omitempty"`
}

func (t *schedTracker) run(key, label string, sched time.Duration) schedRun {
	r := schedRun{Key: key, Label: label, SchedulingSeconds: sched.Seconds(), Messages: t.n,
		Received: int(t.received.Load()), Duplicates: t.duplicates(), Unknown: t.unknown.Load()}
	if sched > 0 {
		r.ScheduledPerSecond = float64(t.n) / sched.Seconds()
	}
	var lags []time.Duration
	for i := range t.count {
		if t.count[i].Load() > 0 {
			l := time.Duration(t.lag[i].Load())
			if l < 0 {
				r.Early++
			}
			lags = append(lags, l)
		}
	}
	r.Lag = summarize(lags)
	return r
}

// scheduleAll schedules n messages through store, message i due at due(i)
// with key key(i) (none when key is nil), from writers goroutines in
// transactions of scheduleBatch, in due order.
func scheduleAll(ctx context.Context, db *gorm.DB, store *outbox.Store, n, writers int, due func(int) time.Time, key func(int) string) error {
	jobs := make(chan int)
	go func() {
		defer close(jobs)
		for first := 0; first < n; first += scheduleBatch {
			select {
			case jobs <- first:
			case <-ctx.Done():
				return
			}
		}
	}()
	return runWorkers(writers, jobs, func(first int) error {
		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			for i := first; i < min(first+scheduleBatch, n); i++ {
				var opts *outbox.ScheduleOpts
				if key != nil {
					opts = &outbox.ScheduleOpts{Key: key(i)}
				}
				if _, err := store.Schedule(ctx, tx, scheduledTopic, schedPayload{Seq: i}, outbox.At(due(i)), opts); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// schedStage is what a measurement of bento's scheduled messages runs on:
// a fresh exchange and queue bound to scheduledTopic, a consumer of the
// queue counting into tr, bento's projector relaying to the exchange, and
// a store to schedule through.
type schedStage struct {
	b            *steadyBed
	names        amqpNames
	tr           *schedTracker
	stopReceiver func()
	relay        *bentoRelay
	store        *outbox.Store
}

// openSchedStage sets up a schedStage for n messages. Its relay is stopped
// by the measurement (relay.stop), the rest by close.
func openSchedStage(ctx context.Context, b *steadyBed, n int) (_ *schedStage, err error) {
	st := &schedStage{b: b, names: newAMQPNames(), tr: newSchedTracker(n)}
	defer func() {
		if err != nil {
			if st.relay != nil {
				err = errors.Join(err, st.relay.stop())
			}
			st.close()
		}
	}()
	rcfg := &rabbitmq.Config{URL: b.e.amqpURL, Exchange: st.names.Exchange, Logger: b.e.log}
	if err := rabbitmq.DeclareQueue(ctx, rcfg, st.names.Queue, scheduledTopic); err != nil {
		return nil, err
	}
	if st.stopReceiver, err = startSchedReceiver(b.e, st.names.Queue, st.tr); err != nil {
		return nil, err
	}
	if st.relay, err = startBentoRelay(ctx, b, rcfg); err != nil {
		return nil, err
	}
	if st.store, err = outbox.NewStore(b.db, nil); err != nil {
		return nil, err
	}
	return st, nil
}

// close stops the consumer and deletes the exchange and queue.
func (st *schedStage) close() {
	if st.stopReceiver != nil {
		st.stopReceiver()
	}
	if err := st.b.e.deleteTopology(st.names); err != nil {
		st.b.e.log.Warn("cleanup", "err", err)
	}
}

// schedBento schedules cfg.Messages through outbox.Store.Schedule while
// bento's projector runs (as minishop runs it), and measures how late
// after its due time each arrives at a consumer of RabbitMQ.
func schedBento(ctx context.Context, b *steadyBed, cfg scheduledConfig) (schedRun, error) {
	st, err := openSchedStage(ctx, b, cfg.Messages)
	if err != nil {
		return schedRun{}, err
	}
	tr, relay, store := st.tr, st.relay, st.store
	defer st.close()
	start := time.Now()
	t0 := start.Add(cfg.Lead)
	due := func(i int) time.Time { return dueTime(t0, i, cfg.Messages, cfg.Spread) }
	err = scheduleAll(ctx, b.db, store, cfg.Messages, cfg.Writers, due, nil)
	sched := time.Since(start)
	if err == nil && time.Now().After(t0) {
		err = fmt.Errorf("scheduling %d messages took %v, longer than the lead %v (raise -scheduled-lead)", cfg.Messages, sched.Round(time.Millisecond), cfg.Lead)
	}
	if err != nil {
		return schedRun{}, errors.Join(err, relay.stop())
	}
	waitSched(ctx, tr, cfg.Messages, t0.Add(cfg.Spread), schedIdle, 500*time.Millisecond)
	r := tr.run("bento", "bento projector, ConfirmPublisher", sched)
	r.Relay = relay.timer.phases()
	if r.Relay.Releases > 0 {
		r.Relay.RowsPerRelease = float64(r.Received) / float64(r.Relay.Releases)
	}
	return r, errors.Join(ctx.Err(), relay.stop())
}

// cancelRun is the cancellation measurement of one run.
type cancelRun struct {
	Messages int `json:"messages"`
	// Attempted cancels (every other message), at Offered per second;
	// Achieved is the cancels completed per second from the first's start
	// to the last's end.
	Attempted int     `json:"attempted"`
	Offered   float64 `json:"offered_per_second"`
	Achieved  float64 `json:"achieved_per_second"`
	// PerTransaction is how many cancels one transaction makes; Cancel
	// is the transactions' latencies.
	PerTransaction int `json:"per_transaction"`
	// PeerAchieved and PeerCancel are the bare DELETE's rate and
	// transaction latencies, the same cancels paced the same way (see
	// cancelPeer); zero without a peer.
	PeerAchieved float64   `json:"peer_achieved_per_second,omitempty"`
	PeerCancel   latencies `json:"peer_cancel"`
	// Cancelled committed; TooLate lost the race to the release
	// (outbox.ErrCancelTooLate) and must be delivered.
	Cancelled int       `json:"cancelled"`
	TooLate   int       `json:"too_late"`
	Failed    int       `json:"failed,omitempty"`
	Cancel    latencies `json:"cancel"`
	// Expected is the messages that must arrive (not cancelled, or
	// cancelled too late); Lost of them did not; Duplicates are deliveries
	// beyond each message's first; CancelledDelivered are messages whose
	// cancel committed that arrived anyway.
	Expected           int       `json:"expected"`
	Received           int       `json:"received"`
	Lost               int       `json:"lost"`
	Duplicates         int       `json:"duplicate_deliveries"`
	CancelledDelivered int       `json:"cancelled_delivered"`
	Unknown            int64     `json:"unknown_deliveries,omitempty"`
	Lag                latencies `json:"lag"`
}

// schedCancel schedules cfg.CancelMessages, each under its own key, due
// over cfg.CancelSpread, with bento's projector running, and cancels every
// other one from cfg.Cancellers goroutines at cfg.CancelRate, starting
// cfg.CancelAhead before the first falls due (the cancels that fall behind
// race the release). Each message then must arrive at least once unless
// its cancel committed, and then never.
func schedCancel(ctx context.Context, b *steadyBed, cfg scheduledConfig) (cancelRun, error) {
	n := cfg.CancelMessages
	st, err := openSchedStage(ctx, b, n)
	if err != nil {
		return cancelRun{}, err
	}
	tr, relay, store := st.tr, st.relay, st.store
	defer st.close()
	prefix := "c" + randomHex(3) + "-"
	key := func(i int) string { return prefix + strconv.Itoa(i) }
	start := time.Now()
	t0 := start.Add(cfg.Lead)
	err = scheduleAll(ctx, b.db, store, n, cfg.Writers, func(i int) time.Time { return dueTime(t0, i, n, cfg.CancelSpread) }, key)
	cancelAt := t0.Add(-cfg.CancelAhead)
	if err == nil && time.Now().After(cancelAt) {
		err = fmt.Errorf("scheduling %d messages took %v, past the cancels' start %v after it (raise -scheduled-lead)", n,
			time.Since(start).Round(time.Millisecond), cancelAt.Sub(start).Round(time.Millisecond))
	}
	if err != nil {
		return cancelRun{}, errors.Join(err, relay.stop())
	}
	select { // start cancelling CancelAhead before the first is due
	case <-time.After(time.Until(cancelAt)):
	case <-ctx.Done():
		return cancelRun{}, errors.Join(ctx.Err(), relay.stop())
	}

	// Every other message, in due order, paced open-loop at CancelRate.
	targets := make([]int, 0, n/2)
	for i := 1; i < n; i += 2 {
		targets = append(targets, i)
	}
	const (
		stNone = iota
		stCancelled
		stTooLate
		stFailed
	)
	state := make([]int, n)
	var (
		firstE error
		emu    sync.Mutex
	)
	achieved, took := paceCancels(ctx, cfg, len(targets), func(ctx context.Context, seqs []int) {
		outcome := make([]int, len(seqs))
		err := b.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			for k, j := range seqs {
				cancelled, err := store.Cancel(ctx, tx, key(targets[j]), nil)
				switch {
				case err == nil && cancelled > 0:
					outcome[k] = stCancelled
				case errors.Is(err, outbox.ErrCancelTooLate):
					outcome[k] = stTooLate
				case err == nil:
					return fmt.Errorf("cancel %s: nothing cancelled and no error", key(targets[j]))
				default:
					return fmt.Errorf("cancel %s: %w", key(targets[j]), err)
				}
			}
			return nil
		})
		for k, j := range seqs {
			if err != nil {
				outcome[k] = stFailed
			}
			state[targets[j]] = outcome[k]
		}
		if err != nil {
			emu.Lock()
			if firstE == nil {
				firstE = err
			}
			emu.Unlock()
		}
	})
	r := cancelRun{Messages: n, Attempted: len(targets), Offered: cfg.CancelRate, PerTransaction: cfg.cancelsPerTx(),
		Achieved: achieved, Cancel: summarize(took)}
	for i := range n {
		switch state[i] {
		case stCancelled:
			r.Cancelled++
		case stTooLate:
			r.TooLate++
		case stFailed:
			r.Failed++
		}
		if state[i] != stCancelled {
			r.Expected++
		}
	}
	waitSched(ctx, tr, r.Expected, t0.Add(cfg.CancelSpread), schedIdle, time.Second)
	var lags []time.Duration
	for i := range n {
		c := tr.count[i].Load()
		if c > 0 {
			r.Received++
			lags = append(lags, time.Duration(tr.lag[i].Load()))
		}
		switch {
		case state[i] == stCancelled && c > 0:
			r.CancelledDelivered++
		case state[i] != stCancelled && c == 0:
			r.Lost++
		}
	}
	r.Duplicates, r.Unknown, r.Lag = tr.duplicates(), tr.unknown.Load(), summarize(lags)
	err = firstE
	if err != nil {
		err = fmt.Errorf("%d cancels failed, the first: %w", r.Failed, err)
	}
	return r, errors.Join(err, ctx.Err(), relay.stop())
}

// paceCancels hands the cancels [0, total) to cfg.Cancellers goroutines,
// cfg.cancelsPerTx() at a time in order, paced open-loop so that
// cfg.CancelRate cancels a second are offered, and calls do for each group
// (one transaction). It returns the cancels completed per second, from the
// first's start to the last's end, and each group's latency.
func paceCancels(ctx context.Context, cfg scheduledConfig, total int, do func(ctx context.Context, seqs []int)) (float64, []time.Duration) {
	per := cfg.cancelsPerTx()
	groups := (total + per - 1) / per
	took := make([]time.Duration, groups)
	p := &pacer{rate: cfg.CancelRate / float64(per), total: groups}
	jobs := make(chan job, groups)
	start := time.Now()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go schedule(sctx, p, start, steadyTick, jobs)
	var (
		wg      sync.WaitGroup
		lastEnd atomic.Int64
	)
	for range cfg.Cancellers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seqs := make([]int, 0, per)
			for j := range jobs {
				seqs = seqs[:0]
				for i := j.seq * per; i < min((j.seq+1)*per, total); i++ {
					seqs = append(seqs, i)
				}
				s := time.Now()
				do(ctx, seqs)
				took[j.seq] = time.Since(s)
				end := int64(time.Since(start))
				for {
					old := lastEnd.Load()
					if end <= old || lastEnd.CompareAndSwap(old, end) {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	if d := time.Duration(lastEnd.Load()); d > 0 {
		return float64(total) / d.Seconds(), took
	}
	return 0, took
}

// scheduledResult is one run of the scheduled scenario.
type scheduledResult struct {
	Relays []schedRun `json:"relays"`
	Cancel *cancelRun `json:"cancel,omitempty"`
}

// runScheduled runs the scheduled scenario once, in a fresh schema:
// bento's projector, then the bare poller, then the cancellation.
func runScheduled(ctx context.Context, e *env, cfg scheduledConfig, report func(string)) (scheduledResult, error) {
	var res scheduledResult
	b, err := newSteadyBed(ctx, e, steadyConfig{Writers: cfg.Writers + cfg.Cancellers})
	if err != nil {
		return res, err
	}
	defer b.close()
	line := func(r schedRun) {
		report(fmt.Sprintf("%-40s scheduled %d in %.1f s (%s/s); lag p50 %7.2f ms, p95 %7.2f ms, p99 %7.2f ms, max %7.2f ms (%d/%d received, %d duplicates, %d early)",
			r.Label, r.Messages, r.SchedulingSeconds, thousands(r.ScheduledPerSecond), r.Lag.P50, r.Lag.P95, r.Lag.P99, r.Lag.Max,
			r.Received, r.Messages, r.Duplicates, r.Early))
	}
	r, err := schedBento(ctx, b, cfg)
	if err != nil {
		return res, fmt.Errorf("bento: %w", err)
	}
	line(r)
	if p := r.Relay; p != nil && p.Release != nil {
		report(fmt.Sprintf("  relay: %d releases of %.1f rows, p50 %.2f ms p99 %.2f ms, next due time p50 %.2f ms p99 %.2f ms; %d batches of %.1f rows; claim p50 %.2f ms p99 %.2f ms, publish+confirm p50 %.2f ms p99 %.2f ms, mark sent p50 %.2f ms p99 %.2f ms",
			p.Releases, p.RowsPerRelease, p.Release.P50, p.Release.P99, p.NextDue.P50, p.NextDue.P99, p.Batches, p.RowsPerBatch, p.Claim.P50, p.Claim.P99,
			p.Publish.P50, p.Publish.P99, p.MarkSent.P50, p.MarkSent.P99))
	}
	res.Relays = append(res.Relays, r)
	if cfg.PeerPoll > 0 {
		r, err := schedPeer(ctx, b, cfg)
		if err != nil {
			return res, fmt.Errorf("bare poller: %w", err)
		}
		line(r)
		res.Relays = append(res.Relays, r)
	}
	if cfg.CancelMessages > 0 {
		c, err := schedCancel(ctx, b, cfg)
		if err != nil {
			return res, fmt.Errorf("cancel: %w", err)
		}
		if cfg.CancelPeer {
			c.PeerAchieved, c.PeerCancel, err = cancelPeer(ctx, b, cfg, c.Attempted)
			if err != nil {
				return res, fmt.Errorf("cancel peer: %w", err)
			}
		}
		report(fmt.Sprintf("cancel: %d of %d messages, %d per transaction, at %s/s offered, %s/s achieved (transaction p50 %.2f ms, p99 %.2f ms): %d cancelled, %d too late; %d/%d expected received, %d lost, %d duplicates, %d cancelled but delivered",
			c.Attempted, c.Messages, c.PerTransaction, thousands(c.Offered), thousands(c.Achieved), c.Cancel.P50, c.Cancel.P99, c.Cancelled, c.TooLate,
			c.Received, c.Expected, c.Lost, c.Duplicates, c.CancelledDelivered))
		if cfg.CancelPeer {
			report(fmt.Sprintf("cancel peer: bare DELETE by key, %s/s achieved (transaction p50 %.2f ms, p99 %.2f ms); bento / peer %.2f",
				thousands(c.PeerAchieved), c.PeerCancel.P50, c.PeerCancel.P99, ratio(c.Achieved, c.PeerAchieved)))
		}
		res.Cancel = &c
	}
	return res, nil
}
