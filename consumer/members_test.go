package consumer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
)

// TestFenceRefusesALapsedMembership: a transaction of a member whose row
// has expired on the database's clock (as a frozen instance's has once
// its peers took its partitions), or whose membership began again since
// its partition was assigned, is refused with ErrFenced instead of
// committing late; a live member of the same membership commits.
func TestFenceRefusesALapsedMembership(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		ctx := t.Context()
		require.NoError(t, inbox.Migrate(ctx, db))
		m, err := newMembers(db, "bt.fence", 4)
		require.NoError(t, err)
		_, err = m.beat(ctx, 60_000, 5*time.Second)
		require.NoError(t, err)
		gen := m.gen.Load()
		require.NotZero(t, gen, "the first beat begins a membership")
		fenced := func(gen int64) error {
			return db.Transaction(func(tx *gorm.DB) error { return m.fence(tx, gen) })
		}
		require.NoError(t, fenced(gen), "a live member commits")
		assert.ErrorIs(t, fenced(gen-1), ErrFenced, "a transaction of an earlier membership")

		require.NoError(t, db.Exec(`UPDATE consumer_members SET expires_ms = 0 WHERE consumer = ?`, "bt.fence").Error)
		err = fenced(gen)
		t.Logf("%s: the lapsed member's commit: %v", b.Name, err)
		assert.ErrorIs(t, err, ErrFenced, "a member whose row expired")
	})
}
