package outbox

import (
	"context"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/migrate"
	ipartition "github.com/bentoevents/bento/internal/partition"
	"github.com/bentoevents/bento/internal/purge"
	"github.com/bentoevents/bento/partition"
)

// DefaultRetention is the outbox's default of
// [partition.MaintainOpts].Retention: 7 days.
const DefaultRetention = 7 * 24 * time.Hour

// table describes partitioned outbox_events to the maintenance engine.
var table = ipartition.Table{
	Name:      "outbox_events",
	Bound:     partitionBound,
	Pending:   partitionPendingSQL,
	Seal:      sealedCheck,
	AfterDrop: freeKeys,
	Retention: DefaultRetention,
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

// migratePartitioned applies the partitioned variant and sets up its
// partitions.
func migratePartitioned(ctx context.Context, db *gorm.DB, o *partition.MigrateOpts) error {
	err := ipartition.Setup(ctx, db, table, *o, func(ctx context.Context) error {
		return migrate.UpVariant(ctx, db, component, Migrations(), "partitioned")
	})
	if err != nil {
		return wrapDB("outbox: migrate", err)
	}
	return nil
}

// Maintain keeps a partitioned outbox_events table (see [MigrateWith]) in
// shape; run it periodically (hourly for Daily, daily for Monthly) from one
// or several processes. It
//   - creates the partitions from the current one to opts.Ahead after it;
//   - seals partitions past opts.SealAfter whose rows are all sent
//     (CHECK (status = 'sent')), so claims skip them;
//   - drops partitions whose range ended opts.Retention ago or more and
//     whose rows are all sent, checked under the table lock the drop takes:
//     a partition holding a new, publishing, failed or dead row is kept
//     (listed in the result's Kept);
//   - frees the dedup keys and aggregate versions of dropped events.
//
// A nil opts means defaults; opts.Retention defaults to [DefaultRetention]
// (7 days). Each step is a short transaction with a lock timeout,
// serialised across processes by an advisory lock. Maintain carries on past
// a failed step and returns what it did along with the failures joined.
// Rows in the default partition are never dropped: [Store.PurgeSent]
// removes them.
//
// Errors: partition.ErrUnsupported, partition.ErrNotPartitioned,
// ErrClosed, *partition.StepError (possibly wrapping
// partition.ErrLockTimeout), or the database error.
func Maintain(ctx context.Context, db *gorm.DB, opts *partition.MaintainOpts) (*partition.MaintainResult, error) {
	res, err := ipartition.Maintain(ctx, db, table, opts)
	if err != nil {
		return res, wrapDB("outbox: maintain", err)
	}
	return res, nil
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
	if err := tx.WithContext(ctx).Raw(tableKindSQL).
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
