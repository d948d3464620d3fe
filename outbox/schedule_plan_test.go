package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// The scheduled messages' lookups must stay index probes at a million
// waiting rows, whatever the statistics: never analyzed, analyzed, or
// analyzed before the million arrived (stale). Each statement runs under
// EXPLAIN (ANALYZE, BUFFERS) in a transaction that is rolled back.

// scheduledRows is how many messages wait for later; dueNow how many are
// due.
const (
	scheduledRows = 1_000_000
	dueNow        = 20
)

// scheduleLater writes scheduledRows messages due from an hour on, keyed
// "k<n>".
func scheduleLater(t *testing.T, db *gorm.DB) {
	t.Helper()
	require.NoError(t, db.Exec(`
		INSERT INTO outbox_scheduled (id, topic, schedule_key, payload, occurred_at, created_at, due_at, size_bytes)
		SELECT 'l' || lpad(g::text, 25, '0'), 'order.expire', 'k' || g, '{}', now(), now(),
		       now() + interval '1 hour' + g * interval '1 millisecond', 2
		FROM generate_series(1, ?) AS g`, scheduledRows).Error)
}

// scheduleDue writes dueNow messages due a minute ago.
func scheduleDue(t *testing.T, db *gorm.DB) {
	t.Helper()
	require.NoError(t, db.Exec(`
		INSERT INTO outbox_scheduled (id, topic, schedule_key, payload, occurred_at, created_at, due_at, size_bytes)
		SELECT 'd' || lpad(g::text, 25, '0'), 'order.expire', 'due' || g, '{}', now(), now(),
		       now() - interval '1 minute', 2
		FROM generate_series(1, ?) AS g`, dueNow).Error)
}

// scheduledScans lists the sequential scans of outbox_scheduled that read
// rows.
func scheduledScans(e explained) []string {
	var out []string
	for _, n := range e.nodes {
		if n.kind == "Seq Scan" && n.relation == "outbox_scheduled" && n.read > 0 {
			out = append(out, fmt.Sprintf("%s: %d rows read", n.relation, n.read))
		}
	}
	return out
}

// checkScheduledPlans runs the release, the next-due lookup and a cancel,
// each rolled back, and checks each read a bounded number of buffers and
// no sequential scan.
func checkScheduledPlans(t *testing.T, db *gorm.DB, state string) {
	t.Helper()
	errRollback := errors.New("rolled back")
	now := map[string]any{"now": gorm.Expr("now()"), "due_now": gorm.Expr("now()"), "tenant": "", "limit": 500,
		"max_bytes": math.MaxInt64, "worker": "w", "until": gorm.Expr("now() + interval '1 minute'")}
	for _, c := range []struct {
		what  string
		query string
		args  any
		rows  int64
	}{
		{"release of the due messages", outbox.PostgresReleaseDueSQL(false), now, dueNow},
		{"leased release of the due messages", outbox.PostgresReleaseDueSQL(true), now, dueNow},
		{"next due time", outbox.PostgresNextDueSQL(), now, 1},
		{"cancel by key", outbox.CancelSQL, map[string]any{"tenant": "default", "key": "k500000"}, 1},
	} {
		var plan explained
		err := db.Transaction(func(tx *gorm.DB) error {
			plan = explain(t, tx, c.query, c.args)
			return errRollback
		})
		require.ErrorIs(t, err, errRollback)
		what := state + ": " + c.what
		t.Logf("%s: %.1f ms, %d shared buffers", what, plan.ms, plan.buffers())
		assert.Empty(t, scheduledScans(plan), "%s scans the table", what)
		assert.LessOrEqual(t, plan.buffers(), 200+100*c.rows, "%s reads %d buffers", what, plan.buffers())
	}
}

// TestPostgresSchedulePlans: at a million waiting messages the due-time
// lookups and the cancel read an index, under no statistics, fresh ones
// and stale ones. Writing its two million rows loads the database for a
// minute, so it runs in the suite's pass without the race detector, not
// beside the race pass's timing-bound tests.
func TestPostgresSchedulePlans(t *testing.T) {
	testenv.Stress(t) // two million rows: the non-race pass runs it
	t.Parallel()
	ctx := context.Background()
	// One schema at a time: two million rows at once would load the
	// database the other packages' tests share.
	t.Run("fresh and none", func(t *testing.T) {
		db, _ := testenv.Postgres(t)
		require.NoError(t, outbox.Migrate(ctx, db))
		scheduleLater(t, db)
		scheduleDue(t, db)
		start := time.Now()
		checkScheduledPlans(t, db, "never analyzed")
		require.NoError(t, db.Exec("ANALYZE outbox_scheduled").Error)
		checkScheduledPlans(t, db, "analyzed")
		t.Logf("checked in %v", time.Since(start).Round(time.Millisecond))
	})
	t.Run("stale", func(t *testing.T) {
		db, _ := testenv.Postgres(t)
		require.NoError(t, outbox.Migrate(ctx, db))
		scheduleDue(t, db)
		require.NoError(t, db.Exec("ANALYZE outbox_scheduled").Error) // 20 rows, all due
		scheduleLater(t, db)
		checkScheduledPlans(t, db, "analyzed before the million")
	})
}
