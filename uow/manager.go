package uow

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/conf"
	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/promreg"
	"github.com/bentoevents/bento/internal/tracing"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
)

// Defaults of [Config].
const (
	DefaultMaxAttempts = 4
	DefaultRetryDelay  = 2 * time.Millisecond
)

// Config configures a [Manager]. A nil Config or a zero field means the
// field's default; a negative MaxAttempts or RetryDelay and a malformed
// Tenant are rejected with [ErrInvalidConfig].
type Config struct {
	// Tenant is the tenant of units whose context and options name none.
	// Defaults to "default".
	Tenant string
	// MaxAttempts is how many times Run calls its function when commits fail
	// with ErrConcurrencyConflict (1 means no retry). Defaults to
	// DefaultMaxAttempts (4).
	MaxAttempts int
	// RetryDelay is the pause before Run's first retry; it doubles on each
	// further retry and is jittered by up to 100%. Defaults to
	// DefaultRetryDelay (2ms).
	RetryDelay time.Duration
	// Outbox is the store events are written with; its Clock gives each
	// event its id and occurred-at time when a unit writes it. Defaults to
	// outbox.NewStore(db, nil), on aggregate.SystemClock.
	Outbox *outbox.Store
	// Producer, when set, is stored as the "producer" metadata of every
	// event. Defaults to none.
	Producer string
	// AfterCommit, when set, is called after each commit of a unit that
	// wrote at least one event, with the number of events, once those
	// events are committed: at once for a unit that owns its transaction;
	// for a unit that joined a caller's transaction, when the owner reports
	// the commit (the outer unit's Commit, or Owned.Commit, which the inbox
	// middleware and the idempotency ledger call). It may also run for a
	// joined unit whose enclosing savepoint was rolled back later, so use
	// it for hints: wake an in-process projector (projector.Wake) where the
	// database has no NOTIFY, as on SQLite. It must not block. Defaults to
	// none.
	AfterCommit func(events int)
	// BeforeCommit, when set, is called inside the unit's transaction (or
	// savepoint) once its aggregates are saved and its events inserted into
	// the outbox, with those events (ids, topics, aggregates, versions and
	// payloads as written), before the commit. Its writes through tx
	// commit or roll back with them; an error it returns rolls the unit
	// back, and Commit returns it wrapped. Use it for what must be
	// recorded exactly when the events are: an audit trail, or the ledger
	// of package chaos, whose checker counts what was committed. It is not
	// called for a unit without events. Defaults to none.
	BeforeCommit func(ctx context.Context, tx *gorm.DB, events []*outbox.Message) error
	// Registerer, when set, receives bento_outbox_enqueued_total{topic}: the
	// events committed by this manager's units (joined units count when
	// their savepoint is released). Defaults to none.
	Registerer prometheus.Registerer
	// TxOptions are used to begin transactions. Defaults to the database's
	// default isolation level (READ COMMITTED on PostgreSQL), which the
	// version check is designed for.
	TxOptions *sql.TxOptions
	// TracerProvider creates the "bento.uow.commit" span of each Commit,
	// a child of the span in the context Commit is given. Defaults to
	// otel.GetTracerProvider(), a no-op until the application sets one.
	TracerProvider trace.TracerProvider
	// Propagator writes the commit span's trace context into the metadata
	// of every event the unit writes. Defaults to W3C Trace Context
	// (the traceparent and tracestate keys), whatever the global
	// propagator is.
	Propagator propagation.TextMapPropagator
}

// Manager begins units of work on one database. It is safe for concurrent
// use; create one per database and share it.
type Manager struct {
	enqueued *prometheus.CounterVec // nil without a Registerer
	db       *gorm.DB
	dialect  dialect.Dialect
	cfg      Config
	store    *outbox.Store
	tracing  tracing.Tracing
}

// New returns a Manager over db, a PostgreSQL or SQLite *gorm.DB whose outbox
// tables exist (see outbox.Migrate). cfg may be nil. Without cfg.Outbox it
// makes its store with outbox.NewStore, which returns
// outbox.ErrNotMigrated when the outbox table is missing.
//
// Errors: dialect.ErrUnsupported for another database, ErrInvalidConfig
// naming each bad field (wrapping tenant.ErrInvalid for a bad Tenant),
// outbox.ErrNotMigrated.
func New(db *gorm.DB, cfg *Config) (*Manager, error) {
	d, err := dialect.Of(db)
	if err != nil {
		return nil, fmt.Errorf("uow: %w", err)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	var p conf.Problems
	if c.Tenant != "" {
		if err := tenant.Validate(c.Tenant); err != nil {
			p.Add("Tenant", err)
		}
	}
	conf.Default(&p, "MaxAttempts", &c.MaxAttempts, DefaultMaxAttempts)
	conf.Default(&p, "RetryDelay", &c.RetryDelay, DefaultRetryDelay)
	if err := p.Err(ErrInvalidConfig); err != nil {
		return nil, err
	}
	if c.Tenant == "" {
		c.Tenant = tenant.Default
	}
	if c.Outbox == nil {
		if c.Outbox, err = outbox.NewStore(db, nil); err != nil {
			return nil, fmt.Errorf("uow: %w", err)
		}
	}
	m := &Manager{db: db, dialect: d, cfg: c, store: c.Outbox, tracing: tracing.New(c.TracerProvider, c.Propagator)}
	if c.Registerer != nil {
		m.enqueued = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bento_outbox_enqueued_total", Help: "Events committed to the outbox, by topic.",
		}, []string{"topic"})
		var err error
		if m.enqueued, err = promreg.Register(c.Registerer, m.enqueued); err != nil {
			return nil, fmt.Errorf("uow: metrics: %w", err)
		}
	}
	return m, nil
}

