package uow_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
	"github.com/bentoevents/bento/uow"
)

// TestUnitSchedulesAndCancels: a unit's scheduled message and its cancel
// commit with the unit's other writes, in the unit's tenant, and vanish
// with a unit that fails.
func TestUnitSchedulesAndCancels(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := tenant.With(context.Background(), "acme")
		store := e.units.Outbox()
		waiting := func() int64 {
			bl, err := store.ScheduledBacklog(context.Background(), "acme")
			require.NoError(t, err)
			return bl.Waiting
		}

		boom := errors.New("boom")
		err := e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			if err := u.Add(OpenAccount("acc-9", "bo")); err != nil {
				return err
			}
			if _, err := u.Schedule(ctx, "account.review", map[string]string{"id": "acc-9"}, outbox.After(time.Hour), &outbox.ScheduleOpts{Key: "review:acc-9"}); err != nil {
				return err
			}
			return boom
		})
		require.ErrorIs(t, err, boom)
		assert.Equal(t, int64(0), waiting(), "rolled back with the unit")

		var due time.Time
		err = e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			if err := u.Add(OpenAccount("acc-9", "bo")); err != nil {
				return err
			}
			m, err := u.Schedule(ctx, "account.review", map[string]string{"id": "acc-9"}, outbox.After(time.Hour), &outbox.ScheduleOpts{Key: "review:acc-9"})
			if err == nil {
				due = m.DueAt
				assert.Equal(t, "acme", m.TenantID)
			}
			return err
		})
		require.NoError(t, err)
		assert.Equal(t, int64(1), waiting())
		assert.True(t, due.Equal(epoch.Add(time.Hour)), "an hour after the database's (here the fake) clock: %v", due)

		err = e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			if _, err := u.Cancel(ctx, "review:acc-9"); err != nil {
				return err
			}
			return boom
		})
		require.ErrorIs(t, err, boom)
		assert.Equal(t, int64(1), waiting(), "the failed unit's cancel never happened")

		var n int64
		err = e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) (err error) {
			n, err = u.Cancel(ctx, "review:acc-9")
			return err
		})
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		assert.Equal(t, int64(0), waiting())
		err = e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			_, err := u.Cancel(ctx, "review:acc-9")
			return err
		})
		assert.ErrorIs(t, err, outbox.ErrNotScheduled)
	})
}
