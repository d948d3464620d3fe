package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/rabbitmq"
	"github.com/bentoevents/bento/uow"
)

// publisher is a way for bento's projector to reach RabbitMQ.
type publisher struct {
	Name  string // key in the results, e.g. "watermill"
	Label string // what tables and the chart call it
	Open  func(context.Context, *rabbitmq.Config) (message.Publisher, error)
}

// publishers are the publishers the drain runs bento's projector with, each
// with 1 and 2 projector instances. Adding one is one line.
var publishers = []publisher{
	{"watermill", "watermill-amqp", opener(rabbitmq.NewPublisher)},
	{"confirm", "ConfirmPublisher", opener(rabbitmq.NewConfirmPublisher)},
}

// opener adapts a publisher constructor to publisher.Open.
func opener[P message.Publisher](newP func(context.Context, *rabbitmq.Config) (P, error)) func(context.Context, *rabbitmq.Config) (message.Publisher, error) {
	return func(ctx context.Context, c *rabbitmq.Config) (message.Publisher, error) {
		p, err := newP(ctx, c)
		if err != nil {
			return nil, err
		}
		return p, nil
	}
}

// variant is one relay the drain times.
type variant struct {
	Key   string // stable key in the results, e.g. "bento-watermill-1"
	Label string
	// Family is "bento", "peer" (Watermill's forwarder, which relays at
	// most 20,000 events and is compared by rate) or "bare".
	Family string
	run    func(ctx context.Context, b *backlog) (drainRun, error)
}

// drainVariants lists the relays in the order each run measures them.
func drainVariants(e *env) []variant {
	var vs []variant
	for _, p := range publishers {
		for _, n := range []int{1, 2} {
			vs = append(vs, variant{
				Key:    fmt.Sprintf("bento-%s-%d", p.Name, n),
				Label:  fmt.Sprintf("bento, %s, %s", p.Label, projectorCount(n)),
				Family: "bento",
				run: func(ctx context.Context, b *backlog) (drainRun, error) {
					return runBento(ctx, e, b, p, n)
				},
			})
		}
	}
	vs = append(vs,
		variant{Key: "watermill-forwarder", Label: "Watermill forwarder + watermill-sql (peer)", Family: "peer",
			run: func(ctx context.Context, b *backlog) (drainRun, error) { return runPeer(ctx, e, b) }},
		variant{Key: "bare", Label: "bare pgx + amqp091 loop, ORDER BY id", Family: "bare",
			run: func(ctx context.Context, b *backlog) (drainRun, error) { return runBare(ctx, e, b, bareSelectSQL) }},
		variant{Key: "bare-indexed", Label: "bare loop, ORDER BY available_at, id", Family: "bare",
			run: func(ctx context.Context, b *backlog) (drainRun, error) {
				return runBare(ctx, e, b, bareIndexedSelectSQL)
			}},
	)
	return vs
}

func projectorCount(n int) string {
	if n == 1 {
		return "1 projector"
	}
	return fmt.Sprintf("%d projectors", n)
}

// drainRun is one timed relay.
type drainRun struct {
	Events  int     `json:"events"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rows_per_second"`
	Failed  int     `json:"failed_attempts,omitempty"`
	// ClaimSeconds and SettleSeconds are the time spent selecting rows
	// (bento: Store.Claim, summed over the projectors; bare: BEGIN and the
	// SELECT) and recording them sent (bento: MarkSent; bare: UPDATE and
	// COMMIT). Not measured for the forwarder.
	ClaimSeconds  float64 `json:"claim_seconds,omitempty"`
	SettleSeconds float64 `json:"settle_seconds,omitempty"`
}

func newDrainRun(events int, d time.Duration) drainRun {
	return drainRun{Events: events, Seconds: d.Seconds(), Rate: float64(events) / d.Seconds()}
}

// backlogTable holds a run's committed events; each measurement starts from
// a copy of it in outbox_events.
const backlogTable = "bench_backlog"

// backlog is one run's events: committed once with units of work into a
// fresh schema, then copied aside so every relay gets the same fresh rows.
type backlog struct {
	schema       *pgSchema
	db           *gorm.DB
	n            int
	PayloadBytes float64
	SetupSeconds float64
}

