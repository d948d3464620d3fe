// Package partition is the vocabulary of bento's time-partitioned
// PostgreSQL tables, outbox_events and inbox_messages: the [Interval] a
// table is partitioned by, the options of creating one ([MigrateOpts]) and
// of maintaining it ([MaintainOpts]), what a maintenance run did
// ([MaintainResult]), and the errors both tables return.
//
// Each table has its own functions, which take these types:
// outbox.MigrateWith and outbox.Maintain for outbox_events,
// inbox.MigrateWith and inbox.Maintain for inbox_messages. Their docs say
// what a range of the table is keyed on and the table's defaults, such as
// its retention.
//
// # Partitions
//
// A partitioned table has one partition per UTC day (<table>_pYYYYMMDD) or
// per UTC calendar month (<table>_pYYYYMM), and a <table>_default partition
// that catches rows outside every range and is never dropped. Maintenance
// creates partitions ahead of time, seals old ones whose rows are all final
// (outbox_events only) and drops those past retention. Every step is a
// short transaction that waits at most [MaintainOpts].LockTimeout for a
// table lock; several processes may maintain the same table at once.
// Both options carry a Clock, the aggregate.Clock bento uses everywhere
// (the system clock by default), so tests can set the time partitions are
// created and dropped from.
//
// # Errors
//
// Partitioning needs PostgreSQL ([ErrUnsupported]) and a table created
// partitioned ([ErrNotPartitioned]), with the interval it was created with
// ([ErrIntervalMismatch]). A failed maintenance step is a [*StepError],
// which wraps [ErrLockTimeout] when the step gave up waiting for a lock.
package partition

import (
	"errors"
	"fmt"
	"time"

	"github.com/bentoevents/bento/aggregate"
)

// Interval is the time span of one partition of a partitioned table.
type Interval int

const (
	// None means an unpartitioned table.
	None Interval = iota
	// Daily partitions span one UTC day: <table>_pYYYYMMDD.
	Daily
	// Monthly partitions span one UTC calendar month: <table>_pYYYYMM.
	Monthly
)

// String returns "daily", "monthly" or "none".
func (i Interval) String() string {
	switch i {
	case None:
		return "none"
	case Daily:
		return "daily"
	case Monthly:
		return "monthly"
	default:
		return fmt.Sprintf("interval(%d)", int(i))
	}
}

// ParseInterval returns the Interval named s, "daily" or "monthly".
//
// Errors: ErrUnknownInterval.
func ParseInterval(s string) (Interval, error) {
	for _, i := range []Interval{Daily, Monthly} {
		if i.String() == s {
			return i, nil
		}
	}
	return None, fmt.Errorf("%w: %q (want daily or monthly)", ErrUnknownInterval, s)
}

// DefaultAhead is how many partitions after the current one are kept
// created when the options leave Ahead zero: 7 for Daily (a week), 2 for
// Monthly.
func (i Interval) DefaultAhead() int {
	if i == Monthly {
		return 2
	}
	return 7
}

var (
	// ErrUnsupported is returned when partitioning is asked of a database
	// other than PostgreSQL.
	ErrUnsupported = errors.New("partition: partitioned tables need PostgreSQL")
	// ErrNotPartitioned is returned by maintenance of a table created
	// without partitioning, and by a migration that asks for partitioning
	// of a table that already exists unpartitioned (converting one is a
	// manual job).
	ErrNotPartitioned = errors.New("partition: table is not partitioned")
	// ErrIntervalMismatch is returned by a migration that asks for another
	// interval than the one the table was created with.
	ErrIntervalMismatch = errors.New("partition: table is partitioned with another interval")
	// ErrUnknownInterval is returned for an interval other than Daily or
	// Monthly.
	ErrUnknownInterval = errors.New("partition: unknown interval")
	// ErrLockTimeout is returned (inside a *StepError) when a maintenance
	// step could not take a table lock within MaintainOpts.LockTimeout,
	// after retries. The step changed nothing; the next run tries again.
	ErrLockTimeout = errors.New("partition: maintenance timed out waiting for a lock")
)

