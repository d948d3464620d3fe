package uow_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
	"github.com/bentoevents/bento/uow"
)

// TestTenantOnEveryRow checks where a unit's tenant comes from: the option,
// then the context, then the manager's default.
func TestTenantOnEveryRow(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		acme, err := uow.New(db, &uow.Config{Tenant: "acme", Outbox: e.units.Outbox()})
		require.NoError(t, err)

		commit := func(m *uow.Manager, ctx context.Context, opts *uow.BeginOpts, id string) string {
			u, err := m.Begin(ctx, opts)
			require.NoError(t, err)
			require.NoError(t, u.Track(OpenAccount(id, "ann")))
			require.NoError(t, u.Commit(ctx))
			return u.Tenant()
		}
		assert.Equal(t, tenant.Default, commit(e.units, ctx, nil, "a1"))
		assert.Equal(t, "acme", commit(acme, ctx, nil, "a2"))
		assert.Equal(t, "globex", commit(acme, tenant.With(ctx, "globex"), nil, "a3"))
		assert.Equal(t, "initech", commit(acme, tenant.With(ctx, "globex"), &uow.BeginOpts{Tenant: "initech"}, "a4"))

		want := map[string]string{"a1": tenant.Default, "a2": "acme", "a3": "globex", "a4": "initech"}
		rows := e.outboxRows(t)
		require.Len(t, rows, 4)
		for _, r := range rows {
			assert.Equal(t, want[r.AggregateID], r.TenantID, "row of %s", r.AggregateID)
		}

		// Run hands its function a context that carries the tenant.
		err = acme.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			got, ok := tenant.From(ctx)
			assert.True(t, ok)
			assert.Equal(t, "acme", got)
			return nil
		})
		require.NoError(t, err)
	})
}

// TestContextMetadataOnEvents checks that metadata put in the context (for
// example a correlation id) is stored with the unit's events.
func TestContextMetadataOnEvents(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := outbox.WithMetadata(context.Background(), outbox.Metadata{messaging.MetaCorrelationID: "corr-1"})
		e.commitNewCtx(t, ctx, "acc-1")
		rows := e.outboxRows(t)
		require.Len(t, rows, 1)
		assert.Equal(t, "corr-1", rows[0].Metadata[messaging.MetaCorrelationID])
		assert.Equal(t, "suite", rows[0].Metadata[messaging.MetaProducer])
	})
}

// TestAfterCommitHook checks that the hook sees each commit with events once
// it is final: owned units at once, joined units when the owner of the
// transaction commits; never rollbacks or event-less commits.
func TestAfterCommitHook(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		setup(t, b, db) // the tables
		ctx := context.Background()
		var calls []int
		units, err := uow.New(db, &uow.Config{AfterCommit: func(n int) { calls = append(calls, n) }})
		require.NoError(t, err)

		a := OpenAccount("acc-1", "ann")
		require.NoError(t, a.Deposit(1))
		require.NoError(t, units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(a) }))
		require.Error(t, units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			_ = u.Add(OpenAccount("acc-2", "bob"))
			return errInjected
		}))
		a.Owner = "renamed"
		require.NoError(t, units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Save(a) }))
		outer := db.Begin()
		require.NoError(t, units.RunTx(ctx, outer, func(ctx context.Context, u *uow.UnitOfWork) error {
			return u.Add(OpenAccount("acc-3", "cy"))
		}))
		require.NoError(t, outer.Commit().Error)
		assert.Equal(t, []int{2}, calls, "RunTx's caller commits where bento cannot see it")

		// A transaction its owner lets units join (uow.Own): their hooks
		// run when the owner commits, and only then, once.
		calls = nil
		owned := uow.Own(db.Begin())
		require.NoError(t, units.Run(owned.Join(ctx), func(ctx context.Context, u *uow.UnitOfWork) error {
			return u.Add(OpenAccount("acc-4", "di"))
		}))
		assert.Empty(t, calls, "not before the owner commits")
		require.NoError(t, owned.Commit())
		assert.Equal(t, []int{1}, calls)
		require.NoError(t, owned.Commit())
		assert.Equal(t, []int{1}, calls, "each hook runs once")

		calls = nil
		owned = uow.Own(db.Begin())
		require.NoError(t, units.Run(owned.Join(ctx), func(ctx context.Context, u *uow.UnitOfWork) error {
			return u.Add(OpenAccount("acc-5", "ed"))
		}))
		owned.Rollback()
		assert.Empty(t, calls, "a rolled back transaction is never reported")

		// A transaction only carried by a context (ContextWithTx): its
		// owner is not bento, so the hooks never run.
		calls = nil
		tx := db.Begin()
		require.NoError(t, units.Run(uow.ContextWithTx(ctx, tx), func(ctx context.Context, u *uow.UnitOfWork) error {
			return u.Add(OpenAccount("acc-9", "fy"))
		}))
		require.NoError(t, tx.Commit().Error)
		assert.Empty(t, calls)

		// Units nested in a unit that owns its transaction: their hooks run
		// after the outer commit, the outer unit's first.
		calls = nil
		require.NoError(t, units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			if err := units.Run(ctx, func(ctx context.Context, inner *uow.UnitOfWork) error {
				b := OpenAccount("acc-6", "fay")
				if err := b.Deposit(5); err != nil {
					return err
				}
				return inner.Add(b)
			}); err != nil {
				return err
			}
			assert.Empty(t, calls, "the nested unit's hook waits for the outer commit")
			return u.Add(OpenAccount("acc-7", "gus"))
		}))
		assert.Equal(t, []int{1, 2}, calls)
		require.Error(t, units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			require.NoError(t, units.Run(ctx, func(ctx context.Context, inner *uow.UnitOfWork) error {
				return inner.Add(OpenAccount("acc-8", "hal"))
			}))
			return errInjected
		}))
		assert.Equal(t, []int{1, 2}, calls, "nothing runs when the outer unit rolls back")
	})
}

func TestEnqueuedMetric(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		setup(t, b, db) // the tables
		reg := prometheus.NewRegistry()
		units, err := uow.New(db, &uow.Config{Registerer: reg})
		require.NoError(t, err)
		_, err = uow.New(db, &uow.Config{Registerer: reg}) // a second manager shares the counter
		require.NoError(t, err)
		a := OpenAccount("acc-1", "ann")
		require.NoError(t, a.Deposit(3))
		require.NoError(t, units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(a) }))
		_ = units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error {
			_ = u.Add(OpenAccount("acc-2", "bob"))
			return errInjected // rolled back: not counted
		})
		mfs, err := reg.Gather()
		require.NoError(t, err)
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				got[mf.GetName()+"/"+m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
		assert.Equal(t, map[string]float64{
			"bento_outbox_enqueued_total/account.opened":    1,
			"bento_outbox_enqueued_total/account.deposited": 1,
		}, got)
	})
}
