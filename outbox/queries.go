package outbox

import (
	"strings"
	"time"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/wire"
)

// Every SQL statement of the package, in one place: one named constant or
// builder per statement, each saying what it does and which index it
// reads. Only constant fragments are joined; every value is a bind
// parameter. No other non-test file of the package holds SQL text
// (TestSQLOnlyInQueriesFile): no string literal with SELECT, UPDATE,
// DELETE or INSERT, and no Raw, Exec, Where or other GORM call that takes
// SQL with a literal.
//
// In order: the claim (relay.go), the insert (write.go), the outcomes a
// projector records (relay.go), partition maintenance (partition.go), the
// dead-event calls (ops.go), retention (retention.go), the figures
// (stats.go), relay registration (relays.go) and the table's kind and
// clock (partition.go, clock.go).

// bind returns args as GORM's Raw and Exec take them for query. GORM reads
// a map as named parameters only in a statement that contains '@', and as
// one positional value otherwise, so a statement without parameters (a
// filter with no field set) gets none.
func bind(query string, args map[string]any) []any {
	if !strings.Contains(query, "@") {
		return nil
	}
	return []any{args}
}

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

// The per-aggregate checks below each read one row of an index over the
// aggregate and its versions (outbox_events_unsent_aggregate,
// outbox_events_leased, outbox_events_held): the first row, in the
// index's order, of a range of its keys written as row comparisons over
// aggregateKey. Those indexes lead with aggregate_id and no other does, so
// no other index can read the range, and only they are ordered by it: the
// planner's other choices (a sequential scan, or a full scan of another
// index, then a sort) cost the whole table, whatever its statistics say.
// Plain equality conditions under EXISTS let it guess otherwise: analyzed
// while one aggregate filled the table, it expected an early match in a
// sequential scan; never analyzed, an index led by tenant_id looked as
// good.

// aggregateKey lists alias's columns in the order of the per-aggregate
// indexes: the aggregate, then the version.
func aggregateKey(alias string) string {
	return "(" + alias + ".aggregate_id, " + alias + ".aggregate_type, " + alias + ".tenant_id, " + alias + ".aggregate_version)"
}

// aggregateOrder is aggregateKey as an ORDER BY list.
func aggregateOrder(alias string) string {
	return strings.Trim(aggregateKey(alias), "()")
}

// Versions are at least 0 (validate.go): these bounds take in every version
// of an aggregate.
const (
	firstVersion = "-9223372036854775807"
	lastVersion  = "9223372036854775807"
)

// versionRange selects the rows of alias p of one aggregate (its id, type
// and tenant, as SQL expressions) whose version lies between lo and hi:
// lo is ">" or ">=", hi "<" or "<=".
func versionRange(p, aggID, aggType, tenant, lo, loVersion, hi, hiVersion string) string {
	agg := aggID + ", " + aggType + ", " + tenant + ", "
	return aggregateKey(p) + " " + lo + " (" + agg + loVersion + ")\n          AND " +
		aggregateKey(p) + " " + hi + " (" + agg + hiVersion + ")"
}

// unsentRelative is true when another event of the aggregate of row, with
// a version before (before = true) or after the row's, is new, publishing,
// failed or dead; lock is appended to the inner SELECT (a row lock). It is
// one probe of the outbox_events_unsent_aggregate index: the nearest such
// event to the row, walking the index away from it.
//
// Walking away from the row matters because the index keeps a stale entry
// for each version of the aggregate that was sent, until VACUUM removes it,
// and an open snapshot anywhere keeps those entries alive: each costs a
// visit. Sent versions lie before the aggregate's first unsent one, so a
// walk up from the first version would pass the whole sent history before
// reaching a row's predecessor, for every row probed; a walk down from the
// row meets its nearest predecessor first, and passes that history only
// when the row is the aggregate's first unsent event (the one probe per
// aggregate a claim makes, never one per row held back). A walk up from a
// row, for a later event, meets unsent events first.
func unsentRelative(row string, before bool, lock string) string {
	id, typ, tenant, version := row+".aggregate_id", row+".aggregate_type", row+".tenant_id", row+".aggregate_version"
	between := versionRange("p", id, typ, tenant, ">=", firstVersion, "<", version)
	order := aggregateDescending("p")
	if !before {
		between = versionRange("p", id, typ, tenant, ">", version, "<=", lastVersion)
		order = aggregateOrder("p")
	}
	return `(` + id + ` <> '' AND (
        SELECT p.aggregate_version FROM outbox_events p
        WHERE ` + between + `
          AND p.status IN ('new', 'publishing', 'failed', 'dead')
          AND p.aggregate_id <> ''
        ORDER BY ` + order + `
        LIMIT 1` + lock + `) IS NOT NULL)`
}

