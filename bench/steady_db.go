package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
)

// runSteadyDatabase measures PostgreSQL without a broker at rate: units of
// work committing one event each, bento's projector relaying into a
// dbbus.Bus in the same database, and consumer.NewDatabase (its default
// partitions, the inbox) handing each event to a handler that records its
// receipt. Latency runs from Commit returning to the handler's call.
func runSteadyDatabase(ctx context.Context, b *steadyBed, rate float64) (steadyRun, error) {
	if err := b.reset(ctx); err != nil {
		return steadyRun{}, err
	}
	app := "bench-dbbus-" + randomHex(4)
	group := "steady-" + randomHex(4)
	cc := consumer.DefaultConfig(group)
	cc.Logger, cc.CloseTimeout = b.e.log, 10*time.Second
	// Each partition's owner and its worker may each hold a connection,
	// beside the projector, the listener and the membership: the consume
	// scenario's pool size (a pool of 16 had the projector's claims wait
	// for a connection, 50 ms at their p50).
	pool, err := b.schema.gormAs(app, 2*cc.Partitions+8)
	if err != nil {
		return steadyRun{}, err
	}
	defer closeGorm(pool)
	if err := dbbus.Migrate(ctx, pool); err != nil {
		return steadyRun{}, err
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		return steadyRun{}, err
	}
	// Declared before anything is committed, so no event finds the group
	// missing (it would be kept as unroutable).
	if err := dbbus.DeclarePartitions(ctx, pool, group, cc.Partitions, topic); err != nil {
		return steadyRun{}, err
	}
	bus, err := dbbus.New(pool, &dbbus.Config{Logger: b.e.log})
	if err != nil {
		return steadyRun{}, err
	}
	defer bus.Close()

	var cur atomic.Pointer[tracker]
	cons, err := consumer.NewDatabase(pool, bus, cc)
	if err != nil {
		return steadyRun{}, err
	}
	err = consumer.Handle(cons, func(_ context.Context, _ *gorm.DB, _ Deposited, env *messaging.Envelope) error {
		tr := cur.Load()
		if tr == nil {
			return nil
		}
		at := tr.now()
		if seq, err := parseSeq(env.Payload); err != nil {
			tr.unknowns.Add(1)
		} else {
			tr.receive(seq, at)
		}
		return nil
	})
	if err != nil {
		return steadyRun{}, err
	}

	timer := &phaseTimer{}
	store, err := outbox.NewStore(pool.Session(&gorm.Session{Logger: timer}), nil)
	if err != nil {
		return steadyRun{}, err
	}
	pc := projector.DefaultConfig()
	pc.WorkerID, pc.Logger = app, b.e.log
	proj, err := projector.New(store, bus, pc)
	if err != nil {
		return steadyRun{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 2)
	go func() { done <- proj.Run(rctx) }()
	go func() { done <- cons.Run(rctx) }()
	b.relay.Store(proj)
	defer b.relay.Store(nil)
	if err := waitListening(ctx, b, proj.ApplicationName()); err != nil {
		return steadyRun{}, err
	}
	timer.reset()
	receive := func(tr *tracker) (func(), error) {
		cur.Store(tr)
		return func() { cur.Store(nil) }, nil
	}
	r, err := measureRate(ctx, b, receive, rate, "dbbus-"+randomHex(3), b.commitDeposit)
	r.Relay = timer.phases()
	cancel()
	var errs []error
	for range 2 {
		if e := <-done; e != nil && !errors.Is(e, context.Canceled) {
			errs = append(errs, e)
		}
	}
	return r, errors.Join(append(errs, err)...)
}

// waitListening waits until a backend named app is connected: the
// projector's LISTEN connection, so that no commit goes unnoticed.
func waitListening(ctx context.Context, b *steadyBed, app string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := b.admin.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
			app).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not start listening within 30 s", app)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
