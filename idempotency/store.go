package idempotency

import (
	"context"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/migrate"
	"github.com/bentoevents/bento/internal/purge"
	"github.com/bentoevents/bento/uow"
)

// The states of a key's row. Only the transaction that inserted a row ever
// sees it in_progress: it is completed before that transaction commits.
const (
	StateInProgress = "in_progress"
	StateCompleted  = "completed"
)

// Record is one row of the idempotency_keys table: a key and the response
// stored for it.
type Record struct {
	// TenantID and Key identify the row.
	TenantID string `gorm:"primaryKey"`
	// Key is the Idempotency-Key.
	Key string `gorm:"primaryKey;column:idem_key"`
	// RequestDigest is RequestDigest of the key's first request.
	RequestDigest string
	// State is StateInProgress or StateCompleted.
	State string
	// StatusCode is the stored response's status (0 while in progress).
	StatusCode int
	// Headers are the stored response headers (Config.StoredHeaders).
	Headers http.Header `gorm:"serializer:json"`
	// Body is the stored response body.
	Body []byte
	// CreatedAt is when the key's first request began, in UTC.
	CreatedAt time.Time `gorm:"autoCreateTime:false"`
	// ExpiresAt is when the key is forgotten: CreatedAt plus Config.TTL.
	ExpiresAt time.Time
}

// TableName tells GORM the table.
func (Record) TableName() string { return "idempotency_keys" }

// component is the ledger's name in the bento_migrations table.
const component = "idempotency"

//go:embed migrations
var migrationFiles embed.FS

// Migrations returns the embedded SQL migrations, one folder per dialect
// ("postgres", "sqlite"), each file named NNN_name.sql. Use it to feed your
// own migration tool; [Migrate] applies the same files.
func Migrations() fs.FS {
	return migrate.Folder(migrationFiles)
}

// Migrate creates or upgrades the idempotency_keys table in db (PostgreSQL
// or SQLite) and records what it applied in bento_migrations. It is
// idempotent and safe to run from several processes at once.
//
// Errors: dialect errors for another database, ErrClosed, or the database
// error.
func Migrate(ctx context.Context, db *gorm.DB) error {
	if err := migrate.Up(ctx, db, component, Migrations()); err != nil {
		return wrapDB("migrate", err)
	}
	return nil
}

// DefaultPurgeBatch is the batch size Purge uses when given none.
const DefaultPurgeBatch = purge.DefaultBatchSize

// SQL of the ledger. The rest is built by GORM from Record.
const (
	// purgeSQL deletes one batch of expired keys, oldest first, through the
	// expires_at index.
	purgeSQL = `DELETE FROM idempotency_keys WHERE (tenant_id, idem_key) IN (
  SELECT tenant_id, idem_key FROM idempotency_keys WHERE ` + expiredWhere + ` ORDER BY expires_at LIMIT @limit)`
	// countExpiredSQL counts what purgeSQL deletes.
	countExpiredSQL = `SELECT count(*) FROM idempotency_keys WHERE ` + expiredWhere
	// expiredWhere selects the expired keys.
	expiredWhere = `expires_at <= @before`
	// pgSetLockTimeoutSQL sets the transaction's lock_timeout and returns the
	// previous value (OFFSET 0 keeps the subquery, and so the read, first).
	pgSetLockTimeoutSQL = `SELECT s.prev, set_config('lock_timeout', ?, true)
  FROM (SELECT current_setting('lock_timeout') AS prev OFFSET 0) s`
	// pgRestoreLockTimeoutSQL puts the previous lock_timeout back for the
	// rest of the transaction.
	pgRestoreLockTimeoutSQL = `SELECT set_config('lock_timeout', ?, true)`
)

// PurgeOpts tune Purge and CountExpired. A nil *PurgeOpts means batches of
// [DefaultPurgeBatch] and the system clock.
type PurgeOpts struct {
	// BatchSize is how many keys one DELETE removes; each batch is its own
	// short statement. CountExpired ignores it. Defaults to
	// DefaultPurgeBatch (1,000).
	BatchSize int
	// Clock is the clock the age is measured from. Defaults to
	// aggregate.SystemClock.
	Clock aggregate.Clock
}

// Purge deletes the keys that expired more than olderThan ago (0: every
// key expired by now), batch by batch, and returns how many it deleted.
// Run it periodically: expired keys are already treated as absent, Purge
// only reclaims their space.
//
// Errors: [ErrInvalidArgument] for a negative olderThan, the context's
// error, [ErrClosed], or the database error; the count is what was deleted
// before the error.
func Purge(ctx context.Context, db *gorm.DB, olderThan time.Duration, opts *PurgeOpts) (int64, error) {
	args, err := expired("purge", olderThan, opts)
	if err != nil {
		return 0, err
	}
	var batch int
	if opts != nil {
		batch = opts.BatchSize
	}
	return purge.Batches(ctx, db, purgeSQL, args, batch, func(err error) error { return wrapDB("purge", err) })
}