// aggregateDescending is aggregateOrder walked backwards.
func aggregateDescending(alias string) string {
	return strings.ReplaceAll(aggregateOrder(alias), ",", " DESC,") + " DESC"
}

// blocked is true when an earlier event of row's aggregate is still to be
// sent or dead, so row must wait; lock is appended to the inner SELECT.
func blocked(row, lock string) string { return unsentRelative(row, true, lock) }

// leasedBefore is true when an earlier event of row j's aggregate is
// leased to @worker: one probe of the outbox_events_leased index, which
// lists leased rows by worker, then as aggregateKey.
const leasedBefore = `(
        SELECT p.aggregate_version FROM outbox_events p
        WHERE (p.locked_by, p.aggregate_id, p.aggregate_type, p.tenant_id, p.aggregate_version)
                >= (@worker, j.aggregate_id, j.aggregate_type, j.tenant_id, ` + firstVersion + `)
          AND (p.locked_by, p.aggregate_id, p.aggregate_type, p.tenant_id, p.aggregate_version)
                < (@worker, j.aggregate_id, j.aggregate_type, j.tenant_id, j.aggregate_version)
          AND p.status = 'publishing'
          AND p.aggregate_id <> ''
        ORDER BY p.locked_by, p.aggregate_id, p.aggregate_type, p.tenant_id, p.aggregate_version
        LIMIT 1) IS NOT NULL`

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
// (nextWaits). @scan is @limit in a claim's first round; later rounds
// look further ahead (nextScan). Each result row starts with a flag: true
// for a row it held back (payload and metadata left out), false for a
// claimed one; then come nextWaits (false for a held row) and the round's
// edge (claimEdge).
//
// The walk starts at the due row (@after_at, @after_id), in the due
// index's order: the edge of the claim's previous round, or the front of
// the index in its first round (a NULL time and an empty id). So a
// claim's later rounds read the rows its earlier rounds did not, instead
// of judging again every row those left waiting behind the rows they
// took. Rows behind an earlier version of their aggregate among those
// looked at are blocked without a probe (judged).
//
// Holding a row back is safe against a concurrent MarkSent of the event
// that blocks it: the claim holds back a row only while it holds a share
// lock on one of its unsent predecessors (the nearest unsent predecessor
// of the aggregate's first row it holds back: one lock per aggregate), so
// that predecessor cannot leave (be marked sent or deleted) until the
// claim commits; the statement that lets it leave then promotes the
// aggregate's first held row (promoteSQL) in a later statement of its
// transaction, which sees the held flag. A predecessor that is locked by
// someone else is skipped for the next one; when none is left, the
// aggregate's rows are neither claimed nor held: the next claim looks at
// them again.
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
    AND (o.available_at, o.id) >= (COALESCE(CAST(@after_at AS timestamptz), '-infinity'), @after_id)
  ORDER BY o.available_at, o.id
  LIMIT @scan
  FOR UPDATE SKIP LOCKED
), judged AS (
  -- A row behind an earlier version of its aggregate among the rows
  -- looked at is blocked by it (due, so unsent): only each aggregate's
  -- first row here needs the index probe.
  SELECT c.*, CASE WHEN c.aggregate_id <> '' AND c.first_seen < c.aggregate_version THEN true
                   ELSE ` + blocked("c", "") + ` END AS blocked
  FROM (
    SELECT *, min(aggregate_version) OVER (PARTITION BY tenant_id, aggregate_type, aggregate_id) AS first_seen
    FROM cand) c
), budget AS (
  SELECT j.id, j.created_at, j.available_at, j.size_bytes,
         sum(j.size_bytes) OVER (ORDER BY j.available_at, j.id) AS running,
         row_number() OVER (ORDER BY j.available_at, j.id) AS n
  FROM judged j
  WHERE NOT j.blocked
), waits AS MATERIALIZED (
  -- Blocked rows that wait for nothing the claim may take itself, nor for
  -- a row this worker leased in an earlier round: the rows to hold back.
  -- Materialised, so the row locks below are taken for these rows only.
  -- first_free is the first version of the row's aggregate the claim may
  -- take: a window over the rows judged, so no plan compares them in pairs.
  SELECT j.* FROM (
    SELECT *, min(CASE WHEN NOT blocked THEN aggregate_version END)
                OVER (PARTITION BY tenant_id, aggregate_type, aggregate_id) AS first_free
    FROM judged) j
  WHERE j.blocked
    AND (j.first_free IS NULL OR j.first_free >= j.aggregate_version)
    AND NOT ` + leasedBefore + `
), guards AS MATERIALIZED (
  -- The aggregates whose waiting rows are held back: those whose first
  -- waiting row has an unsent predecessor the claim can share-lock. The
  -- lock falls on that predecessor, which no part of this statement
  -- changes (it is neither held nor claimed here), and every waiting row
  -- of the aggregate comes after it: one probe per aggregate.
  SELECT f.tenant_id, f.aggregate_type, f.aggregate_id FROM (
    SELECT DISTINCT ON (w.tenant_id, w.aggregate_type, w.aggregate_id) w.*
    FROM waits w
    ORDER BY w.tenant_id, w.aggregate_type, w.aggregate_id, w.aggregate_version) f
  WHERE ` + blocked("f", "\n        FOR SHARE SKIP LOCKED") + `
), held AS (
  UPDATE outbox_events SET held = true
  FROM waits j
  JOIN guards g ON g.tenant_id = j.tenant_id AND g.aggregate_type = j.aggregate_type
               AND g.aggregate_id = j.aggregate_id
  WHERE outbox_events.id = j.id
    AND outbox_events.created_at = j.created_at
    AND ` + stillUnsent + `
  RETURNING true, ` + heldColumns + `, false
), claimed AS (
  UPDATE outbox_events SET ` + claimSet + `
  FROM budget b
  WHERE outbox_events.id = b.id
    AND outbox_events.created_at = b.created_at
    AND ` + stillUnsent + `
    AND b.n <= @limit
    AND ` + withinBudget + `
  RETURNING false, ` + returningColumns + `, ` + nextWaits + `
), edge AS (
  ` + claimEdge + `
)
SELECT r.*, e.available_at, e.id FROM (
  SELECT * FROM claimed
  UNION ALL
  SELECT * FROM held) r
