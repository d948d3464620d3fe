package outbox

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/partition"
	"github.com/bentoevents/bento/internal/purge"
)

// Interval is the time span of one partition of a partitioned table.
type Interval = partition.Interval

const (
	// Daily partitions span one UTC day: outbox_events_pYYYYMMDD.
	Daily = partition.Daily
	// Monthly partitions span one UTC calendar month: outbox_events_pYYYYMM.
	Monthly = partition.Monthly
)

var (
	// ErrPartitioningUnsupported is returned when partitioning is asked of
	// a database other than PostgreSQL.
	ErrPartitioningUnsupported = partition.ErrUnsupported
	// ErrNotPartitioned is returned by Maintain for a table created without
	// partitioning, and by Migrate when partitioning is asked of a table
	// that already exists unpartitioned (converting one is a manual job).
	ErrNotPartitioned = partition.ErrNotPartitioned
	// ErrIntervalMismatch is returned by Migrate when the table is
	// partitioned with another interval than the one asked for.
	ErrIntervalMismatch = partition.ErrIntervalMismatch
	// ErrLockTimeout is returned (inside a *MaintenanceError) when a
	// maintenance step could not take a table lock within
	// MaintainOpts.LockTimeout, after retries. The step changed nothing;
	// the next run tries again.
	ErrLockTimeout = partition.ErrLockTimeout
)

// MaintenanceError says which step (Step: "create", "seal", "drop" or
// "cleanup") failed on which partition (Partition) of which table (Table),
// and why (Err, which may wrap ErrLockTimeout). Use errors.As.
type MaintenanceError = partition.StepError

// Defaults of MigrateOpts and MaintainOpts.
const (
	DefaultRetention   = 7 * 24 * time.Hour
	DefaultSealAfter   = time.Hour
	DefaultLockTimeout = 200 * time.Millisecond
)

// MigrateOpts are the options of [MigrateWith]. A nil *MigrateOpts means an
// unpartitioned table.
type MigrateOpts struct {
	// Partitioning, when set (Daily or Monthly), creates outbox_events as
	// a table partitioned by created_at in ranges of this interval, with a
	// default partition, and creates the partitions from now's to Ahead
	// after it. PostgreSQL only. It takes effect when the table is created:
	// an existing table keeps the layout it was created with. Defaults to
	// none.
	Partitioning Interval
	// Ahead is how many partitions after the current one are created.
	// Defaults to 7 for Daily and 2 for Monthly.
	Ahead int
	// Now is the clock the first partitions are created from. Defaults to
	// time.Now.
	Now func() time.Time
}

// MaintainOpts configure [Maintain]. A nil *MaintainOpts means defaults.
type MaintainOpts struct {
	// Ahead is how many partitions after the current one must exist, so
	// rows never fall into the default partition while maintenance runs at
	// least that often. Defaults to 7 for Daily and 2 for Monthly.
	Ahead int
	// Retention: a partition whose range ended at least this long ago is
	// dropped if every row in it is sent. Defaults to 7 days.
	Retention time.Duration
	// SealAfter: a partition whose range ended at least this long ago and
	// whose rows are all sent gets a CHECK (status = 'sent') constraint, so
	// claims no longer look into it (partition pruning by constraint). It
	// must exceed the longest transaction that writes events plus any clock
	// skew between writers: a late event stamped inside a sealed range
	// makes its commit fail (loudly: nothing is lost). Defaults to 1 hour.
	SealAfter time.Duration
	// LockTimeout bounds every wait of a maintenance step for a table
	// lock; a step that times out is retried twice, then reported with
	// ErrLockTimeout. Claims and commits wait behind a step at most this
	// long. Defaults to 200ms.
	LockTimeout time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// DryRun reports what the run would do without doing it: no lock is
	// taken and nothing changes; the result lists the partitions that would
	// be created, sealed, dropped or kept. Defaults to false.
	DryRun bool
}

// MaintainResult says what a [Maintain] run did, by partition name.
type MaintainResult struct {
	// Created, Sealed and Dropped list the partitions each step changed.
	Created, Sealed, Dropped []string
	// Kept lists partitions due for sealing or dropping that still hold
	// rows that are not sent (new, publishing, failed or dead). A dead row
	// keeps its partition until it is requeued and sent, or discarded.
	Kept []string
	// Blocked lists partitions not created because the default partition
	// already holds rows of their range (maintenance fell behind); those
	// rows stay in the default partition, which PurgeSent cleans.
	Blocked []string
}