// Config returns the manager's configuration with defaults filled in.
func (m *Manager) Config() Config { return m.cfg }

// DB returns the database the manager was created with.
func (m *Manager) DB() *gorm.DB { return m.db }

// Outbox returns the store events are written with.
func (m *Manager) Outbox() *outbox.Store { return m.store }

// BeginOpts are per-unit options. A nil *BeginOpts means none.
type BeginOpts struct {
	// Tenant overrides the tenant in the context and the manager's default.
	Tenant string
}

// Begin starts a unit of work. When ctx carries a transaction (see
// ContextWithTx) the unit joins it through a savepoint; otherwise it begins
// its own. The caller must end the unit with Commit or Rollback.
//
// Errors: tenant.ErrInvalid for a malformed tenant, ErrClosed, or the
// database error.
func (m *Manager) Begin(ctx context.Context, opts *BeginOpts) (*UnitOfWork, error) {
	if opts == nil {
		opts = &BeginOpts{}
	}
	tid, err := tenant.Resolve(ctx, opts.Tenant, m.cfg.Tenant)
	if err != nil {
		return nil, fmt.Errorf("uow: begin: %w", err)
	}
	u := &UnitOfWork{m: m, tenant: tid, seen: map[aggregate.Root]bool{}}
	if outer := scopeFrom(ctx); outer != nil {
		u.tx, u.scope = outer.tx, outer
		u.savepoint = fmt.Sprintf("bento_uow_%d", savepointSeq.Add(1))
		if err := outer.tx.WithContext(ctx).SavePoint(u.savepoint).Error; err != nil {
			return nil, wrapDB("begin: savepoint", err)
		}
		return u, nil
	}
	tx := m.db.WithContext(ctx).Begin(m.cfg.TxOptions)
	if tx.Error != nil {
		return nil, wrapDB("begin", tx.Error)
	}
	u.tx, u.scope = tx, &txScope{tx: tx}
	return u, nil
}

// Run runs fn in a new unit of work and commits it when fn returns nil. If fn
// returns an error or panics, or the commit fails, the unit is rolled back and
// the error (or panic) is passed on. When the error is an
// ErrConcurrencyConflict, Run tries again (fn is called anew, so it must
// reload what it changes) up to Config.MaxAttempts times in all, pausing
// between attempts.
//
// fn receives a context carrying the unit's transaction and tenant. When ctx
// already carries a transaction, the unit joins it (see RunTx) and conflicts
// are not retried, since the caller's transaction decides.
func (m *Manager) Run(ctx context.Context, fn func(ctx context.Context, u *UnitOfWork) error) error {
	attempts := m.cfg.MaxAttempts
	if _, joined := TxFromContext(ctx); joined {
		attempts = 1
	}
	delay := m.cfg.RetryDelay
	for attempt := 1; ; attempt++ {
		err := m.runOnce(ctx, fn)
		if err == nil || !errors.Is(err, ErrConcurrencyConflict) {
			return err
		}
		if attempt >= attempts {
			if attempts > 1 {
				return fmt.Errorf("uow: gave up after %d attempts: %w", attempt, err)
			}
			return err
		}
		pause := delay + time.Duration(rand.Int64N(int64(delay)+1))
		delay *= 2
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("uow: retry after conflict: %w (last error: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// RunTx runs fn in a unit of work that joins tx, the caller's transaction,
// through a savepoint. It never commits or rolls back tx: when fn fails, the
// savepoint is rolled back and the error returned; the caller decides the
// fate of tx. The unit's AfterCommit hook does not run, since bento does not
// see the caller's commit; to have it run, begin the units with a context
// from ContextWithTx and call Committed with it after the commit.
func (m *Manager) RunTx(ctx context.Context, tx *gorm.DB, fn func(ctx context.Context, u *UnitOfWork) error) error {
	if tx == nil {
		return errors.New("uow: RunTx: nil transaction")
	}
	return m.Run(ContextWithTx(ctx, tx), fn)
}

func (m *Manager) runOnce(ctx context.Context, fn func(ctx context.Context, u *UnitOfWork) error) (err error) {
	u, err := m.Begin(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			_ = u.Rollback()
			panic(p)
		}
	}()
	if err := fn(u.Context(ctx), u); err != nil {
		_ = u.Rollback()
		return err
	}
	return u.Commit(ctx)
}