CROSS JOIN edge e`
}

// stillUnsent re-checks, in the claim's updates, that a row it locked is
// still unsent. It is written so that it implies no partial index's
// predicate: the updates then reach their rows through the primary key
// alone. As a plain IN list it let the planner, on a small table with no
// statistics, join through the monitoring index outbox_events_unsent on
// created_at (not that index's leading column), filtering on id, so each
// claimed row walked past every row created at the same instant
// (TestPostgresPlansSmallTableNoStatistics). The plain `<> 'sent'` is what
// leaves sealed partitions (CHECK (status = 'sent')) out of the updates
// (TestPartitionedClaimPrunesSealedPartitions); it implies no index's
// predicate.
const stillUnsent = `outbox_events.status <> 'sent' AND (outbox_events.status IN ('new', 'publishing', 'failed')) IS TRUE`

// claimEdge is where the next round of a claim starts its walk: the first
// row the round could take but left for the limit or the byte budget, or
// else the last row it looked at. Every row the walk passed before the
// edge was taken, held back, left waiting behind an event that is still
// unsent, or locked by another claimer, so the claim's next round need
// not judge it again. A row that becomes claimable meanwhile (its
// predecessor settled, another claimer let it go) waits for the next
// claim, which starts from the front: the projector that settled the
// predecessor claims again at once (Message.NextWaits).
const claimEdge = `SELECT x.available_at, x.id FROM (
    (SELECT b.available_at, b.id, 0 AS k FROM budget b
     WHERE b.n > @limit OR NOT ` + withinBudget + `
     ORDER BY b.n
     LIMIT 1)
    UNION ALL
    (SELECT c.available_at, c.id, 1 FROM cand c
     ORDER BY c.available_at DESC, c.id DESC
     LIMIT 1)) x
  ORDER BY x.k
  LIMIT 1`

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
var nextWaits = unsentRelative("outbox_events", false, "")

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

// promoteSQL lets the first held row of each of n aggregates be claimed
// again; its arguments are the aggregates' tenant, type and id, in that
// order, n times. It runs in the transaction that moved an event of those
// aggregates out of the unsent states (MarkSent, DeleteSent, Discard),
// after that change, so it sees every row a claim held back behind that
// event. The claim checks the promoted row again and holds it back anew if
// another event still precedes it. Each aggregate's first held row is one
// probe of the outbox_events_held index, and the row is then updated by
// its primary key; the update does not test held again, so no plan may
// walk the held rows instead (a row promoted twice is only checked again).
func promoteSQL(n int) string {
	return `UPDATE outbox_events SET held = false