// table describes partitioned outbox_events to the maintenance engine.
var table = partition.Table{
	Name:  "outbox_events",
	Bound: func(t time.Time) string { return "'" + t.UTC().Format("2006-01-02 15:04:05") + "+00'" },
	Pending: func(p string) string {
		// One EXISTS per partial index.
		return `SELECT EXISTS (SELECT 1 FROM ` + p + ` WHERE status IN ('new', 'publishing', 'failed') AND NOT held)
		    OR EXISTS (SELECT 1 FROM ` + p + ` WHERE held)
		    OR EXISTS (SELECT 1 FROM ` + p + ` WHERE status = 'dead')`
	},
	Seal:      "status = 'sent'",
	AfterDrop: freeKeys,
}

// freeKeys deletes, in short batches, the dedup keys and aggregate
// versions reserved for events created before end whose rows are gone.
func freeKeys(ctx context.Context, db *gorm.DB, end time.Time) error {
	for _, query := range []string{freeDedupKeysSQL, freeVersionsSQL} {
		if _, err := purge.Batches(ctx, db, query, map[string]any{"end": end}, 0, func(err error) error { return err }); err != nil {
			return err
		}
	}
	return nil
}

func clock(now func() time.Time) time.Time {
	if now == nil {
		return time.Now()
	}
	return now()
}

// migratePartitioned applies the partitioned variant and sets up its
// partitions.
func migratePartitioned(ctx context.Context, db *gorm.DB, o *MigrateOpts) error {
	if d, err := dialect.Of(db); err != nil || d != dialect.Postgres {
		return fmt.Errorf("outbox: migrate: %w (%s)", ErrPartitioningUnsupported, d)
	}
	if err := migrateUp(ctx, db, "partitioned"); err != nil {
		return err
	}
	err := partition.Setup(ctx, db, table, o.Partitioning, clock(o.Now), o.Ahead, DefaultLockTimeout)
	if err != nil {
		return wrapDB("outbox: migrate", err)
	}
	return nil
}

// Maintain keeps a partitioned outbox_events table (see [MigrateOpts] and [MigrateWith]) in
// shape; run it periodically (hourly for Daily, daily for Monthly) from one
// or several processes. It
//   - creates the partitions from the current one to opts.Ahead after it;
//   - seals partitions past opts.SealAfter whose rows are all sent, so
//     claims skip them;
//   - drops partitions whose range ended opts.Retention ago or more and
//     whose rows are all sent, checked under the table lock the drop takes:
//     a partition holding a new, publishing, failed or dead row is kept;
//   - frees the dedup keys of dropped events.
//
// Each step is a short transaction with a lock timeout, serialised across
// processes by an advisory lock. Maintain carries on past a failed step and
// returns what it did along with the failures joined.
//
// Errors: ErrPartitioningUnsupported, ErrNotPartitioned, ErrClosed,
// *MaintenanceError (possibly wrapping ErrLockTimeout), or the database
// error.
func Maintain(ctx context.Context, db *gorm.DB, opts *MaintainOpts) (*MaintainResult, error) {
	var o MaintainOpts
	if opts != nil {
		o = *opts
	}
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if o.SealAfter <= 0 {
		o.SealAfter = DefaultSealAfter
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	res, err := partition.Maintain(ctx, db, table, partition.Opts{
		Ahead:       o.Ahead,
		Retention:   o.Retention,
		SealAfter:   o.SealAfter,
		LockTimeout: o.LockTimeout,
		Now:         clock(o.Now).UTC(),
		DryRun:      o.DryRun,
	})
	out := &MaintainResult{Created: res.Created, Sealed: res.Sealed, Dropped: res.Dropped, Kept: res.Kept, Blocked: res.Blocked}
	if err != nil {
		return out, wrapDB("outbox: maintain", err)
	}
	return out, nil
}

// partitioned caches whether outbox_events is partitioned: 0 unknown, 1 no,
// 2 yes.
type partitioned struct{ state atomic.Int32 }

// isPartitioned reports whether the store's table is partitioned. Only a
// definite answer is cached, so a store created before Migrate learns it
// on first use.
func (s *Store) isPartitioned(ctx context.Context, tx *gorm.DB) (bool, error) {
	if s.dialect != dialect.Postgres {
		return false, nil
	}
	switch s.partitioned.state.Load() {
	case 1:
		return false, nil
	case 2:
		return true, nil
	}
	var kind *string
	if err := tx.WithContext(ctx).Raw("SELECT relkind::text FROM pg_class WHERE oid = to_regclass('outbox_events')").
		Scan(&kind).Error; err != nil {
		return false, wrapDB("outbox: read table kind", err)
	}
	if kind == nil {
		return false, nil
	}
	yes := *kind == "p"
	if yes {
		s.partitioned.state.Store(2)
	} else {
		s.partitioned.state.Store(1)
	}
	return yes, nil
}
