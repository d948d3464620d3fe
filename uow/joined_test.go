package uow_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/uow"
)

// TestJoinedUnitNeverCommitsTheCallersTransaction checks RunTx and units
// begun under a context carrying a transaction: their work becomes visible
// only when the caller commits, disappears when the caller rolls back, and a
// failing joined unit undoes only its own work.
func TestJoinedUnitNeverCommitsTheCallersTransaction(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		track := func(id string) func(ctx context.Context, u *uow.UnitOfWork) error {
			return func(ctx context.Context, u *uow.UnitOfWork) error {
				assert.True(t, u.Joined())
				return u.Track(OpenAccount(id, "ann"))
			}
		}

		// The caller rolls back: nothing of the joined unit survives.
		outer := db.Begin()
		require.NoError(t, e.units.RunTx(ctx, outer, track("rolled-back")))
		require.NoError(t, outer.Rollback().Error)
		assert.Equal(t, int64(0), e.count(t, &Account{}))
		assert.Empty(t, e.outboxRows(t))

		// The caller commits: a failed joined unit left no trace, the
		// successful ones are committed with the caller's own write.
		outer = db.Begin()
		require.NoError(t, outer.Create(&Account{Base: OpenAccount("callers", "x").Base}).Error)
		require.NoError(t, e.units.RunTx(ctx, outer, track("kept-1")))
		err := e.units.RunTx(ctx, outer, func(ctx context.Context, u *uow.UnitOfWork) error {
			require.NoError(t, track("failed")(ctx, u))
			return errInjected
		})
		require.ErrorIs(t, err, errInjected)
		// Begin under a context carrying the transaction joins it too.
		joinedCtx := uow.ContextWithTx(ctx, outer)
		u, err := e.units.Begin(joinedCtx, nil)
		require.NoError(t, err)
		require.True(t, u.Joined())
		require.NoError(t, u.Track(OpenAccount("kept-2", "ann")))
		require.NoError(t, u.Commit(joinedCtx))

		// Not visible outside the caller's transaction yet (SQLite would
		// block readers of the locked file only for writes, so read through
		// the outer transaction instead and check after commit).
		require.NoError(t, outer.Commit().Error)
		var ids []string
		require.NoError(t, db.Model(&Account{}).Order("id").Pluck("id", &ids).Error)
		assert.Equal(t, []string{"callers", "kept-1", "kept-2"}, ids)
		rows := e.outboxRows(t)
		require.Len(t, rows, 2)
		assert.ElementsMatch(t, []string{"kept-1", "kept-2"}, []string{rows[0].AggregateID, rows[1].AggregateID})
	})
}

// TestJoinedConflictIsNotRetried checks that Run does not retry inside a
// caller's transaction: the caller owns the transaction and decides.
func TestJoinedConflictIsNotRetried(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		e.commitNew(t, "acc-1")
		stale := e.load(t, "acc-1")
		stale.Version--
		outer := db.Begin()
		defer outer.Rollback()
		calls := 0
		err := e.units.RunTx(ctx, outer, func(ctx context.Context, u *uow.UnitOfWork) error {
			calls++
			require.NoError(t, u.Track(stale))
			return stale.Deposit(1)
		})
		require.ErrorIs(t, err, uow.ErrConcurrencyConflict)
		assert.Equal(t, 1, calls)
		// The caller's transaction is still usable after the failed unit.
		require.NoError(t, outer.Exec("SELECT 1").Error)
	})
}

// TestChangeWithoutEventsStillChecksVersion saves an aggregate changed
// without recording an event: its version still advances, so a concurrent
// writer working from the old version conflicts instead of overwriting.
func TestChangeWithoutEventsStillChecksVersion(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		e.commitNew(t, "acc-1")
		first, second := e.load(t, "acc-1"), e.load(t, "acc-1")

		first.Owner = "renamed"
		require.NoError(t, e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Track(first) }))
		assert.Equal(t, int64(2), first.Version)

		second.Owner = "lost update"
		err := e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Track(second) })
		require.ErrorIs(t, err, uow.ErrConcurrencyConflict)
		assert.Equal(t, int64(1), second.Version, "a failed commit restores the version")

		stored := e.load(t, "acc-1")
		assert.Equal(t, "renamed", stored.Owner)
		assert.Equal(t, int64(2), stored.Version)
		assert.Len(t, e.outboxRows(t), 1, "no event was written for the change")
	})
}

// TestCreatingAnExistingIDConflicts checks that two units creating the same
// aggregate id cannot both succeed.
func TestCreatingAnExistingIDConflicts(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		e.commitNew(t, "acc-1")
		dup := OpenAccount("acc-1", "bob")
		err := e.units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error { return u.Track(dup) })
		require.ErrorIs(t, err, uow.ErrConcurrencyConflict)
		assert.Len(t, e.outboxRows(t), 1)
		assert.Equal(t, "ann", e.load(t, "acc-1").Owner)
	})
}
