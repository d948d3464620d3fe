package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
)

// sqlPublishBatch is how many messages one Publish writes, for the
// database modes' fill (one multi-row INSERT each).
const sqlPublishBatch = 500

// runWatermillSQL is the "wmsql" mode, the database bus's peer: the
// handler, without the inbox, on a Watermill router over n subscriptions
// of one consumer group of watermill-sql's PostgreSQL subscriber (its
// default schema and offsets adapter), after every message was published
// into a fresh topic table. Like the "plain" mode it has no exactly-once
// effect; it is what a team gets from Watermill's own SQL pub/sub.
func runWatermillSQL(ctx context.Context, b *consumeBed, db *gorm.DB, group string, n int,
	fn consumer.HandlerFunc[Deposited], c *counter) error {
	wlog := watermill.NewSlogLogger(b.e.log)
	sqlDB, err := sql.Open("pgx", b.schema.DSN)
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(n + 2)
	// One topic per run, so each run reads a fresh table from offset 0.
	wtopic := "bench_" + group
	schema := wsql.DefaultPostgreSQLSchema{}
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(sqlDB),
		wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, wlog)
	if err != nil {
		return err
	}
	for lo := 0; lo < len(b.msgs); lo += sqlPublishBatch {
		batch := make([]*message.Message, 0, sqlPublishBatch)
		for _, o := range b.msgs[lo:min(lo+sqlPublishBatch, len(b.msgs))] {
			batch = append(batch, o.Message.Copy())
		}
		if err := pub.Publish(wtopic, batch...); err != nil {
			return fmt.Errorf("watermill-sql publish: %w", err)
		}
	}
	// Only a transaction open since before the last publish committed can
	// hold the published rows back.
	published := time.Now()
	dispatch, err := decodeDispatch(db, fn)
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlog)
	if err != nil {
		return err
	}
	router.AddMiddleware(middleware.Recoverer)
	for i := range n {
		sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(sqlDB), wsql.SubscriberConfig{
			ConsumerGroup:  group,
			SchemaAdapter:  schema,
			OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
			// Its default polls once a second when a read finds nothing;
			// a drain always finds something, so this only shortens the start.
			PollInterval:     10 * time.Millisecond,
			InitializeSchema: true,
		}, wlog)
		if err != nil {
			return err
		}
		defer sub.Close()
		router.AddConsumerHandler(fmt.Sprintf("%s-%d", group, i), wtopic, sub, dispatch)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watch := func(ctx context.Context) error { return watchStall(ctx, db, c, published, cancel) }
	err = runUntilCounted(ctx, c, []func(context.Context) error{router.Run, watch}, nil)
	var stalled *peerStallError
	if errors.As(context.Cause(ctx), &stalled) {
		return stalled
	}
	return err
}

// peerStallAfter is how long the "wmsql" mode waits without a message
// handled before it looks for a transaction holding its subscriber back.
var peerStallAfter = 15 * time.Second

// peerStallError ends a "wmsql" run whose subscriber stalled behind a
// transaction open since before the messages were published:
// watermill-sql's PostgreSQL subscriber reads only below the oldest
// transaction still open in the cluster, so it receives nothing until
// that transaction ends. That is the peer's property, which the run
// reports; it is not a failure of bento.
type peerStallError struct{ stall *stall }

func (e *peerStallError) Error() string { return "watermill-sql subscriber " + e.stall.String() }

// watchStall returns when ctx is done; before, once c has counted nothing
// new for peerStallAfter while a transaction open since before published
// is still open, it ends the run with a *peerStallError (cancel's cause).
func watchStall(ctx context.Context, db *gorm.DB, c *counter, published time.Time, cancel context.CancelCauseFunc) error {
	tick := time.NewTicker(peerStallAfter / 10)
	defer tick.Stop()
	seen, since := c.n.Load(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if n := c.n.Load(); n != seen {
			seen, since = n, time.Now()
			continue
		}
		if time.Since(since) < peerStallAfter {
			continue
		}
		s, err := openSince(ctx, db, published, int(c.want-seen))
		if err != nil || s.OpenTransactions == 0 {
			continue // not (known to be) held back: wait on, up to runUntilCounted's limit
		}
		cancel(&peerStallError{stall: s})
		return nil
	}
}

