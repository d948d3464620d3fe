package outbox_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// TestCancelKeepsItsIndexUnderAGenericPlan: the driver prepares the cancel
// and the too-late count, and after a few executions PostgreSQL may run a
// prepared statement with its generic plan, planned without the key's
// value. That plan must still probe the key index: a generic plan cannot
// prove that a parameter satisfies the index's predicate (a key that is
// not empty), so unless the statement states it, the only index left is
// the due index, and a cancel reads every waiting message. Here 20,000 wait (never
// analyzed); each statement, forced onto its generic plan, must read a
// handful of buffers.
func TestCancelKeepsItsIndexUnderAGenericPlan(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	require.NoError(t, outbox.Migrate(t.Context(), db))
	require.NoError(t, db.Exec(`
		INSERT INTO outbox_scheduled (id, topic, schedule_key, payload, occurred_at, created_at, due_at, size_bytes)
		SELECT 'l' || lpad(g::text, 25, '0'), 'order.expire', 'k' || g, '{}', now(), now(),
		       now() + interval '1 hour' + g * interval '1 millisecond', 2
		FROM generate_series(1, 20000) AS g`).Error)
	positional := strings.NewReplacer("@tenant", "$1", "@key", "$2")
	errRollback := errors.New("rolled back")
	for i, c := range []struct{ what, query string }{
		{"cancel", outbox.CancelSQL},
		{"too-late count", outbox.CountKeySQL},
	} {
		name := fmt.Sprint("generic_", i)
		var plan explained
		err := db.Transaction(func(tx *gorm.DB) error {
			require.NoError(t, tx.Exec("SET LOCAL plan_cache_mode = force_generic_plan").Error)
			require.NoError(t, tx.Exec("PREPARE "+name+"(text, text) AS "+positional.Replace(c.query)).Error)
			plan = explain(t, tx, "EXECUTE "+name+"('default', 'k10000')")
			require.NoError(t, tx.Exec("DEALLOCATE "+name).Error)
			return errRollback
		})
		require.ErrorIs(t, err, errRollback)
		t.Logf("%s, generic plan: %.2f ms, %d shared buffers", c.what, plan.ms, plan.buffers())
		assert.Empty(t, scheduledScans(plan), "%s scans the table", c.what)
		assert.LessOrEqual(t, plan.buffers(), int64(20), "%s reads %d buffers: not a probe of the key index", c.what, plan.buffers())
	}
}
