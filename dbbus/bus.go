package dbbus

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/closing"
	"github.com/bentoevents/bento/internal/dberr"
	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/migrate"
	"github.com/bentoevents/bento/internal/pglisten"
	"github.com/bentoevents/bento/internal/tracing"
)

var (
	// ErrClosed is returned by a [Bus] or [Subscriber] used after Close.
	ErrClosed = errors.New("dbbus: bus closed")
	// ErrNotMigrated is returned by [New] when the bus's tables are
	// missing: run [Migrate] first.
	ErrNotMigrated = errors.New("dbbus: tables missing (run dbbus.Migrate)")
)

//go:embed migrations
var migrationFiles embed.FS

// Migrations returns the embedded SQL migrations, one folder per dialect.
func Migrations() fs.FS { return migrate.Folder(migrationFiles) }

// Migrate creates or upgrades the bus's tables (dbbus_messages,
// dbbus_deliveries, dbbus_bindings, dbbus_partitions, dbbus_queue_owners)
// in db, PostgreSQL or SQLite. It is idempotent and safe to run from
// several processes at once.
func Migrate(ctx context.Context, db *gorm.DB) error {
	if err := migrate.Up(ctx, db, "dbbus", Migrations()); err != nil {
		return wrapDB("migrate", err)
	}
	return nil
}

func wrapDB(op string, err error) error { return dberr.Wrap("dbbus: "+op, err) }

// Bus is the database bus on one database: a message.Publisher
// ([Bus.Publish], [Bus.PublishTx]) and the source of its subscribers
// ([Bus.Subscriber]). The publishers and subscribers of one Bus wake each
// other in-process; on PostgreSQL a LISTEN connection also wakes them for
// what other processes publish. A Bus is safe for concurrent use.
type Bus struct {
	db  *gorm.DB
	d   dialect.Dialect
	sql *statements
	cfg Config
	log *slog.Logger

	// writeMu queues the bus's own writes on SQLite (see write).
	writeMu sync.Mutex
	mu      closing.Guard // closed by Close; guards subs
	subs    []*Subscriber
	wakes   waker
	acks    acker // deletes what the subscriptions acked
	listens bool  // on PostgreSQL, unless Config.NoListen
	cancel  context.CancelFunc
	wg      sync.WaitGroup // the listener
}

// New returns a Bus on db (PostgreSQL or SQLite), whose tables [Migrate]
// has created. A nil cfg means the defaults. On PostgreSQL, unless
// cfg.NoListen, it keeps one connection of db's pool in LISTEN mode until
// Close.
//
// Errors: ErrInvalidConfig, ErrNotMigrated, dialect errors for another
// database.
func New(db *gorm.DB, cfg *Config) (*Bus, error) {
	d, err := dialect.Of(db)
	if err != nil {
		return nil, fmt.Errorf("dbbus: %w", err)
	}
	c, err := cfg.withDefaults(d == dialect.Postgres)
	if err != nil {
		return nil, err
	}
	if err := migrate.Require(db, "dbbus", ErrNotMigrated, "dbbus_messages", "dbbus_deliveries", "dbbus_bindings"); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Bus{db: db, d: d, sql: statementsFor(d), cfg: c, log: c.Logger, cancel: cancel}
	b.acks.b = b
	if d == dialect.Postgres && !c.NoListen {
		b.listens = true
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			b.listen(ctx)
		}()
	}
	return b, nil
}

// Close closes every subscriber of the bus (giving back what they hold),
// stops the LISTEN connection and makes later calls fail with ErrClosed. It
// does not close db.
func (b *Bus) Close() error {
	var subs []*Subscriber
	_ = b.mu.Close(func() error {
		subs, b.subs = b.subs, nil
		return nil
	})
	for _, s := range subs {
		_ = s.Close()
	}
	b.acks.flush()
	b.cancel()
	b.wg.Wait()
	return nil
}

// DB returns the database the bus's tables live in, for the package's
// functions that take one ([DeclareGroup], [DeclarePartitions], [Depth]).
// A caller that holds a transaction on it can publish with
// [Bus.PublishTx]; this is how package projector finds that it may relay
// the outbox in the transaction that marks the rows sent.
func (b *Bus) DB() *gorm.DB { return b.db }

// MessagingSystem returns "bento_database", the bus's messaging.system name
// on spans.
func (b *Bus) MessagingSystem() string { return tracing.SystemDatabase }

// write runs fn, one write statement or transaction of the bus's own. On
// SQLite, which has one writer at a time, the bus's writes queue for a Go
// mutex, which hands over in turn, rather than in SQLite's busy handler,
// which lets a waiter that arrived later win: a waiter sleeps longer after
// each retry, and under a steady load of claims, acks and publishes one
// subscription's claim could wait for seconds while a competing
// subscription of its group claimed everything. Writes of other processes
// and of the caller's transactions (PublishTx) still meet in the busy
// handler. On PostgreSQL fn runs at once.
func (b *Bus) write(fn func() error) error {
	if b.d != dialect.SQLite {
		return fn()
	}
	b.writeMu.Lock()
	defer b.writeMu.Unlock()
	return fn()
}

// listen keeps a LISTEN connection open until ctx ends, waking the bus on
// each notification of its schema, and once on each (re)connect, since
// notifications sent while not listening are lost; polling covers the gap.
func (b *Bus) listen(ctx context.Context) {
	sqlDB, err := b.db.DB()
	if err != nil {
		b.log.Warn("dbbus: cannot listen; polling only", "err", err)
		return
	}
	pglisten.Listener{
		Channel:  NotifyChannel,
		Logger:   b.log,
		Prefix:   "dbbus: ",
		OnListen: func(string) { b.wakes.all() },
		OnNotify: func(payload, schema string) {
			if queues, ok := notifiedQueues(payload, schema); ok {
				b.wakeNotified(queues)
			}
		},
	}.Run(ctx, sqlDB)
}
