package purge_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/purge"
	"github.com/bentoevents/bento/internal/testenv"
)

// deleteOld deletes up to @limit rows older than @age.
const deleteOld = `DELETE FROM items WHERE id IN (SELECT id FROM items WHERE age > @age ORDER BY id LIMIT @limit)`

var errWrapped = errors.New("purge test: wrapped")

func wrap(err error) error { return fmt.Errorf("%w: %w", errWrapped, err) }

// setup returns a database with a table of n items aged 1..n.
func setup(t *testing.T, n int) *gorm.DB {
	t.Helper()
	db := testenv.SQLite(t)
	require.NoError(t, db.Exec(`CREATE TABLE items (id INTEGER PRIMARY KEY, age INTEGER NOT NULL)`).Error)
	for i := 1; i <= n; i++ {
		require.NoError(t, db.Exec(`INSERT INTO items (id, age) VALUES (?, ?)`, i, i).Error)
	}
	return db
}

func left(t *testing.T, db *gorm.DB) []int {
	t.Helper()
	var ids []int
	require.NoError(t, db.Raw(`SELECT id FROM items ORDER BY id`).Scan(&ids).Error)
	return ids
}

// TestBatchesDeletesEverythingMatching checks that the loop goes on past
// full batches, stops after a short one, and deletes only what matches.
func TestBatchesDeletesEverythingMatching(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 2, 3, 7, 0} {
		t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) {
			t.Parallel()
			db := setup(t, 9)
			n, err := purge.Batches(context.Background(), db, deleteOld, map[string]any{"age": 3}, batch, wrap)
			require.NoError(t, err)
			assert.Equal(t, int64(6), n)
			assert.Equal(t, []int{1, 2, 3}, left(t, db))
		})
	}
}

// TestBatchesStopsWhenContextDone checks that a done context stops the
// loop before any statement, with the context's error unwrapped.
func TestBatchesStopsWhenContextDone(t *testing.T) {
	t.Parallel()
	db := setup(t, 4)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n, err := purge.Batches(ctx, db, deleteOld, map[string]any{"age": 0}, 1, wrap)
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, errWrapped)
	assert.Zero(t, n)
	assert.Len(t, left(t, db), 4)
}

// TestBatchesWrapsDatabaseErrors checks that a failing statement's error
// goes through wrap.
func TestBatchesWrapsDatabaseErrors(t *testing.T) {
	t.Parallel()
	db := setup(t, 1)
	_, err := purge.Batches(context.Background(), db, `DELETE FROM missing LIMIT @limit`, map[string]any{}, 1, wrap)
	assert.ErrorIs(t, err, errWrapped)
}