// CountExpired counts the keys that Purge with the same arguments would
// delete now (BatchSize is ignored): a dry run.
//
// Errors: [ErrInvalidArgument] for a negative olderThan, [ErrClosed], or
// the database error.
func CountExpired(ctx context.Context, db *gorm.DB, olderThan time.Duration, opts *PurgeOpts) (int64, error) {
	args, err := expired("count expired", olderThan, opts)
	if err != nil {
		return 0, err
	}
	var n int64
	if err := db.WithContext(ctx).Raw(countExpiredSQL, args).Scan(&n).Error; err != nil {
		return 0, wrapDB("count expired", err)
	}
	return n, nil
}

// expired returns the arguments of expiredWhere for Purge and
// CountExpired, or an error naming op for a negative age.
func expired(op string, olderThan time.Duration, opts *PurgeOpts) (map[string]any, error) {
	if olderThan < 0 {
		return nil, fmt.Errorf("idempotency: %s: %w: negative age %v", op, ErrInvalidArgument, olderThan)
	}
	var clock aggregate.Clock = aggregate.SystemClock{}
	if opts != nil && opts.Clock != nil {
		clock = opts.Clock
	}
	return map[string]any{"before": clock.Now().UTC().Add(-olderThan)}, nil
}

// session is one keyed request's transaction.
type session struct {
	tx       *gorm.DB
	owned    *uow.Owned // tx, with the units of work that join it
	release  func()     // returns what begin took, after the transaction ends
	prevLock string     // PostgreSQL: the lock_timeout to restore
	ended    bool
}

// begin starts a ledger transaction whose lock waits are bounded by the
// ledger's LockTimeout: on PostgreSQL with a transaction-local
// lock_timeout, on SQLite with the busy timeout of a connection held for
// the transaction (the wait happens at BEGIN IMMEDIATE).
func (l *Ledger) begin(ctx context.Context) (*session, error) {
	if l.dialect == dialect.Postgres {
		tx := l.db.WithContext(ctx).Begin()
		if tx.Error != nil {
			return nil, tx.Error
		}
		var prev, set string
		if err := tx.Raw(pgSetLockTimeoutSQL, fmt.Sprintf("%dms", l.lockMS)).Row().Scan(&prev, &set); err != nil {
			tx.Rollback()
			return nil, fmt.Errorf("set lock_timeout: %w", err)
		}
		return &session{tx: tx, owned: uow.Own(tx), release: func() {}, prevLock: prev}, nil
	}

	sqlDB, err := l.db.DB()
	if err != nil {
		return nil, err
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return nil, err
	}
	var prev int64
	if err := conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&prev); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("read busy_timeout: %w", err)
	}
	release := func() {
		// Put the pool's busy timeout back; a connection that cannot be
		// restored is discarded rather than returned to the pool.
		if _, err := conn.ExecContext(context.WithoutCancel(ctx), fmt.Sprintf("PRAGMA busy_timeout = %d", prev)); err != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		_ = conn.Close()
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("PRAGMA busy_timeout = %d", l.lockMS)); err != nil {
		release()
		return nil, fmt.Errorf("set busy_timeout: %w", err)
	}
	g := l.db.WithContext(ctx) // a new statement: setting its pool affects no one else
	g.Statement.ConnPool = conn
	tx := g.Begin()
	if tx.Error != nil {
		release()
		return nil, tx.Error
	}
	return &session{tx: tx, owned: uow.Own(tx), release: release}, nil
}

// afterInsert ends the part of the transaction bounded by LockTimeout.
func (s *session) afterInsert() error {
	if s.prevLock == "" {
		return nil
	}
	if err := s.tx.Exec(pgRestoreLockTimeoutSQL, s.prevLock).Error; err != nil {
		return fmt.Errorf("restore lock_timeout: %w", err)
	}
	return nil
}

// rollback ends the transaction without effect; it is a no-op once the
// session has ended.
func (s *session) rollback() {
	if s.ended {
		return
	}
	s.ended = true
	s.owned.Rollback()
	s.release()
}

// commit commits the transaction, then runs the after-commit hooks of the
// units that joined it (see uow.Owned).
func (s *session) commit() error {
	s.ended = true
	err := s.owned.Commit()
	s.release()
	return err
}

// isLockTimeout reports whether err means a wait for a lock held by another
// transaction ran out: PostgreSQL lock_not_available (55P03), SQLite
// SQLITE_BUSY or SQLITE_LOCKED ("database is locked").
func isLockTimeout(err error) bool {
	if err == nil {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "55P03"
	}
	var coded interface{ Code() int }
	if errors.As(err, &coded) {
		if c := coded.Code() & 0xff; c == 5 || c == 6 {
			return true
		}
	}
	return strings.Contains(err.Error(), "database is locked")
}
