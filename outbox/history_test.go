package outbox_test

import (
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/outbox"
)

// A busy aggregate's sent history stays in the per-aggregate indexes as
// stale entries until VACUUM removes them, and an open transaction (a long
// report, a stuck client, a claim whose process died) keeps every one of
// them alive for its snapshot: no scan may mark them dead, so each probe
// that walks them visits the heap for each. The claim's probes must not
// walk an aggregate's history once per row they judge, or a pile behind a
// dead head costs history x pile tuples: the relay stall a fault campaign
// found, with claims running for minutes.

// historySize is how many sent events of the busy aggregate come before
// its dead head; historyPile how many wait behind that head.
const (
	historySize = 5000
	historyPile = 1000
)

// pinnedHistory writes historySize events of aggregate order/busy and
// marks them sent while another connection holds a snapshot taken before
// (closed at cleanup), then the dead head and historyPile new events behind
// it, all due a minute ago.
func pinnedHistory(t *testing.T, db *gorm.DB) {
	t.Helper()
	insert := func(from, to int, status string) {
		require.NoError(t, db.Exec(`
			INSERT INTO outbox_events (id, topic, aggregate_type, aggregate_id, aggregate_version,
			                           payload, occurred_at, created_at, available_at, status)
			SELECT 'b' || lpad(g::text, 25, '0'), 'order.paid', 'order', 'busy', g,
			       '{}', now(), now(), now() - interval '1 minute', ?
			FROM generate_series(?::int, ?::int) AS g`, status, from, to).Error)
	}
	insert(1, historySize, "new")
	pin := db.Begin(&sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	require.NoError(t, pin.Error)
	t.Cleanup(func() { pin.Rollback() })
	var n int64
	require.NoError(t, pin.Raw("SELECT count(*) FROM outbox_events").Scan(&n).Error)
	require.Equal(t, int64(historySize), n)
	require.NoError(t, db.Exec(`UPDATE outbox_events SET status = 'sent', published_at = now()
		WHERE aggregate_id = 'busy'`).Error)
	insert(historySize+1, historySize+1, "dead")
	insert(historySize+2, historySize+1+historyPile, "new")
}

// TestClaimCostIgnoresPinnedHistory holds back a pile behind a dead head
// that comes after a long sent history kept alive by an open snapshot: the
// claim must cost per row held, not per row held times the history.
func TestClaimCostIgnoresPinnedHistory(t *testing.T) {
	t.Parallel()
	planLayouts(t, func(t *testing.T, open func() *gorm.DB) {
		db := open()
		pinnedHistory(t, db)
		hold := explain(t, db, outbox.PostgresClaimSQL(), claimArgs(readyRows, 5000))
		assertBounded(t, "claim holding a pile back behind a pinned history", hold, historyPile)
		require.Equal(t, int64(historyPile), countRows(t, db, "held"))
	})
}
