package process

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/outbox"
)

// Operators' calls: they read and change processes by the table of their
// state model, without its Go type, so a command-line tool or a console
// can serve every process type.

var (
	// ErrInvalidTable is returned for a table name that is not a plain
	// SQL identifier (letters, digits and '_', not starting with a digit).
	ErrInvalidTable = errors.New("process: invalid table name")
	// ErrCompleted is returned by Abandon for a process already completed.
	ErrCompleted = errors.New("process: already completed")
)

// Info is a process as operators see it: the columns of Base.
type Info struct {
	Process     string
	TenantID    string
	Key         string
	Version     int64
	Completed   bool
	StartedAt   time.Time
	UpdatedAt   time.Time
	CompletedAt *time.Time
	// Timeouts maps each live timeout's name to its scheduled message's id.
	Timeouts Timeouts
}

// Filter narrows List.
type Filter struct {
	// Tenant and Key, when set, keep that tenant's processes, and that key.
	Tenant, Key string
	// Completed includes completed processes; by default only running ones.
	Completed bool
	// Limit is the most processes returned. Defaults to 100.
	Limit int
}

// validTable reports whether table is a plain identifier.
func validTable(table string) bool {
	if table == "" || len(table) > 63 || table[0] >= '0' && table[0] <= '9' {
		return false
	}
	for _, r := range table {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// ValidateTable returns nil for a table name List and Abandon accept: a
// plain SQL identifier. Errors: ErrInvalidTable.
func ValidateTable(table string) error {
	if !validTable(table) {
		return fmt.Errorf("%w: %q", ErrInvalidTable, table)
	}
	return nil
}

// Names returns the names of the timeouts, sorted.
func (t Timeouts) Names() []string {
	names := make([]string, 0, len(t))
	for name := range t {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// List returns the processes whose state is stored in table, started
// first first.
//
// Errors: ErrInvalidTable, or the database error.
func List(ctx context.Context, db *gorm.DB, table string, f Filter) ([]Info, error) {
	if err := ValidateTable(table); err != nil {
		return nil, err
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	q := db.WithContext(ctx).Table(table)
	if f.Tenant != "" {
		q = q.Where("tenant_id = ?", f.Tenant)
	}
	if f.Key != "" {
		q = q.Where("process_key = ?", f.Key)
	}
	if !f.Completed {
		q = q.Where("completed = ?", false)
	}
	var rows []Base
	if err := q.Order("started_at, tenant_id, process_key").Limit(f.Limit).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("process: list %s: %w", table, err)
	}
	out := make([]Info, len(rows))
	for i, b := range rows {
		out[i] = Info{Process: b.Process, TenantID: b.TenantID, Key: b.Key, Version: b.Version, Completed: b.Completed,
			StartedAt: b.StartedAt, UpdatedAt: b.UpdatedAt, CompletedAt: b.CompletedAt, Timeouts: b.Timeouts}
	}
	return out, nil
}

// Abandon completes, in one transaction, the running process of tenant
// and key whose state is in table, without a step: it cancels the
// process's live timeouts (a timeout already released is dropped when it
// arrives, as for any completed process) and marks it completed, bumping
// its version, so a step racing it fails with ErrConflict and is retried,
// then dropped. Later messages for it are dropped. It is what an operator
// does with a process stuck waiting for a message that will not come.
//
// Errors: ErrInvalidTable; ErrNotFound; ErrCompleted; or the database
// error.
func Abandon(ctx context.Context, db *gorm.DB, store *outbox.Store, table, tenant, key string) error {
	if err := ValidateTable(table); err != nil {
		return err
	}
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var b Base
		err := tx.Table(table).Where("tenant_id = ? AND process_key = ?", tenant, key).Take(&b).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return fmt.Errorf("%w: %s of tenant %s in %s", ErrNotFound, key, tenant, table)
		}
		if err != nil {
			return fmt.Errorf("process: abandon %s: %w", key, err)
		}
		if b.Completed {
			return fmt.Errorf("%w: %s of tenant %s in %s", ErrCompleted, key, tenant, table)
		}
		for name := range b.Timeouts {
			_, err := store.Cancel(ctx, tx, timeoutKey(b.Process, key, name), &outbox.CancelOpts{Tenant: tenant})
			if err != nil && !errors.Is(err, outbox.ErrCancelTooLate) && !errors.Is(err, outbox.ErrNotScheduled) {
				return fmt.Errorf("process: abandon %s: cancel %s: %w", key, name, err)
			}
		}
		now := store.Config().Clock.Now().UTC()
		res := tx.Table(table).Where("tenant_id = ? AND process_key = ? AND version = ?", tenant, key, b.Version).
			Updates(map[string]any{"completed": true, "completed_at": now, "updated_at": now, "version": b.Version + 1, "timeouts": Timeouts{}})
		if res.Error != nil {
			return fmt.Errorf("process: abandon %s: %w", key, res.Error)
		}
		if res.RowsAffected != 1 {
			return fmt.Errorf("%w: %s changed while it was abandoned", ErrConflict, key)
		}
		return nil
	})
}

// ErrInvalidRetention is returned by Purge for a retention that is not
// positive: it would delete tombstones late messages still need.
var ErrInvalidRetention = errors.New("process: retention must be positive")

// PurgeOpts are the optional arguments of [Purge]. A nil *PurgeOpts means
// the defaults.
type PurgeOpts struct {
	// Tenant, when set, purges only that tenant's processes.
	Tenant string
	// Batch is how many rows one DELETE removes. Defaults to 1,000.
	Batch int
	// DryRun counts what would be deleted and deletes nothing.
	DryRun bool
	// Now is the time retention is counted back from. Defaults to the
	// system clock.
	Now func() time.Time
}

// Purge deletes, from table, the processes that completed more than
// retention ago, in batches of PurgeOpts.Batch rows each committed on its
// own, and returns how many it deleted (with DryRun: how many it would).
// Running processes are never deleted.
//
// A completed process's row is its tombstone: while it is there, a late
// message for the process is dropped. Once it is purged, a late message
// of a type that starts the process starts it again, and any other is
// handled by its Missing policy. Choose retention longer than any message
// for a completed process can arrive late: at least the consumer's inbox
// retention (its dedup window for redeliveries).
//
// Each batch finds its rows by completed and completed_at, which Base
// does not index: on a large table, add an index on completed_at (for
// example CREATE INDEX CONCURRENTLY ... ON table (completed_at) WHERE
// completed) so that a batch does not read the whole table.
//
// Errors: ErrInvalidTable; ErrInvalidRetention; or the database error.
func Purge(ctx context.Context, db *gorm.DB, table string, retention time.Duration, opts *PurgeOpts) (int64, error) {
	if err := ValidateTable(table); err != nil {
		return 0, err
	}
	if retention <= 0 {
		return 0, fmt.Errorf("%w: %v", ErrInvalidRetention, retention)
	}
	var o PurgeOpts
	if opts != nil {
		o = *opts
	}
	if o.Batch <= 0 {
		o.Batch = 1000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	before := o.Now().UTC().Add(-retention)
	expired := func(q *gorm.DB) *gorm.DB {
		q = q.Table(table).Where("completed = ? AND completed_at < ?", true, before)
		if o.Tenant != "" {
			q = q.Where("tenant_id = ?", o.Tenant)
		}
		return q
	}
	if o.DryRun {
		var n int64
		if err := expired(db.WithContext(ctx)).Count(&n).Error; err != nil {
			return 0, fmt.Errorf("process: purge %s: %w", table, err)
		}
		return n, nil
	}
	var total int64
	for {
		batch := expired(db.WithContext(ctx)).Select("tenant_id, process_key").Limit(o.Batch)
		res := db.WithContext(ctx).Table(table).Where("(tenant_id, process_key) IN (?)", batch).Delete(&Base{})
		if res.Error != nil {
			return total, fmt.Errorf("process: purge %s: %w", table, res.Error)
		}
		total += res.RowsAffected
		if res.RowsAffected < int64(o.Batch) {
			return total, nil
		}
	}
}
