package inbox

import (
	"context"
	"time"

	"github.com/oklog/ulid/v2"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/migrate"
	ipartition "github.com/bentoevents/bento/internal/partition"
	"github.com/bentoevents/bento/partition"
)

// DefaultRetention is how long a partitioned inbox keeps records by
// default: 30 days from the creation of the message (its id's time).
const DefaultRetention = 30 * 24 * time.Hour

// MigrateWith is [Migrate] with options; nil opts means none. With
// opts.Partitioning (see [partition.MigrateOpts]) it creates
// inbox_messages on PostgreSQL partitioned by message_id in ranges of
// ULIDs: bento's message ids are ULIDs (the outbox event id), whose first
// ten characters encode when the event was created, so a range of ids is a
// range of time, every delivery of a message lands in the same partition,
// and the primary key (consumer, message_id) stays the dedup across the
// whole table. Ids that are not ULIDs go to the default partition.
// [Maintain] keeps the partitions in shape. A table keeps the layout it was
// created with, so later calls of Migrate upgrade a partitioned table too.
//
// Errors: dialect errors for an unsupported database;
// partition.ErrUnsupported, partition.ErrUnknownInterval,
// partition.ErrNotPartitioned, partition.ErrIntervalMismatch or a
// *partition.StepError when partitioning is asked; ErrClosed; or the
// database error.
func MigrateWith(ctx context.Context, db *gorm.DB, opts *partition.MigrateOpts) error {
	if opts == nil || opts.Partitioning == partition.None {
		return Migrate(ctx, db)
	}
	err := ipartition.Setup(ctx, db, table, *opts, func(ctx context.Context) error {
		return migrate.UpVariant(ctx, db, "inbox", Migrations(), "partitioned")
	})
	if err != nil {
		return wrapDB("migrate", err)
	}
	return nil
}

// table describes partitioned inbox_messages to the maintenance engine.
var table = ipartition.Table{
	Name:      "inbox_messages",
	Bound:     ulidBound,
	Retention: DefaultRetention,
}

// ulidBound is the smallest ULID of time t, cut to its ten time characters:
// in byte order it sorts before every id created at or after t.
func ulidBound(t time.Time) string {
	var u ulid.ULID
	_ = u.SetTime(ulid.Timestamp(t)) // bento's partitions are far below ULID's year 10889
	return "'" + u.String()[:10] + "'"
}

// Maintain keeps a partitioned inbox_messages table (see [MigrateWith]) in
// shape; run it periodically (hourly for Daily, daily for Monthly) from one
// or several processes. It creates the partitions from the current one to
// opts.Ahead after it, and drops the partitions of message ids created at
// least opts.Retention ago, each in a short transaction with a lock timeout.
// A nil opts means defaults; opts.Retention defaults to [DefaultRetention]
// (30 days), the dedup window, as with Purge: a message delivered again
// after its record was dropped is applied again. Partitions are never
// sealed, so opts.SealAfter is ignored, and the result's Sealed and Kept
// stay empty.
//
// Records in the default partition (ids that are not ULIDs) are never
// dropped: Purge removes them by age.
//
// Errors: partition.ErrUnsupported, partition.ErrNotPartitioned,
// ErrClosed, *partition.StepError (possibly wrapping
// partition.ErrLockTimeout), or the database error.
func Maintain(ctx context.Context, db *gorm.DB, opts *partition.MaintainOpts) (*partition.MaintainResult, error) {
	res, err := ipartition.Maintain(ctx, db, table, opts)
	if err != nil {
		return res, wrapDB("maintain", err)
	}
	return res, nil
}
