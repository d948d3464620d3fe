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

// A drain's claims: a backlog written by units of work holds several
// versions of each aggregate, one after the other in the due index, so a
// claim finds one row it may take among each aggregate's versions and
// looks further ahead, in rounds, for the rest of its limit.

// backlogSQL writes @aggregates aggregates of @versions events each, all
// due a minute ago, each aggregate's versions one after the other in id
// order (as a unit of work writes them).
const backlogSQL = `
	INSERT INTO outbox_events (id, topic, aggregate_type, aggregate_id, aggregate_version,
	                           payload, occurred_at, created_at, available_at, status)
	SELECT 'b' || lpad(g::text, 25, '0'), 'account.deposited', 'account', 'acc-' || (g / v.n),
	       g % v.n + 1, '{}', now(), now(), now() - interval '1 minute', 'new'
	FROM (SELECT CAST(@versions AS int) AS n) v, generate_series(0, CAST(@aggregates AS int) * v.n - 1) AS g`

// indexReads is what PostgreSQL's statistics say one index of the outbox
// was used for: how many scans (or probes) started on it and how many of
// its entries they read.
type indexReads struct {
	Scans, Entries int64
}

// readIndexStats returns the statistics of the outbox's index named, after
// making the session flush its own (db must hold one connection, the one
// the statements measured ran on).
func readIndexStats(t *testing.T, db *gorm.DB, index string) indexReads {
	t.Helper()
	require.NoError(t, db.Exec("SELECT pg_stat_force_next_flush()").Error)
	var r indexReads
	require.NoError(t, db.Raw(`SELECT idx_scan AS scans, idx_tup_read AS entries FROM pg_stat_user_indexes
		WHERE schemaname = current_schema() AND indexrelname = ?`, index).Scan(&r).Error)
	return r
}

// TestPostgresClaimRoundsReadEachDueRowOnce claims 500 rows from a backlog
// of 500 aggregates of 10 versions: the claim takes version 1 of each, one
// row in ten of the due index, in rounds. Each round must start where the
// one before stopped, not judge again the rows the earlier rounds left
// waiting behind the rows they took; and a row behind an earlier version
// of its aggregate among the rows a round looks at needs no probe of the
// unsent events' index. Before both, the claim read 12,866 entries of the
// due index and probed the other index 12,578 times.
func TestPostgresClaimRoundsReadEachDueRowOnce(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(1) // the statistics read are this session's
	ctx := context.Background()
	require.NoError(t, outbox.Migrate(ctx, db))
	const aggregates, versions, limit = 500, 10, 500
	require.NoError(t, db.Exec(backlogSQL, map[string]any{"aggregates": aggregates, "versions": versions}).Error)
	store, err := outbox.NewStore(db, nil)
	require.NoError(t, err)

	dueBefore := readIndexStats(t, db, "outbox_events_due")
	probesBefore := readIndexStats(t, db, "outbox_events_unsent_aggregate")
	got, err := store.Claim(ctx, outbox.ClaimOpts{Worker: "w", Limit: limit, Lease: time.Minute})
	require.NoError(t, err)
	due := readIndexStats(t, db, "outbox_events_due")
	probes := readIndexStats(t, db, "outbox_events_unsent_aggregate")

	require.Len(t, got, limit)
	for _, m := range got {
		require.Equal(t, int64(1), m.AggregateVersion, "%s of %s is not its aggregate's first event", m.ID, m.AggregateID)
	}
	read, probed := due.Entries-dueBefore.Entries, probes.Scans-probesBefore.Scans
	t.Logf("claim of %d rows among %d: %d due index entries read in %d rounds, %d probes of the unsent events' index",
		limit, aggregates*versions, read, due.Scans-dueBefore.Scans, probed)
	// The rounds look at 500, 1,000, 2,000 rows, then as many as the
	// yield so far says the last 150 rows need, with a quarter more.
	assert.LessOrEqual(t, read, int64(aggregates*versions+aggregates*versions/4),
		"the claim's rounds read due rows again")
	// One probe for each aggregate a round looks at, one for each row
	// claimed (is a later event waiting behind it?).
	assert.LessOrEqual(t, probed, int64(3*limit), "the claim probes rows it could judge without")
}