WHERE id IN (
  SELECT (
    SELECT h.id FROM outbox_events h
    WHERE h.held
      AND ` + versionRange("h", "a.column3", "a.column2", "a.column1", ">=", firstVersion, "<=", lastVersion) + `
    ORDER BY ` + aggregateOrder("h") + `
    LIMIT 1)
  FROM (VALUES ` + dialect.Tuples(n, 3) + `) a)`
}

// insertColumns are the columns Insert writes; the others start NULL.
const insertColumns = `INSERT INTO outbox_events (id, tenant_id, topic, aggregate_type, aggregate_id,
  aggregate_version, schema_version, payload, metadata, occurred_at, created_at, status,
  attempts, available_at, dedup_key, size_bytes) VALUES `

// insertWidth is how many columns insertColumns names: the placeholders
// of each row.
const insertWidth = 16

// insertOnConflict skips a row whose dedup key its tenant already used.
const insertOnConflict = `
ON CONFLICT (tenant_id, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING`

// insertSQL is the multi-row INSERT of n messages. A plain statement rather
// than GORM's Create: every commit runs it, and Create reflects over the
// Message struct for each row.
func insertSQL(n int) string {
	return insertColumns + dialect.Tuples(n, insertWidth)
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

// markSentSQL records the broker's confirmation of @worker's rows @ids
// (primary key) and returns their aggregates, for promoteSQL.
const markSentSQL = `UPDATE outbox_events
SET status = 'sent', published_at = @now, available_at = @now,
    locked_by = NULL, locked_until = NULL, last_error = NULL
WHERE id IN @ids AND ` + ownedByWorker + aggregateReturning

// deleteSentSQL is markSentSQL for projectors that delete rows once
// published.
const deleteSentSQL = `DELETE FROM outbox_events WHERE id IN @ids AND ` + ownedByWorker + aggregateReturning

// markFailedSQL records a failed attempt of @worker's row @id (primary
// key): failed and due again at @retry_at, or dead (@status).
const markFailedSQL = `UPDATE outbox_events
SET status = @status, attempts = attempts + 1, available_at = @retry_at,
    last_error = @error, failed_at = @now, locked_by = NULL, locked_until = NULL
WHERE id = @id AND ` + ownedByWorker

// releaseSQL hands @worker's rows @ids (primary key) back, due at once,
// with their attempts unchanged.
const releaseSQL = `UPDATE outbox_events
SET status = CASE WHEN attempts > 0 THEN 'failed' ELSE 'new' END,
    available_at = @now, locked_by = NULL, locked_until = NULL
WHERE id IN @ids AND ` + ownedByWorker

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

// The dead events an operator selects with a Filter. Every statement below
// starts from deadWhere, so listing, counting, requeueing and discarding
// with one filter touch the same rows.

// deadWhere selects the dead rows a Filter matches: the status condition is
// the predicate of the outbox_events_dead index, and each field of the
// filter that is set adds its bind parameter (see Filter.args).
func deadWhere(f Filter) string {
	w := "status = 'dead'"
	if len(f.IDs) > 0 {
		w += " AND id IN @ids"
	}
	if f.Tenant != "" {
		w += " AND tenant_id = @tenant"
	}
	if f.Topic != "" {
		w += " AND topic = @topic"
	}
	if f.AggregateType != "" {
		w += " AND aggregate_type = @aggregate_type"
	}
	if f.AggregateID != "" {
		w += " AND aggregate_id = @aggregate_id"
	}
	return w
}

// listDeadSQL returns up to @limit dead rows matching f in id order, the
// order of the outbox_events_dead index.
func listDeadSQL(f Filter) string {
	return "SELECT * FROM outbox_events WHERE " + deadWhere(f) + " ORDER BY id LIMIT @limit"
}

// countDeadSQL counts the dead rows matching f (outbox_events_dead).
func countDeadSQL(f Filter) string {
	return "SELECT count(*) FROM outbox_events WHERE " + deadWhere(f)
}

// requeueSet sets a row back to new: no attempts, due at once (@now), no
// lease. Its last error stays until the next attempt.
const requeueSet = `status = 'new', attempts = 0, available_at = @now, locked_by = NULL, locked_until = NULL`

// requeueSQL sets the dead rows matching f back to new (outbox_events_dead).
func requeueSQL(f Filter) string {
	return "UPDATE outbox_events SET " + requeueSet + " WHERE " + deadWhere(f)
}

// discardSQL deletes the dead rows matching f (outbox_events_dead) and
// returns their aggregates, for promoteSQL.
func discardSQL(f Filter) string {
	return "DELETE FROM outbox_events WHERE " + deadWhere(f) + aggregateReturning
}

// getSQL reads one row by its primary key.
const getSQL = `SELECT * FROM outbox_events WHERE id = @id`

// sentBefore selects the sent rows published before @before, of @tenant
// when byTenant: the outbox_events_sent index's predicate and column.
// PurgeSent deletes and CountSent counts exactly these rows.
func sentBefore(byTenant bool) string {
	w := "status = 'sent' AND published_at < @before"
	if byTenant {
		w += " AND tenant_id = @tenant"
	}
	return w
}

// purgeSentSQL deletes one batch of @limit rows of sentBefore, oldest
// first along outbox_events_sent.
func purgeSentSQL(byTenant bool) string {
	return `DELETE FROM outbox_events WHERE id IN (
  SELECT id FROM outbox_events
  WHERE ` + sentBefore(byTenant) + `
  ORDER BY published_at LIMIT @limit)`
}

// countSentSQL counts the rows purgeSentSQL would delete
// (outbox_events_sent).
func countSentSQL(byTenant bool) string {
	return "SELECT count(*) FROM outbox_events WHERE " + sentBefore(byTenant)
}

// breakdownSQL is Breakdown's statement. Its status filter is the predicate
// of the outbox_events_unsent index word for word, so that the planner may
// read that index alone. min(created_at) comes back as text on SQLite, so
// it is read as text on both and parsed.
func breakdownSQL(d dialect.Dialect, byTenant bool) string {
	oldest := "min(created_at)"
	if d == dialect.Postgres {
		oldest = `to_char(min(created_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`
	}
	where := "status IN ('new', 'publishing', 'failed', 'dead')"
	if byTenant {
		where += " AND tenant_id = @tenant"
	}
	return "SELECT tenant_id, topic, status, count(*) AS n, " + oldest + " AS oldest FROM outbox_events WHERE " +
		where + " GROUP BY tenant_id, topic, status"
}

// timeline is a time column the activity figures count rows by, with the
// condition that selects the rows whose time is at or after @since.
type timeline struct{ column, where string }

var (
	// published selects the rows sent from @since on: the outbox_events_sent
	// index's predicate and column.
	published = timeline{"published_at", "status = 'sent' AND published_at >= @since"}
	// failed selects the rows whose last failure fell at or after @since
	// (outbox_events_failed_at, which holds only rows that failed).
	failed = timeline{"failed_at", "failed_at >= @since"}
)

// sinceWhere is tl's condition, for @tenant's rows alone when byTenant.
func sinceWhere(tl timeline, byTenant bool) string {
	if byTenant {
		return tl.where + " AND tenant_id = @tenant"
	}
	return tl.where
}

// activitySQL counts tl's rows per minute (Unix seconds / 60) of tl's
// column.
func activitySQL(d dialect.Dialect, tl timeline, byTenant bool) string {
	bucket := "CAST(strftime('%s', " + tl.column + ") AS INTEGER) / 60"
	if d == dialect.Postgres {
		bucket = "CAST(floor(extract(epoch FROM " + tl.column + ") / 60) AS BIGINT)"
	}
	return "SELECT " + bucket + " AS bucket, count(*) AS n FROM outbox_events WHERE " +
		sinceWhere(tl, byTenant) + " GROUP BY bucket"
}

// recentSQL counts tl's rows per tenant.
func recentSQL(tl timeline, byTenant bool) string {
	return "SELECT tenant_id, count(*) AS n FROM outbox_events WHERE " + sinceWhere(tl, byTenant) + " GROUP BY tenant_id"
}

// Relay registration (bento_outbox_relays, PostgreSQL only). The table has
// a row per listening projector, keyed by worker_id.

// setRelayIdleSQL records whether @worker is idle, creating its row on first
// use.
const setRelayIdleSQL = `INSERT INTO bento_outbox_relays (worker_id, idle, changed_at)
VALUES (@worker, @idle, now())
ON CONFLICT (worker_id) DO UPDATE SET idle = EXCLUDED.idle, changed_at = EXCLUDED.changed_at`

// removeRelaySQL deletes @worker's row (primary key).
const removeRelaySQL = `DELETE FROM bento_outbox_relays WHERE worker_id = @worker`

// relaysSQL lists the registered projectors in primary key order.
const relaysSQL = `SELECT worker_id, idle, changed_at FROM bento_outbox_relays ORDER BY worker_id`

// writersOpenSQL tries the key the outbox trigger holds shared from before
// it reads bento_outbox_relays until its transaction ends. Run on its own,
// the statement is its own transaction, so a key it gets is released as it
// returns; it never waits, so no writer ever queues behind it.
const writersOpenSQL = `SELECT NOT pg_try_advisory_xact_lock(hashtext(n.nspname || '.bento_outbox_relays'))
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = 'outbox_events'::regclass`

// tableKindSQL reads outbox_events' kind from the catalog: 'p' when it is
// partitioned, NULL when it does not exist.
const tableKindSQL = `SELECT relkind::text FROM pg_class WHERE oid = to_regclass('outbox_events')`

// sealedCheck is the CHECK constraint that seals a partition whose rows are
// all sent, so claims skip it.
const sealedCheck = `status = 'sent'`

// partitionBound is t as a partition bound literal (UTC).
func partitionBound(t time.Time) string { return "'" + t.UTC().Format("2006-01-02 15:04:05") + "+00'" }

// partitionPendingSQL reports whether partition p still holds a row that
// is not sent: one EXISTS per partial index (outbox_events_due,
// outbox_events_held, outbox_events_dead), so each reads only its index.
func partitionPendingSQL(p string) string {
	return `SELECT EXISTS (SELECT 1 FROM ` + p + ` WHERE status IN ('new', 'publishing', 'failed') AND NOT held)
		    OR EXISTS (SELECT 1 FROM ` + p + ` WHERE held)
		    OR EXISTS (SELECT 1 FROM ` + p + ` WHERE status = 'dead')`
}

// claimSettingsSQL sets the statement timeout, in milliseconds (as
// text), for the rest of a claim's transaction, and makes it commit
// asynchronously (see dialect.CommitAsync): a crash of the server can only
// undo the claim, whose rows are then claimed again.
const claimSettingsSQL = `SELECT set_config('statement_timeout', ?, true), ` + dialect.AsyncCommit

// dbNowSQL is the database's current time on PostgreSQL (dbClock).
const dbNowSQL = `now()`

// dbNowPlusSQL is the database's current time plus ? seconds on PostgreSQL
// (dbClock).
const dbNowPlusSQL = `now() + make_interval(secs => ?)`

// The scheduled messages' statements (schedule.go). Every lookup of due
// rows reads the outbox_scheduled_due index, whose predicate is
// waitingScheduled word for word and whose order is (due_at, id): the
// statements ask for rows in that order with a LIMIT, so the index is the
// one plan that does not read every waiting row.

// waitingScheduled selects the scheduled rows not yet released.
const waitingScheduled = `s.released_at IS NULL`

const scheduledTenant = `
    AND s.tenant_id = @tenant`

func scheduledFilter(byTenant bool) string {
	if byTenant {
		return waitingScheduled + scheduledTenant
	}
	return waitingScheduled
}

// scheduleSQL writes one scheduled message and returns its due time as the
// database computed it.
const scheduleSQL = `INSERT INTO outbox_scheduled (id, tenant_id, topic, schedule_key, schema_version,
  payload, metadata, occurred_at, created_at, due_at, size_bytes)
VALUES (@id, @tenant, @topic, @key, @schema_version, @payload, @metadata, @occurred_at, @created_at, @due, @size)
RETURNING due_at`

// dueRows selects up to @limit waiting rows due at @due_now, first due first
// (outbox_scheduled_due), and of those the first ones whose payload and
// metadata add up to no more than @max_bytes (the first always). On
// PostgreSQL they are locked with SKIP LOCKED: a row another projector is
// releasing, or that a Cancel in an open transaction is deleting, is left
// to that transaction.
func dueRows(d dialect.Dialect, byTenant bool) string {
	lock := ""
	if d == dialect.Postgres {
		lock = `
    FOR UPDATE SKIP LOCKED`
	}
	return `SELECT b.id FROM (
    SELECT d.id, d.size_bytes,
           sum(d.size_bytes) OVER (ORDER BY d.due_at, d.id) AS running,
           row_number() OVER (ORDER BY d.due_at, d.id) AS n
    FROM (
      SELECT s.id, s.due_at, s.size_bytes FROM outbox_scheduled s
      WHERE ` + scheduledFilter(byTenant) + `
        AND s.due_at <= @due_now
      ORDER BY s.due_at, s.id
      LIMIT @limit` + lock + `) d) b
  WHERE b.running <= @max_bytes OR b.n = 1`
}

// releasedInsert copies released rows (FROM s) into outbox_events, with
// the metadata expression meta: the scheduled row's own columns, no
// aggregate (a scheduled message neither waits for nor holds back any
// aggregate's events), created @now. Unleased, the row is new and due at
// its due time, so that claims take it in due order among the events;
// leased, it is leased to @worker until @until, as a claim leaves it.
func releasedInsert(meta string, leased bool) string {
	state := `'new', 0, s.due_at, NULL, NULL`
	if leased {
		state = `'publishing', 0, @until, @worker, @until`
	}
	return `INSERT INTO outbox_events (id, tenant_id, topic, aggregate_type, aggregate_id,
  aggregate_version, schema_version, payload, metadata, occurred_at, created_at, status,
  attempts, available_at, locked_by, locked_until, size_bytes)
SELECT s.id, s.tenant_id, s.topic, '', '', 0, s.schema_version, s.payload, ` + meta + `,
  s.occurred_at, @now, ` + state + `, s.size_bytes`
}

// pgDueMeta is, on PostgreSQL, a released row's metadata: the scheduled
// row's, with its due time added (wire.DueAt).
const pgDueMeta = `s.metadata || jsonb_build_object('` + wire.DueAt + `',
    to_char(s.due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))`

// pgReleaseDueSQL releases the due rows in one statement: it marks them
// released and copies them into outbox_events, and returns, first due
// first, how late each one is in seconds by the database's clock. Leased,
// each row of the answer is a claimed row (scanClaimed) followed by that
// figure.
func pgReleaseDueSQL(byTenant, leased bool) string {
	returning := `id`
	if leased {
		returning = returningColumns
	}
	query := `WITH released AS (
  UPDATE outbox_scheduled SET released_at = @now
  WHERE id IN (` + dueRows(dialect.Postgres, byTenant) + `)
  RETURNING *
), copied AS (
  ` + releasedInsert(pgDueMeta, leased) + `
  FROM released s
  RETURNING ` + returning + `
)
SELECT `
	if leased {
		query += `false, c.*, false, `
	}
	return query + `EXTRACT(EPOCH FROM (CAST(@due_now AS timestamptz) - r.due_at))
FROM copied c JOIN released r ON r.id = c.id
ORDER BY r.due_at, r.id`
}

// sqliteReleaseMarkSQL marks the due rows released and returns their ids
// and due times; sqliteReleaseCopySQL then copies them (@ids) into
// outbox_events, in the same transaction.
func sqliteReleaseMarkSQL(byTenant bool) string {
	return `UPDATE outbox_scheduled SET released_at = @now
WHERE id IN (` + dueRows(dialect.SQLite, byTenant) + `)
RETURNING id, due_at`
}

// sqliteReleaseCopySQL copies the rows marked released (@ids) into
// outbox_events, leased or not (releasedInsert).
func sqliteReleaseCopySQL(leased bool) string {
	return releasedInsert(`json_set(s.metadata, '$.`+wire.DueAt+`',
    strftime('%Y-%m-%dT%H:%M:%fZ', s.due_at))`, leased) + `
FROM outbox_scheduled s
WHERE s.id IN @ids`
}

// sqliteLeasedSQL reads the rows a leased release copied (@ids) as a claim
// returns them (scanClaimed), first due first.
const sqliteLeasedSQL = `SELECT false, ` + returningColumns + `, false
FROM outbox_events JOIN outbox_scheduled s ON s.id = outbox_events.id
WHERE outbox_events.id IN @ids
ORDER BY s.due_at, s.id`

// nextDueSQL finds the first waiting row: on PostgreSQL its due time as
// seconds from @due_now (negative when it is already due), read by the
// server's clock; on SQLite its due_at as the driver wrote it, for the
// store to compare with its own clock. No row when none waits.
func nextDueSQL(d dialect.Dialect, byTenant bool) string {
	col := `s.due_at`
	if d == dialect.Postgres {
		col = `EXTRACT(EPOCH FROM (s.due_at - CAST(@due_now AS timestamptz)))`
	}
	return `SELECT ` + col + ` FROM outbox_scheduled s
WHERE ` + scheduledFilter(byTenant) + `
ORDER BY s.due_at, s.id
LIMIT 1`
}

// keyIndexed is the predicate of outbox_scheduled_key. Every lookup by
// key states it, although a key is never empty: a prepared statement's
// generic plan is made without the key's value, so it can use the partial
// index only when the statement itself implies the index's predicate.
// Without it, such a plan reads every waiting row through the due index
// (TestCancelKeepsItsIndexUnderAGenericPlan).
const keyIndexed = `schedule_key <> ''`

// cancelSQL deletes the waiting rows of @tenant named @key
// (outbox_scheduled_key). On PostgreSQL a row being released waits for
// that release to commit and is then no longer waiting.
const cancelSQL = `DELETE FROM outbox_scheduled
WHERE tenant_id = @tenant AND schedule_key = @key AND ` + keyIndexed + ` AND released_at IS NULL`

// countKeySQL counts the rows of @tenant named @key that are left after
// cancelSQL: those already released.
const countKeySQL = `SELECT count(*) FROM outbox_scheduled
WHERE tenant_id = @tenant AND schedule_key = @key AND ` + keyIndexed

// scheduledBacklogSQL counts the waiting rows and finds the first due time
// (outbox_scheduled_due).
func scheduledBacklogSQL(byTenant bool) string {
	return `SELECT count(*) AS n, min(s.due_at) AS first_due FROM outbox_scheduled s
WHERE ` + scheduledFilter(byTenant)
}

// purgeReleasedSQL deletes one batch of @limit released rows released
// before @before (outbox_scheduled_released).
func purgeReleasedSQL(byTenant bool) string {
	return `DELETE FROM outbox_scheduled WHERE id IN (
  SELECT id FROM outbox_scheduled
  WHERE ` + releasedBefore(byTenant) + `
  ORDER BY released_at LIMIT @limit)`
}

// releasedBefore selects the scheduled rows released before @before, of
// @tenant when byTenant.
func releasedBefore(byTenant bool) string {
	w := "released_at < @before"
	if byTenant {
		w += " AND tenant_id = @tenant"
	}
	return w
}

// countReleasedSQL counts the rows purgeReleasedSQL would delete.
func countReleasedSQL(byTenant bool) string {
	return "SELECT count(*) FROM outbox_scheduled WHERE " + releasedBefore(byTenant)
}

// listScheduledSQL lists up to @limit waiting rows, first due first, of
// @tenant and named @key when those filters are set: along
// outbox_scheduled_due, or outbox_scheduled_key for a key.
func listScheduledSQL(byTenant, byKey bool) string {
	w := scheduledFilter(byTenant)
	if byKey {
		w += `
    AND s.schedule_key = @key AND s.` + keyIndexed
	}
	return `SELECT s.id, s.tenant_id, s.topic, s.schedule_key, s.payload, s.due_at, s.created_at
FROM outbox_scheduled s
WHERE ` + w + `
ORDER BY s.due_at, s.id
LIMIT @limit`
}
