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

// TestMarkSentTxJoinsTheCallersTransaction: MarkSentTx and DeleteSentTx
// record rows in the caller's transaction, fenced like MarkSent. What
// they did is undone by a rollback and kept by a commit, which also
// releases the next event of the aggregate; on PostgreSQL, the rows they
// marked stay out of other claims until the transaction ends, even once
// their lease ran out.
func TestMarkSentTxJoinsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		x1, x2 := e.addAgg(t, "x", 1), e.addAgg(t, "x", 2)
		y1 := e.addAgg(t, "y", 1)
		got := e.claim(t, "w", 10)
		require.ElementsMatch(t, []string{x1.ID, y1.ID}, ids(got))

		tx := begin(t, db)
		n, err := e.store.MarkSentTx(ctx, tx, "other", ids(got))
		require.NoError(t, err)
		assert.Zero(t, n, "another worker's rows are left alone")
		n, err = e.store.MarkSentTx(ctx, tx, "w", ids(got))
		require.NoError(t, err)
		assert.Equal(t, int64(2), n)
		if b.SkipLocked {
			e.stamper.Advance(2 * lease)
			assert.Empty(t, e.claim(t, "thief", 10), "rows marked in an open transaction are not taken over")
		}
		require.NoError(t, tx.Rollback().Error)
		assert.Equal(t, int64(2), countRows(t, db, "status = 'publishing' AND locked_by = 'w'"), "rolled back")

		tx = begin(t, db)
		n, err = e.store.MarkSentTx(ctx, tx, "w", ids(got))
		require.NoError(t, err)
		assert.Equal(t, int64(2), n)
		require.NoError(t, tx.Commit().Error)
		assert.Equal(t, int64(2), countRows(t, db, "status = 'sent' AND locked_by IS NULL"))

		next := e.claim(t, "w", 10)
		require.Equal(t, []string{x2.ID}, ids(next), "x1 sent releases x2")
		tx = begin(t, db)
		n, err = e.store.DeleteSentTx(ctx, tx, "w", ids(next))
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		require.NoError(t, tx.Commit().Error)
		assert.Zero(t, countRows(t, db, "id = ?", x2.ID), "deleted")

		_, err = e.store.MarkSentTx(ctx, db, "", []string{x1.ID})
		require.ErrorIs(t, err, outbox.ErrInvalidClaim)
		_, err = e.store.DeleteSentTx(ctx, db, "", []string{x1.ID})
		require.ErrorIs(t, err, outbox.ErrInvalidClaim)
	})
}
