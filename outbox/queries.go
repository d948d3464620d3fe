package outbox

import (
	"fmt"
	"strings"

	"github.com/bentoevents/bento/internal/dialect"
)

// The SQL that matters, in one place. Only constant fragments are joined;
// every value is a bind parameter.

// dueWhere selects the rows a projector may look at: due (new, failed, or
// publishing under an expired lease) by the database's clock, and not held
// back. A row is held back (held = true) once a claim saw an earlier event of
// its aggregate unsent or dead; it leaves the ready index then, so rows piled
// up behind a poison, retried or busy event cost a claim nothing.
const dueWhere = `o.status IN ('new', 'publishing', 'failed')
  AND NOT o.held
  AND o.available_at <= @now`

const tenantFilter = `
  AND o.tenant_id = @tenant`

// unsentRelativeSQL is true when another event of the aggregate of row
// %[1]s, with a version %[2]s than the row's, is new, publishing, failed or
// dead; %[3]s is appended to the inner SELECT (a row lock). It reads the
// outbox_events_unsent_aggregate index.
const unsentRelativeSQL = `(%[1]s.aggregate_id <> '' AND EXISTS (
        SELECT 1 FROM outbox_events p
        WHERE p.tenant_id = %[1]s.tenant_id
          AND p.aggregate_type = %[1]s.aggregate_type
          AND p.aggregate_id = %[1]s.aggregate_id
          AND p.aggregate_version %[2]s %[1]s.aggregate_version
          AND p.status IN ('new', 'publishing', 'failed', 'dead')
          AND p.aggregate_id <> ''%[3]s))`

// blocked is true when an earlier event of row's aggregate is still to be
// sent or dead, so row must wait; lock is appended to the inner SELECT.
func blocked(row, lock string) string { return fmt.Sprintf(unsentRelativeSQL, row, "<", lock) }

// claimSet takes the rows under the worker's lease, which ends at @until by
// the database's clock. A row taken over from an expired lease counts as a
// failed attempt.
const claimSet = `status = 'publishing',
    attempts = attempts + CASE WHEN status = 'publishing' THEN 1 ELSE 0 END,
    last_error = CASE WHEN status = 'publishing'
                      THEN 'lease of ' || COALESCE(locked_by, 'unknown worker') || ' expired'
                      ELSE last_error END,
    failed_at = CASE WHEN status = 'publishing' THEN @now ELSE failed_at END,
    locked_by = @worker,
    locked_until = @until,
    available_at = @until`

// withinBudget keeps a candidate whose running byte total (payload and
// metadata of it and the candidates before it) stays within @max_bytes; the
// first candidate passes anyway when @first_free is true (nothing claimed
// yet), so an event larger than the budget still goes out, alone.
const withinBudget = `(b.running <= @max_bytes OR (b.running = b.size_bytes AND @first_free))`

// The claim statements, built once per dialect and tenant filter.
var (
	pgClaim, pgClaimTenant         = pgClaimSQL(false), pgClaimSQL(true)
	sqliteClaim, sqliteClaimTenant = sqliteClaimSQL(false), sqliteClaimSQL(true)
	sqliteHold, sqliteHoldTenant   = sqliteHoldSQL(false), sqliteHoldSQL(true)
)

func claimSQL(d dialect.Dialect, byTenant bool) string {
	switch {
	case d == dialect.Postgres && byTenant:
		return pgClaimTenant
	case d == dialect.Postgres:
		return pgClaim
	case byTenant:
		return sqliteClaimTenant
	default:
		return sqliteClaim
	}
}

func holdSQL(byTenant bool) string {
	if byTenant {
		return sqliteHoldTenant
	}
	return sqliteHold
}

func dueFilter(byTenant bool) string {
	if byTenant {
		return dueWhere + tenantFilter
	}
	return dueWhere
}

