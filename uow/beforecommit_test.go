package uow_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

// auditRow is what the before-commit hook of the test writes per event.
type auditRow struct {
	EventID string `gorm:"primaryKey;size:26"`
	Topic   string
	Version int64
}

// TestBeforeCommitHook checks that the hook sees a unit's events inside its
// transaction: what it writes commits with them, a rolled-back unit (or a
// joined one whose savepoint is undone) keeps none of it, and a hook error
// rolls the whole unit back and is returned wrapped.
func TestBeforeCommitHook(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		require.NoError(t, db.AutoMigrate(&auditRow{}))
		ctx := context.Background()
		errVeto := errors.New("veto")
		veto := false
		var seen [][]string
		units, err := uow.New(db, &uow.Config{BeforeCommit: func(ctx context.Context, tx *gorm.DB, events []*outbox.Message) error {
			var topics []string
			for _, m := range events {
				topics = append(topics, m.Topic)
				if err := tx.Create(&auditRow{EventID: m.ID, Topic: m.Topic, Version: m.AggregateVersion}).Error; err != nil {
					return err
				}
			}
			seen = append(seen, topics)
			if veto {
				return errVeto
			}
			return nil
		}})
		require.NoError(t, err)

		a := OpenAccount("acc-1", "ann")
		require.NoError(t, a.Deposit(5))
		require.NoError(t, units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(a) }))
		assert.Equal(t, [][]string{{"account.opened", "account.deposited"}}, seen)
		var audited []auditRow
		require.NoError(t, db.Order("version").Find(&audited).Error)
		rows := e.outboxRows(t)
		require.Len(t, audited, 2)
		require.Len(t, rows, 2)
		assert.ElementsMatch(t, []string{rows[0].ID, rows[1].ID}, []string{audited[0].EventID, audited[1].EventID},
			"the hook sees the ids the outbox rows were written with")

		// A hook error rolls the unit back: no account, no event, no audit.
		veto = true
		err = units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(OpenAccount("acc-2", "bob")) })
		require.ErrorIs(t, err, errVeto)
		assert.Equal(t, int64(1), e.count(t, &Account{}))
		assert.Equal(t, int64(2), e.count(t, &auditRow{}))
		assert.Len(t, e.outboxRows(t), 2)
		veto = false

		// A unit without events does not call it.
		seen = nil
		a.Owner = "renamed"
		require.NoError(t, units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Save(a) }))
		assert.Empty(t, seen)

		// A joined unit's writes go when its caller's transaction rolls back.
		outer := db.Begin()
		require.NoError(t, units.RunTx(ctx, outer, func(ctx context.Context, u *uow.UnitOfWork) error {
			return u.Add(OpenAccount("acc-3", "cy"))
		}))
		assert.Len(t, seen, 1, "called for the joined unit")
		require.NoError(t, outer.Rollback().Error)
		assert.Equal(t, int64(2), e.count(t, &auditRow{}))
	})
}
