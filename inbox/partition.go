package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/migrate"
	"github.com/bentoevents/bento/internal/partition"
	"github.com/bentoevents/bento/outbox"
)

// DefaultRetention is how long a partitioned inbox keeps records by
// default: 30 days from the creation of the message (its id's time).
const DefaultRetention = 30 * 24 * time.Hour

// MigrateOpts are the options of [MigrateWith]. A nil *MigrateOpts means an
// unpartitioned table.
type MigrateOpts struct {
	// Partitioning, when set (outbox.Daily or outbox.Monthly), creates
	// inbox_messages partitioned by message_id in ranges of ULIDs: bento's
	// message ids are ULIDs (the outbox event id), whose first ten
	// characters encode when the event was created, so a range of ids is a
	// range of time, every delivery of a message lands in the same
	// partition, and the primary key (consumer, message_id) stays the
	// dedup across the whole table. Ids that are not ULIDs go to the
	// default partition. PostgreSQL only. Defaults to none.
	Partitioning outbox.Interval
	// Ahead is how many partitions after the current one are created.
	// Defaults to 7 for Daily and 2 for Monthly.
	Ahead int
	// Now is the clock the first partitions are created from. Defaults to
	// time.Now.
	Now func() time.Time
}

// MigrateWith is [Migrate] with options; nil opts means none. With
// opts.Partitioning it creates a partitioned table on PostgreSQL: see
// [MigrateOpts] and [Maintain]. A table keeps the layout it was created with,
// so later calls of Migrate upgrade a partitioned table too.
//
// Errors: dialect errors for an unsupported database;
// outbox.ErrPartitioningUnsupported, outbox.ErrNotPartitioned,
// outbox.ErrIntervalMismatch or an *outbox.MaintenanceError when
// partitioning is asked; ErrClosed; or the database error.
func MigrateWith(ctx context.Context, db *gorm.DB, opts *MigrateOpts) error {
	if opts == nil || opts.Partitioning == partition.None {
		return Migrate(ctx, db)
	}
	if d, err := dialect.Of(db); err != nil || d != dialect.Postgres {
		return fmt.Errorf("inbox: migrate: %w (%s)", outbox.ErrPartitioningUnsupported, d)
	}
	if err := migrate.UpVariant(ctx, db, "inbox", Migrations(), "partitioned"); err != nil {
		return wrapDB("migrate", err)
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	if err := partition.Setup(ctx, db, table, opts.Partitioning, now(), opts.Ahead, outbox.DefaultLockTimeout); err != nil {
		return wrapDB("migrate", err)
	}
	return nil
}

// MaintainOpts configure [Maintain]. A nil *MaintainOpts means defaults.
type MaintainOpts struct {
	// Ahead is how many partitions after the current one must exist.
	// Defaults to 7 for Daily and 2 for Monthly.
	Ahead int
	// Retention: a partition whose range of message times ended at least
	// this long ago is dropped. It is the dedup window, as with Purge: a
	// message delivered again after its record was dropped is applied
	// again. Defaults to 30 days.
	Retention time.Duration
	// LockTimeout bounds every wait for a table lock; a step that times
	// out is retried twice, then reported with outbox.ErrLockTimeout, and
	// the run stops. Handlers' transactions wait behind a step at most this
	// long. Defaults to 200ms.
	LockTimeout time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// DryRun reports what the run would do without doing it: no lock is
	// taken and nothing changes; the result lists the partitions that would
	// be created, sealed, dropped or kept. Defaults to false.
	DryRun bool
}

// table describes partitioned inbox_messages to the maintenance engine.
var table = partition.Table{
	Name:  "inbox_messages",
	Bound: ulidBound,
}

// ulidBound is the smallest ULID of time t, cut to its ten time characters:
// in byte order it sorts before every id created at or after t.
func ulidBound(t time.Time) string {
	var u ulid.ULID
	_ = u.SetTime(ulid.Timestamp(t)) // bento's partitions are far below ULID's year 10889
	return "'" + u.String()[:10] + "'"
}

// Maintain keeps a partitioned inbox_messages table (see [MigrateOpts]) in
// shape; run it periodically (hourly for Daily, daily for Monthly) from one
// or several processes. It creates the partitions from the current one to
// opts.Ahead after it, and drops the partitions of message ids created at
// least opts.Retention ago, each in a short transaction with a lock timeout.
// The result lists partitions by name; Sealed and Kept stay empty.
//
// Records in the default partition (ids that are not ULIDs) are never
// dropped: Purge removes them by age.
//
// Errors: outbox.ErrPartitioningUnsupported, outbox.ErrNotPartitioned,
// ErrClosed, *outbox.MaintenanceError (possibly wrapping
// outbox.ErrLockTimeout), or the database error.
func Maintain(ctx context.Context, db *gorm.DB, opts *MaintainOpts) (*outbox.MaintainResult, error) {
	var o MaintainOpts
	if opts != nil {
		o = *opts
	}
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = outbox.DefaultLockTimeout
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	res, err := partition.Maintain(ctx, db, table, partition.Opts{
		Ahead: o.Ahead, Retention: o.Retention, LockTimeout: o.LockTimeout, Now: now().UTC(), DryRun: o.DryRun,
	})
	out := &outbox.MaintainResult{Created: res.Created, Dropped: res.Dropped, Blocked: res.Blocked}
	if err != nil {
		return out, wrapDB("maintain", err)
	}
	return out, nil
}