// pgClaimSQL is PostgreSQL's claim: one statement that looks at the first
// @scan due rows (skipping rows other claimers lock), leases up to @limit of
// those that are first in line for their aggregate and within the byte
// budget, and marks held those waiting behind an earlier event that it
// cannot take itself (dead, in backoff, leased to another projector, or
// held): a row waiting behind a row the claim may take, or behind one the
// same worker leased in an earlier round, is due again as soon as that row
// is settled, so it is left as it is, and the claimed row says so
// (nextWaits). @scan is @limit, larger only when the previous
// round held rows back (Claim). Each result row starts with a flag: true
// for a row it held back (payload and metadata left out), false for a
// claimed one; it ends with nextWaits (false for a held row).
//
// Holding a row back is safe against a concurrent MarkSent of the event
// that blocks it: the claim holds back a row only while it holds a share
// lock on one of its unsent predecessors, so that predecessor cannot leave
// (be marked sent or deleted) until the claim commits; the statement that
// lets it leave then promotes the aggregate's first held row (promoteSQL)
// in a later statement of its transaction, which sees the held flag. A
// predecessor that is locked by someone else is skipped, and the row is
// neither claimed nor held: the next claim looks at it again.
//
// On a partitioned table the status condition of the UPDATEs lets the
// planner leave sealed partitions (CHECK (status = 'sent')) out of them,
// and joining on created_at, the partition key, prunes the rest per row.
func pgClaimSQL(byTenant bool) string {
	return `WITH cand AS (
  SELECT o.id, o.created_at, o.tenant_id, o.aggregate_type, o.aggregate_id,
         o.aggregate_version, o.available_at, o.size_bytes
  FROM outbox_events o
  WHERE ` + dueFilter(byTenant) + `
  ORDER BY o.available_at, o.id
  LIMIT @scan
  FOR UPDATE SKIP LOCKED
), judged AS (
  SELECT c.*, ` + blocked("c", "") + ` AS blocked
  FROM cand c
), budget AS (
  SELECT j.id, j.created_at, j.size_bytes,
         sum(j.size_bytes) OVER (ORDER BY j.available_at, j.id) AS running,
         row_number() OVER (ORDER BY j.available_at, j.id) AS n
  FROM judged j
  WHERE NOT j.blocked
), waits AS MATERIALIZED (
  -- Blocked rows that wait for nothing the claim may take itself, nor for
  -- a row this worker leased in an earlier round: the rows to hold back.
  -- Materialised, so the row locks below are taken for these rows only.
  SELECT j.* FROM judged j
  WHERE j.blocked
    AND NOT EXISTS (
        SELECT 1 FROM judged p
        WHERE NOT p.blocked
          AND p.tenant_id = j.tenant_id
          AND p.aggregate_type = j.aggregate_type
          AND p.aggregate_id = j.aggregate_id
          AND p.aggregate_version < j.aggregate_version)
    AND NOT EXISTS (
        SELECT 1 FROM outbox_events p
        WHERE p.tenant_id = j.tenant_id
          AND p.aggregate_type = j.aggregate_type
          AND p.aggregate_id = j.aggregate_id
          AND p.aggregate_version < j.aggregate_version
          AND p.status = 'publishing'
          AND p.locked_by = @worker
          AND p.aggregate_id <> '')
), held AS (
  UPDATE outbox_events SET held = true
  FROM waits j
  WHERE outbox_events.id = j.id
    AND outbox_events.created_at = j.created_at
    AND outbox_events.status IN ('new', 'publishing', 'failed')
    AND ` + blocked("j", "\n        FOR SHARE SKIP LOCKED") + `
  RETURNING true, ` + heldColumns + `, false
), claimed AS (
  UPDATE outbox_events SET ` + claimSet + `
  FROM budget b
  WHERE outbox_events.id = b.id
    AND outbox_events.created_at = b.created_at
    AND outbox_events.status IN ('new', 'publishing', 'failed')
    AND b.n <= @limit
    AND ` + withinBudget + `
  RETURNING false, ` + returningColumns + `, ` + nextWaits + `
)
SELECT * FROM claimed
UNION ALL
SELECT * FROM held`
}

// sqliteHoldSQL marks held, among the first @scan due rows, those that
// have an earlier unsent or dead event. SQLite serialises writers, so nothing can send that
// earlier event between the check and the write.
func sqliteHoldSQL(byTenant bool) string {
	return `UPDATE outbox_events SET held = true
WHERE id IN (
  SELECT c.id FROM (
    SELECT o.id, o.tenant_id, o.aggregate_type, o.aggregate_id, o.aggregate_version
    FROM outbox_events o
    WHERE ` + dueFilter(byTenant) + `
    ORDER BY o.available_at, o.id
    LIMIT @scan) c
  WHERE ` + blocked("c", "") + `)`
}

// sqliteClaimSQL leases up to @limit due rows that are first in line for
// their aggregate and within the byte budget.
func sqliteClaimSQL(byTenant bool) string {
	return `UPDATE outbox_events SET ` + claimSet + `
WHERE id IN (
  SELECT b.id FROM (
    SELECT c.id, c.size_bytes, sum(c.size_bytes) OVER (ORDER BY c.available_at, c.id) AS running
    FROM (
      SELECT o.id, o.size_bytes, o.available_at
      FROM outbox_events o
      WHERE ` + dueFilter(byTenant) + `
        AND NOT ` + blocked("o", "") + `
      ORDER BY o.available_at, o.id
      LIMIT @limit) c) b
  WHERE ` + withinBudget + `)
RETURNING false, ` + returningColumns + `, ` + nextWaits
}

// nextWaits is true for a claimed row when a later event of its aggregate
// is still to be sent (new, failed or held): settling the row is what lets
// that one go, so the relay should claim again at once (Message.NextWaits).
var nextWaits = fmt.Sprintf(unsentRelativeSQL, "outbox_events", ">", "")