// StepError says which maintenance step failed on which partition of which
// table, and why. Use errors.As.
type StepError struct {
	// Table is the partitioned table, Partition the partition concerned.
	Table, Partition string
	// Step is "create", "seal", "drop" or "cleanup".
	Step string
	// Err is the cause; it wraps ErrLockTimeout for a lock timeout.
	Err error
}

// Error implements error.
func (e *StepError) Error() string {
	return fmt.Sprintf("%s: %s partition %s: %v", e.Table, e.Step, e.Partition, e.Err)
}

// Unwrap returns the cause.
func (e *StepError) Unwrap() error { return e.Err }

// Defaults of MaintainOpts shared by every table. Retention is each
// table's own: see its Maintain function.
const (
	DefaultSealAfter   = time.Hour
	DefaultLockTimeout = 200 * time.Millisecond
)

// MigrateOpts are the options of a table's MigrateWith. A nil *MigrateOpts
// means an unpartitioned table.
type MigrateOpts struct {
	// Partitioning, when set (Daily or Monthly), creates the table
	// partitioned in ranges of this interval, with a default partition, and
	// creates the partitions from the current one to Ahead after it.
	// PostgreSQL only. It takes effect when the table is created: an
	// existing table keeps the layout it was created with. Defaults to
	// None.
	Partitioning Interval
	// Ahead is how many partitions after the current one are created.
	// Defaults to the interval's DefaultAhead: 7 for Daily, 2 for Monthly.
	Ahead int
	// Clock gives the time the first partitions are created from. Defaults
	// to aggregate.SystemClock.
	Clock aggregate.Clock
}

// MaintainOpts are the options of a table's Maintain. A nil *MaintainOpts
// means defaults.
type MaintainOpts struct {
	// Ahead is how many partitions after the current one must exist, so
	// rows never fall into the default partition while maintenance runs at
	// least that often. Defaults to the interval's DefaultAhead: 7 for
	// Daily, 2 for Monthly.
	Ahead int
	// Retention: a partition whose range ended at least this long ago is
	// dropped, unless the table keeps it for rows not yet final (see the
	// table's Maintain). Defaults to the table's retention, which its
	// Maintain documents.
	Retention time.Duration
	// SealAfter, for a table whose rows become final (outbox_events): a
	// partition whose range ended at least this long ago and whose rows are
	// all final gets a CHECK constraint saying so, and queries for rows not
	// yet final skip it. It must exceed the longest transaction that writes
	// to the table plus any clock skew between writers: a late row stamped
	// inside a sealed range makes its commit fail (loudly: nothing is lost).
	// Tables that are never sealed ignore it. Defaults to DefaultSealAfter
	// (1 hour).
	SealAfter time.Duration
	// LockTimeout bounds every wait of a maintenance step for a table
	// lock; a step that times out is retried twice, then reported with
	// ErrLockTimeout, and the run stops. Transactions on the table wait
	// behind a step at most this long. Defaults to DefaultLockTimeout
	// (200ms).
	LockTimeout time.Duration
	// Clock gives the current time. Defaults to aggregate.SystemClock.
	Clock aggregate.Clock
	// DryRun reports what the run would do without doing it: no lock is
	// taken and nothing changes; the result lists the partitions that would
	// be created, sealed, dropped or kept. Defaults to false.
	DryRun bool
}

// MaintainResult says what a maintenance run did (or, for a dry run, would
// do), by partition name.
type MaintainResult struct {
	// Created, Sealed and Dropped list the partitions each step changed.
	Created, Sealed, Dropped []string
	// Kept lists partitions due for sealing or dropping that still hold
	// rows not yet final (for outbox_events: new, publishing, failed or
	// dead). A dead row keeps its partition until it is requeued and sent,
	// or discarded.
	Kept []string
	// Blocked lists partitions not created because the default partition
	// already holds rows of their range (maintenance fell behind); those
	// rows stay in the default partition, which the table's purge cleans.
	Blocked []string
}