func newBacklog(ctx context.Context, e *env, n int) (b *backlog, err error) {
	s, err := e.newSchema(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = s.drop()
		}
	}()
	db, err := s.gorm(8)
	if err != nil {
		return nil, err
	}
	b = &backlog{schema: s, db: db, n: n}
	start := time.Now()
	if err := migrate(ctx, db); err != nil {
		return nil, err
	}
	units, err := uow.New(db, nil)
	if err != nil {
		return nil, err
	}
	if err := seed(ctx, units, "acc", n); err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	if err := db.WithContext(ctx).Exec("CREATE TABLE " + backlogTable + " AS SELECT * FROM outbox_events ORDER BY id").Error; err != nil {
		return nil, err
	}
	var check struct {
		N   int
		Avg float64
	}
	if err := db.WithContext(ctx).Raw("SELECT count(*) AS n, avg(octet_length(payload::text)) AS avg FROM " + backlogTable).Scan(&check).Error; err != nil {
		return nil, err
	}
	if check.N != n {
		return nil, fmt.Errorf("seed wrote %d events, want %d", check.N, n)
	}
	b.PayloadBytes = check.Avg
	b.SetupSeconds = time.Since(start).Seconds()
	return b, nil
}

func (b *backlog) close() error {
	closeGorm(b.db)
	return b.schema.drop()
}

// reload empties outbox_events and fills it with the backlog's events, as
// committed, then analyzes it and checkpoints so no relay pays for the
// previous one's writes.
func (b *backlog) reload(ctx context.Context) error {
	for _, q := range []string{
		emptyOutboxSQL,
		"INSERT INTO outbox_events SELECT * FROM " + backlogTable,
		"ANALYZE outbox_events",
		"CHECKPOINT",
	} {
		if err := b.db.WithContext(ctx).Exec(q).Error; err != nil {
			return fmt.Errorf("reload backlog: %s: %w", q, err)
		}
	}
	return nil
}

// unsent reports whether any row still waits to be sent.
func unsent(ctx context.Context, db *gorm.DB) (bool, error) {
	var more bool
	err := db.WithContext(ctx).Raw(
		"SELECT EXISTS (SELECT 1 FROM outbox_events WHERE status IN ('new', 'publishing', 'failed'))").Scan(&more).Error
	return more, err
}

// runBento times n projector instances, each with its own connection pool
// and publisher as separate processes would have, draining the backlog
// until no row is unsent.
func runBento(ctx context.Context, e *env, b *backlog, p publisher, n int) (drainRun, error) {
	if err := b.reload(ctx); err != nil {
		return drainRun{}, err
	}
	names := newAMQPNames()
	defer func() {
		if err := e.deleteTopology(names); err != nil {
			e.log.Warn("cleanup", "err", err)
		}
	}()
	cfg := &rabbitmq.Config{URL: e.amqpURL, Exchange: names.Exchange, ChannelPoolSize: 64, Logger: e.log}
	if err := rabbitmq.DeclareQueue(ctx, cfg, names.Queue, topic); err != nil {
		return drainRun{}, err
	}
	projectors := make([]*projector.OutboxProjector, n)
	timer := &sqlTimer{}
	for i := range projectors {
		db, err := b.schema.gorm(4)
		if err != nil {
			return drainRun{}, err
		}
		defer closeGorm(db)
		store, err := outbox.NewStore(db.Session(&gorm.Session{Logger: timer}), nil)
		if err != nil {
			return drainRun{}, err
		}
		pub, err := p.Open(ctx, cfg)
		if err != nil {
			return drainRun{}, fmt.Errorf("open %s: %w", p.Name, err)
		}
		defer pub.Close()
		pc := projector.DefaultConfig()
		pc.BatchSize = 500
		pc.Concurrency = 64
		pc.WorkerID = fmt.Sprintf("bench-%d", i)
		pc.Logger = e.log
		if projectors[i], err = projector.New(store, pub, pc); err != nil {
			return drainRun{}, err
		}
	}

	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed int
		errs   []error
	)
	start := time.Now()
	for _, proj := range projectors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := drainUntilEmpty(ctx, b.db, proj, func(r projector.Result) {
				mu.Lock()
				failed += r.Failed
				mu.Unlock()
			})
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				cancel()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return drainRun{}, err
	}
	if _, err := e.waitDepth(ctx, names.Queue, b.n, 30*time.Second); err != nil {
		return drainRun{}, err
	}
	r := newDrainRun(b.n, elapsed)
	r.Failed = failed
	r.ClaimSeconds, r.SettleSeconds = timer.claim.Seconds(), timer.settle.Seconds()
	return r, nil
}

// drainUntilEmpty calls Drain until the outbox holds no unsent row. Drain
// returns when a claim comes back empty, which with several projectors (or
// events of one aggregate waiting for an earlier one another projector
// holds) can happen before everything is sent.
func drainUntilEmpty(ctx context.Context, db *gorm.DB, p *projector.OutboxProjector, report func(projector.Result)) error {
	for {
		r, err := p.Drain(ctx)
		report(r)
		if err != nil {
			return err
		}
		more, err := unsent(ctx, db)
		if err != nil {
			return err
		}
		if !more {
			return nil
		}
		if r.Claimed == 0 {
			select { // rows are held by another projector, or wait for a retry
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
}
