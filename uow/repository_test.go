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

// TestAddAndSaveCheckIntent checks that Add takes only new aggregates and
// Save only stored ones, and that both commit like Track.
func TestAddAndSaveCheckIntent(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		fresh := OpenAccount("acc-1", "ann")
		err := e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			require.ErrorIs(t, u.Save(fresh), uow.ErrInvalidAggregate)
			return u.Add(fresh)
		})
		require.NoError(t, err)

		loaded := e.load(t, "acc-1")
		require.NoError(t, loaded.Deposit(7))
		err = e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			require.ErrorIs(t, u.Add(loaded), uow.ErrInvalidAggregate)
			return u.Save(loaded)
		})
		require.NoError(t, err)
		assert.Equal(t, int64(7), e.load(t, "acc-1").Balance)
		assert.Len(t, e.outboxRows(t), 2)

		// Save of a stale copy conflicts at commit.
		stale := e.load(t, "acc-1")
		stale.Version--
		require.NoError(t, stale.Deposit(1))
		err = e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Save(stale) })
		require.ErrorIs(t, err, uow.ErrConcurrencyConflict)
		assert.Len(t, e.outboxRows(t), 2)
	})
}
