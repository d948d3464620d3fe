package outbox

import (
	"strings"

	"github.com/bentoevents/bento/internal/dialect"
)

// The SQL that matters, in one place. Only constant fragments are joined;
// every value is a bind parameter.

// readyWhere selects the rows a projector may claim: due (new, failed, or
// publishing under an expired lease) and first in line for their aggregate —
// no earlier event of the same aggregate is unsent or dead.
const readyWhere = `o.status IN ('new', 'publishing', 'failed')
  AND o.available_at <= @now
  AND (o.aggregate_id = '' OR NOT EXISTS (
        SELECT 1 FROM outbox_events p
        WHERE p.tenant_id = o.tenant_id
          AND p.aggregate_type = o.aggregate_type
          AND p.aggregate_id = o.aggregate_id
          AND p.aggregate_version < o.aggregate_version
          AND p.status IN ('new', 'publishing', 'failed', 'dead')
          AND p.aggregate_id <> ''))`

const tenantFilter = `
  AND o.tenant_id = @tenant`

// claimSet takes the rows under the worker's lease. A row taken over from an
// expired lease counts as a failed attempt.
const claimSet = `status = 'publishing',
    attempts = attempts + CASE WHEN status = 'publishing' THEN 1 ELSE 0 END,
    last_error = CASE WHEN status = 'publishing'
                      THEN 'lease of ' || COALESCE(locked_by, 'unknown worker') || ' expired'
                      ELSE last_error END,
    failed_at = CASE WHEN status = 'publishing' THEN @now ELSE failed_at END,
    locked_by = @worker,
    locked_until = @until,
    available_at = @until`

// claimSQL returns the claim statement for d: one statement that selects and
// leases up to @limit rows. PostgreSQL skips rows other claimers hold;
// SQLite serialises writers (BEGIN IMMEDIATE), so it needs no row locks.
func claimSQL(d dialect.Dialect, byTenant bool) string {
	where := readyWhere
	if byTenant {
		where += tenantFilter
	}
	if d == dialect.Postgres {
		// On a partitioned table (MigrateWith) the status condition of the
		// UPDATE lets the planner leave sealed partitions (CHECK (status =
		// 'sent')) out of the update as well as out of the CTE, and joining
		// on created_at, the partition key, lets it prune the rest per row.
		// On an unpartitioned table both are rechecks of a row found by id.
		return `WITH ready AS (
  SELECT o.id, o.created_at FROM outbox_events o
  WHERE ` + where + `
  ORDER BY o.available_at, o.id
  LIMIT @limit
  FOR UPDATE SKIP LOCKED
)
UPDATE outbox_events SET ` + claimSet + `
FROM ready
WHERE outbox_events.id = ready.id
  AND outbox_events.created_at = ready.created_at
  AND outbox_events.status IN ('new', 'publishing', 'failed')
RETURNING ` + returningColumns
	}
	return `UPDATE outbox_events SET ` + claimSet + `
WHERE id IN (
  SELECT o.id FROM outbox_events o
  WHERE ` + where + `
  ORDER BY o.available_at, o.id
  LIMIT @limit)
RETURNING ` + returningColumns
}

// returningColumns are the columns a claim returns, in the order
// scanMessage reads them.
const returningColumns = `outbox_events.id, outbox_events.tenant_id, outbox_events.topic,
  outbox_events.aggregate_type, outbox_events.aggregate_id, outbox_events.aggregate_version,
  outbox_events.schema_version, outbox_events.payload, outbox_events.metadata,
  outbox_events.occurred_at, outbox_events.created_at, outbox_events.status,
  outbox_events.attempts, outbox_events.available_at, outbox_events.locked_by,
  outbox_events.locked_until, outbox_events.last_error, outbox_events.published_at,
  outbox_events.failed_at, outbox_events.dedup_key`

// insertColumns are the columns Insert writes; the others start NULL.
const insertColumns = `INSERT INTO outbox_events (id, tenant_id, topic, aggregate_type, aggregate_id,
  aggregate_version, schema_version, payload, metadata, occurred_at, created_at, status,
  attempts, available_at, dedup_key) VALUES `

// insertRow is one row of insertColumns' placeholders.
const insertRow = `(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// insertOnConflict skips a row whose dedup key its tenant already used.
const insertOnConflict = `
ON CONFLICT (tenant_id, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING`

// insertSQL is the multi-row INSERT of n messages. A plain statement rather
// than GORM's Create: every commit runs it, and Create reflects over the
// Message struct for each row.
func insertSQL(n int) string {
	var b strings.Builder
	b.Grow(len(insertColumns) + n*(len(insertRow)+2))
	b.WriteString(insertColumns)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(insertRow)
	}
	return b.String()
}

// insertArgs are the values of insertSQL for msgs, in insertColumns' order.
func insertArgs(msgs []*Message) []any {
	args := make([]any, 0, len(msgs)*15)
	for _, m := range msgs {
		args = append(args, m.ID, m.TenantID, m.Topic, m.AggregateType, m.AggregateID,
			m.AggregateVersion, m.SchemaVersion, m.Payload, m.Metadata, m.OccurredAt, m.CreatedAt, string(m.Status),
			m.Attempts, m.AvailableAt, m.DedupKey)
	}
	return args
}

// ownedByWorker fences every outcome: only the worker holding the lease may
// record it, so a projector whose lease was taken over changes nothing.
const ownedByWorker = `status = 'publishing' AND locked_by = @worker`

const markSentSQL = `UPDATE outbox_events
SET status = 'sent', published_at = @now, available_at = @now,
    locked_by = NULL, locked_until = NULL, last_error = NULL
WHERE id IN @ids AND ` + ownedByWorker

const deleteSentSQL = `DELETE FROM outbox_events WHERE id IN @ids AND ` + ownedByWorker

const markFailedSQL = `UPDATE outbox_events
SET status = @status, attempts = attempts + 1, available_at = @retry_at,
    last_error = @error, failed_at = @now, locked_by = NULL, locked_until = NULL
WHERE id = @id AND ` + ownedByWorker

const releaseSQL = `UPDATE outbox_events
SET status = CASE WHEN attempts > 0 THEN 'failed' ELSE 'new' END,
    available_at = @now, locked_by = NULL, locked_until = NULL
WHERE id IN @ids AND ` + ownedByWorker

const requeueSet = `status = 'new', attempts = 0, available_at = @now,
    locked_by = NULL, locked_until = NULL`

// purgeSentSQL deletes one batch of sent rows published before @before.
const purgeSentSQL = `DELETE FROM outbox_events WHERE id IN (
  SELECT id FROM outbox_events
  WHERE status = 'sent' AND published_at < @before`

const purgeSentTail = `
  ORDER BY published_at LIMIT @limit)`

// freeDedupKeysSQL deletes one batch of the dedup keys a partitioned table
// reserved for events created before @end whose rows are gone (their
// partition was dropped). A row that landed in the default partition keeps
// its key.
const freeDedupKeysSQL = `DELETE FROM outbox_dedup_keys WHERE (tenant_id, dedup_key) IN (
  SELECT k.tenant_id, k.dedup_key FROM outbox_dedup_keys k
  WHERE k.created_at < @end
    AND NOT EXISTS (SELECT 1 FROM outbox_events e WHERE e.id = k.event_id AND e.created_at = k.created_at)
  LIMIT @limit)`
