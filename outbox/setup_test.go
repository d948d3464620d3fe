package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// epoch is where every test's fake clock starts.
var epoch = time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)

// orderPaid is the payload most tests store.
type orderPaid struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

// env is what a test needs: a migrated database, a store over it and the
// store's fake clock.
type env struct {
	db      *gorm.DB
	store   *outbox.Store
	stamper *testenv.Clock
}

// setup migrates db and returns a store whose clock starts at epoch. cfg may
// be nil; its Clock is replaced by the fake one.
func setup(t *testing.T, db *gorm.DB, cfg *outbox.Config) *env {
	t.Helper()
	require.NoError(t, outbox.Migrate(context.Background(), db))
	st := testenv.NewClock(epoch)
	c := outbox.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Clock = st
	c.Test.Clock = st // the database clock follows the fake one
	store, err := outbox.NewStore(db, &c)
	require.NoError(t, err)
	return &env{db: db, store: store, stamper: st}
}

// begin starts a transaction that is rolled back at cleanup unless the test
// ends it, so a failing test never leaves SQLite's write lock held.
func begin(t *testing.T, db *gorm.DB) *gorm.DB {
	t.Helper()
	tx := db.Begin()
	require.NoError(t, tx.Error)
	t.Cleanup(func() { tx.Rollback() })
	return tx
}

// add writes one event in its own committed transaction.
func (e *env) add(ctx context.Context, t *testing.T, topic string, payload any, opts *outbox.AddOpts) *outbox.Message {
	t.Helper()
	tx := begin(t, e.db)
	m, err := e.store.Add(ctx, tx, topic, payload, opts)
	require.NoError(t, err)
	require.NoError(t, tx.Commit().Error)
	return m
}

// countRows counts the outbox rows matching where (all rows when empty).
func countRows(t *testing.T, db *gorm.DB, where string, args ...any) int64 {
	t.Helper()
	q := db.Model(&outbox.Message{})
	if where != "" {
		q = q.Where(where, args...)
	}
	var n int64
	require.NoError(t, q.Count(&n).Error)
	return n
}

// assertTime checks that got is the instant want, whatever its location.
func assertTime(t *testing.T, want, got time.Time, field string) {
	t.Helper()
	assert.Truef(t, want.Equal(got), "%s: want %s, got %s", field, want, got)
}
