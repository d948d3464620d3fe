package outbox

import (
	"math"
	"time"

	"github.com/bentoevents/bento/internal/dialect"
)

// PostgresClaimSQL exposes the PostgreSQL claim statement to tests.
func PostgresClaimSQL() string { return claimSQL(dialect.Postgres, false) }

// PostgresClaimArgs are arguments for PostgresClaimSQL: worker "w", limit,
// a one-minute lease from now and no byte budget.
func PostgresClaimArgs(now time.Time, limit int) map[string]any {
	return map[string]any{
		"now": now, "until": now.Add(time.Minute), "worker": "w", "limit": limit, "scan": limit, "tenant": "",
		"max_bytes": int64(math.MaxInt64), "first_free": true, "after_at": nil, "after_id": "",
	}
}

// PromoteSQL exposes the statement that releases the first held row of
// each of n aggregates.
func PromoteSQL(n int) string { return promoteSQL(n) }

// PostgresReleaseDueSQL exposes the statement that releases due scheduled
// messages, NextDueSQL the one that finds the next due time, and CancelSQL
// the cancel, on PostgreSQL. A leased release is a worker's
// (ReleaseOpts.Worker).
func PostgresReleaseDueSQL(leased bool) string { return pgReleaseDueSQL(false, leased) }

// PostgresNextDueSQL: see PostgresReleaseDueSQL.
func PostgresNextDueSQL() string { return nextDueSQL(dialect.Postgres, false) }

// CancelSQL: see PostgresReleaseDueSQL.
const CancelSQL = cancelSQL

// CountKeySQL: see PostgresReleaseDueSQL.
const CountKeySQL = countKeySQL