// returningColumns are the columns a claim returns, in the order
// scanMessage reads them.
const returningColumns = `outbox_events.id, outbox_events.tenant_id, outbox_events.topic,
  outbox_events.aggregate_type, outbox_events.aggregate_id, outbox_events.aggregate_version,
  outbox_events.schema_version, outbox_events.payload, outbox_events.metadata,
  outbox_events.occurred_at, outbox_events.created_at, outbox_events.status,
  outbox_events.attempts, outbox_events.available_at, outbox_events.locked_by,
  outbox_events.locked_until, outbox_events.last_error, outbox_events.published_at,
  outbox_events.failed_at, outbox_events.dedup_key, outbox_events.size_bytes`

// heldColumns are returningColumns for a row the claim held back, without
// its payload and metadata: the claim only counts such rows.
var heldColumns = strings.Replace(returningColumns,
	"outbox_events.payload, outbox_events.metadata", `'null'::jsonb, '{}'::jsonb`, 1)

// promoteSQL lets the first held row of each aggregate in @aggs be claimed
// again. It runs in the transaction that moved an event of those aggregates
// out of the unsent states (MarkSent, DeleteSent, Discard), after that
// change, so it sees every row a claim held back behind that event. The
// claim checks the promoted row again and holds it back anew if another
// event still precedes it.
const promoteSQL = `UPDATE outbox_events SET held = false
WHERE held
  AND (tenant_id, aggregate_type, aggregate_id) IN @aggs
  AND aggregate_version = (
    SELECT min(h.aggregate_version) FROM outbox_events h
    WHERE h.held
      AND h.tenant_id = outbox_events.tenant_id
      AND h.aggregate_type = outbox_events.aggregate_type
      AND h.aggregate_id = outbox_events.aggregate_id)`

// insertColumns are the columns Insert writes; the others start NULL.
const insertColumns = `INSERT INTO outbox_events (id, tenant_id, topic, aggregate_type, aggregate_id,
  aggregate_version, schema_version, payload, metadata, occurred_at, created_at, status,
  attempts, available_at, dedup_key, size_bytes) VALUES `

// insertRow is one row of insertColumns' placeholders.
const insertRow = `(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

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
// A message without an AvailableAt is due from the database's current time
// (now: the clock's value for it).
func insertArgs(msgs []*Message, now any) []any {
	args := make([]any, 0, len(msgs)*16)
	for _, m := range msgs {
		var due any = m.AvailableAt
		if m.AvailableAt.IsZero() {
			due = now
		}
		args = append(args, m.ID, m.TenantID, m.Topic, m.AggregateType, m.AggregateID,
			m.AggregateVersion, m.SchemaVersion, m.Payload, m.Metadata, m.OccurredAt, m.CreatedAt, string(m.Status),
			m.Attempts, due, m.DedupKey, m.SizeBytes)
	}
	return args
}

// aggregateReturning returns the aggregate of each row a settling
// statement changed, for promoteSQL.
const aggregateReturning = `
RETURNING tenant_id, aggregate_type, aggregate_id`

// ownedByWorker fences every outcome: only the worker holding the lease may
// record it, so a projector whose lease was taken over changes nothing.
const ownedByWorker = `status = 'publishing' AND locked_by = @worker`

const markSentSQL = `UPDATE outbox_events
SET status = 'sent', published_at = @now, available_at = @now,
    locked_by = NULL, locked_until = NULL, last_error = NULL
WHERE id IN @ids AND ` + ownedByWorker + aggregateReturning

const deleteSentSQL = `DELETE FROM outbox_events WHERE id IN @ids AND ` + ownedByWorker + aggregateReturning

const markFailedSQL = `UPDATE outbox_events
SET status = @status, attempts = attempts + 1, available_at = @retry_at,
    last_error = @error, failed_at = @now, locked_by = NULL, locked_until = NULL
WHERE id = @id AND ` + ownedByWorker

const releaseSQL = `UPDATE outbox_events
SET status = CASE WHEN attempts > 0 THEN 'failed' ELSE 'new' END,
    available_at = @now, locked_by = NULL, locked_until = NULL
WHERE id IN @ids AND ` + ownedByWorker

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

// freeVersionsSQL is freeDedupKeysSQL for the aggregate versions a
// partitioned table reserved.
const freeVersionsSQL = `DELETE FROM outbox_aggregate_versions
WHERE (tenant_id, aggregate_type, aggregate_id, aggregate_version) IN (
  SELECT v.tenant_id, v.aggregate_type, v.aggregate_id, v.aggregate_version FROM outbox_aggregate_versions v
  WHERE v.created_at < @end
    AND NOT EXISTS (SELECT 1 FROM outbox_events e WHERE e.id = v.event_id AND e.created_at = v.created_at)
  LIMIT @limit)`