// dbIdleWindow is how long the "dbbus" mode measures its consumer's CPU
// once the queue is drained.
const dbIdleWindow = 10 * time.Second

// runDatabaseBus is the "dbbus" mode: consumer.NewDatabase on n partitions
// of a dbbus.Bus in the bench's PostgreSQL schema, up to consumeBatchSize
// messages per transaction (the batched mode without a broker), after
// every message was published to the bus. Once the queue is drained it
// measures, for dbIdleWindow, the CPU the idle consumer uses: this process
// and the PostgreSQL backends of its pool.
func runDatabaseBus(ctx context.Context, b *consumeBed, timer *stmtTimer, group string, n int,
	fn consumer.HandlerFunc[Deposited], c *counter) (*IdleCPU, error) {
	app := "bench-dbbus-" + randomHex(4)
	pool, err := b.schema.gormAs(app, 2*n+8)
	if err != nil {
		return nil, err
	}
	defer closeGorm(pool)
	if err := dbbus.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	// Each run publishes the same messages: the bus would take a UUID it
	// still holds (for an earlier run's group) as a duplicate, and every
	// earlier group would get a copy. Start each run with an empty bus.
	if err := pool.WithContext(ctx).Exec("TRUNCATE dbbus_messages, dbbus_deliveries, dbbus_bindings, " +
		"dbbus_partitions, dbbus_queue_owners").Error; err != nil {
		return nil, err
	}
	if err := dbbus.DeclarePartitions(ctx, pool, group, n, topic); err != nil {
		return nil, err
	}
	bus, err := dbbus.New(pool, &dbbus.Config{Logger: b.e.log})
	if err != nil {
		return nil, err
	}
	defer bus.Close()
	for lo := 0; lo < len(b.msgs); lo += sqlPublishBatch {
		batch := make([]*message.Message, 0, sqlPublishBatch)
		for _, o := range b.msgs[lo:min(lo+sqlPublishBatch, len(b.msgs))] {
			batch = append(batch, o.Message.Copy())
		}
		if err := bus.Publish(topic, batch...); err != nil {
			return nil, fmt.Errorf("database bus publish: %w", err)
		}
	}
	cc := consumer.DefaultConfig(group)
	cc.CloseTimeout, cc.Logger = 10*time.Second, b.e.log
	cc.Partitions, cc.BatchSize = n, consumeBatchSize
	cons, err := consumer.NewDatabase(pool.Session(&gorm.Session{Logger: timer}), bus, cc)
	if err != nil {
		return nil, err
	}
	if err := consumer.Handle(cons, fn); err != nil {
		return nil, err
	}
	var idle *IdleCPU
	settle := func() error {
		if err := b.waitInbox(ctx, group, len(b.msgs)); err != nil {
			return err
		}
		m, err := b.idleDatabaseBus(ctx, app)
		idle = m
		return err
	}
	err = runUntilCounted(ctx, c, []func(context.Context) error{cons.Run}, settle)
	return idle, err
}

// idleDatabaseBus lets a drained consumer settle for a second, then
// measures for dbIdleWindow the CPU of this process and of the PostgreSQL
// backends named app.
func (b *consumeBed) idleDatabaseBus(ctx context.Context, app string) (*IdleCPU, error) {
	admin, err := sql.Open("pgx", b.e.pgDSN)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Second):
	}
	// The runtime returns the heap the run left behind to the OS in the
	// background, paced at about 1% of the CPU until it is done: a cost
	// of the drain (and of the modes before it), not of the idle
	// consumer. Return it now.
	debug.FreeOSMemory()
	m, err := startCPU(ctx, admin, []string{app})
	if err != nil {
		return nil, err
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(dbIdleWindow):
	}
	wall, proc, backend, err := m.stop(ctx)
	if err != nil {
		return nil, err
	}
	return &IdleCPU{Key: "dbbus", Label: "database bus consumer, idle", Seconds: wall.Seconds(),
		ProcessPercent: proc, BackendPercent: backend}, nil
}
