package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

func TestDuplicateKeyLeavesTransactionUsable(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()

		tx := begin(t, db)
		first, err := e.store.Add(ctx, tx, "order.paid", orderPaid{OrderID: "o-1"}, &outbox.AddOpts{DedupKey: "order-1-paid"})
		require.NoError(t, err)
		dup, err := e.store.Add(ctx, tx, "order.paid", orderPaid{OrderID: "o-1"}, &outbox.AddOpts{DedupKey: "order-1-paid"})
		require.ErrorIs(t, err, outbox.ErrDuplicateKey)
		assert.Nil(t, dup)

		// On PostgreSQL the conflict is absorbed by ON CONFLICT DO NOTHING,
		// so the transaction is not aborted: more work and the commit succeed.
		third, err := e.store.Add(ctx, tx, "order.shipped", orderPaid{OrderID: "o-1"}, &outbox.AddOpts{DedupKey: "order-1-shipped"})
		require.NoError(t, err)
		require.NoError(t, tx.Exec("UPDATE outbox_events SET attempts = 0 WHERE id = ?", first.ID).Error)
		require.NoError(t, tx.Commit().Error)

		assert.Equal(t, int64(2), countRows(t, db, ""))
		assert.Equal(t, int64(1), countRows(t, db, "dedup_key = ?", "order-1-paid"))
		for _, m := range []*outbox.Message{first, third} {
			_, err := e.store.Get(ctx, m.ID)
			require.NoError(t, err)
		}
	})
}

func TestDuplicateKeyAcrossTransactions(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		first := e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-1"}, &outbox.AddOpts{DedupKey: "order-1-paid"})

		tx := begin(t, db)
		_, err := e.store.Add(ctx, tx, "order.paid", orderPaid{OrderID: "o-1", Amount: 99}, &outbox.AddOpts{DedupKey: "order-1-paid"})
		require.ErrorIs(t, err, outbox.ErrDuplicateKey)
		require.NoError(t, tx.Commit().Error)

		require.Equal(t, int64(1), countRows(t, db, ""))
		got, err := e.store.Get(ctx, first.ID)
		require.NoError(t, err)
		assert.JSONEq(t, `{"order_id":"o-1","amount":0}`, string(got.Payload), "the first event is kept as it was")
	})
}

func TestDedupKeyIsPerTenant(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-1"}, &outbox.AddOpts{DedupKey: "k"})
		e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-1"}, &outbox.AddOpts{DedupKey: "k", Tenant: "acme"})
		e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-1"}, &outbox.AddOpts{DedupKey: "k", Tenant: "globex"})
		// Events without a key never conflict.
		e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-1"}, nil)
		e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-1"}, nil)

		assert.Equal(t, int64(3), countRows(t, db, "dedup_key = ?", "k"))
		assert.Equal(t, int64(2), countRows(t, db, "dedup_key IS NULL"))

		tx := begin(t, db)
		_, err := e.store.Add(ctx, tx, "order.paid", orderPaid{OrderID: "o-1"}, &outbox.AddOpts{DedupKey: "k", Tenant: "acme"})
		require.ErrorIs(t, err, outbox.ErrDuplicateKey)
		require.NoError(t, tx.Commit().Error)
		assert.Equal(t, int64(5), countRows(t, db, ""))
	})
}

func TestInsertDuplicateKeyInBatch(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		key := func(s string) *string { return &s }
		msg := func(tenantID, k string) *outbox.Message {
			return &outbox.Message{
				ID: e.stamper.NewID(e.stamper.Now()), TenantID: tenantID, Topic: "order.paid",
				Payload: outbox.JSON(`{}`), DedupKey: key(k),
			}
		}

		t.Run("same key twice", func(t *testing.T) {
			tx := begin(t, db)
			err := e.store.Insert(ctx, tx, []*outbox.Message{msg("", "k-1"), msg("", "k-2"), msg("", "k-1")})
			require.ErrorIs(t, err, outbox.ErrDuplicateKey)
			require.NoError(t, tx.Commit().Error)
			assert.Equal(t, int64(0), countRows(t, db, ""), "nothing of the batch is written")
		})
		t.Run("same key in two tenants", func(t *testing.T) {
			tx := begin(t, db)
			require.NoError(t, e.store.Insert(ctx, tx, []*outbox.Message{msg("acme", "k-1"), msg("globex", "k-1")}))
			require.NoError(t, tx.Commit().Error)
			assert.Equal(t, int64(2), countRows(t, db, "dedup_key = ?", "k-1"))
		})
		t.Run("key already stored", func(t *testing.T) {
			tx := begin(t, db)
			err := e.store.Insert(ctx, tx, []*outbox.Message{msg("acme", "k-9"), msg("acme", "k-1")})
			require.ErrorIs(t, err, outbox.ErrDuplicateKey)
			require.NoError(t, tx.Rollback().Error)
			assert.Equal(t, int64(2), countRows(t, db, ""))
		})
	})
}
