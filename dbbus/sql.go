package dbbus

import "github.com/bentoevents/bento/internal/dialect"

// The statements that matter, per dialect. Each reads or writes the rows it
// names through an index: the claim through dbbus_deliveries_ready, the
// rescue through dbbus_deliveries_leased, acks and releases by primary key.

// NotifyChannel is the PostgreSQL channel a publishing transaction
// notifies. The payload is its schema (current_schema()), then a newline
// and the queues it delivered to, separated by spaces; the schema alone
// wakes every subscription of the schema. Subscribers LISTEN on it as a
// hint to claim at once; polling stays the fallback.
const NotifyChannel = "bento_dbbus"

// UnroutableGroup is the reserved group that keeps the messages no binding
// matches: each gets one delivery row in it, which [Depth] counts and a
// subscriber of the group reads. It is the name the memory bus
// (messaging.MemoryUnroutableQueue) and RabbitMQ use for the same role.
const UnroutableGroup = "bento.unroutable"

// statements is the SQL of one dialect.
type statements struct {
	// claim leases up to @limit ready deliveries of @group, lowest id
	// first, with @token for @ms milliseconds; it returns id, message_id,
	// topic and attempts, and with claimBodies the message's metadata and
	// payload too (NULL when the body is missing).
	claim       string
	claimBodies bool
	// rescue makes up to @limit expired leases of @group ready again,
	// counting an attempt (the holder crashed or stalled).
	rescue string
	// lockBodies locks the body rows of the message ids given, in id
	// order, to serialise the acks of one message's deliveries (empty: the
	// database serialises writers anyway).
	lockBodies string
	// browse reads up to @limit ready deliveries of @group after id
	// @after, lowest id first, and on PostgreSQL locks them, waiting for a
	// lock another browse holds (see [Browse]): id, message_id, topic,
	// attempts.
	browse string
	// own makes @owner the owner of @queue for @ms milliseconds, when the
	// queue has no owner, its owner's lease has lapsed or @owner owns it
	// already (a renewal); it returns the owner when it did.
	own string
	// renew extends, to @ms milliseconds from now, the leases of the
	// deliveries ? (ids) still leased under token ?.
	renew string
	// readBodies reads the bodies of the messages keys names (keys' args);
	// on SQLite it may read an id's bodies on other topics too.
	readBodies string
	// deleteBodies removes the bodies, of the messages keys names (keys'
	// args), that no delivery references any more.
	deleteBodies string
	// keys is how a list of message keys is passed to lockBodies,
	// readBodies and deleteBodies: on PostgreSQL the ids and the topics as
	// two arrays, on SQLite the ids as an IN list.
	keys func([]messageKey) []any
}

// keyArrays passes keys to a PostgreSQL statement as two text arrays, the
// ids and their topics.
func keyArrays(keys []messageKey) []any {
	ids, topics := make(dialect.TextArray, len(keys)), make(dialect.TextArray, len(keys))
	for i, k := range keys {
		ids[i], topics[i] = k.id, k.topic
	}
	return []any{ids, topics}
}

// keyIDs passes keys' ids to a statement as one list (IN ?).
func keyIDs(keys []messageKey) []any {
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = k.id
	}
	return []any{ids}
}

// asyncCommit, a condition that is always true, makes the PostgreSQL
// transaction of the statement that holds it commit asynchronously
// (dialect.AsyncCommit, and dialect.CommitAsync for why that is safe for
// what only delivers a message again if a crash undoes it): a claim (its
// deliveries become ready again, uncounted) and the bus's acks (delivered
// again; an inbox skips them). [Ack], which may run in the caller's
// transaction, does not. A claim commits on every wake-up of every
// partition: waiting for the flush each time had claims and acks queue on
// PostgreSQL's WAL lock behind the writers' commits. An uncorrelated
// subquery, it is evaluated once per statement, before any row is read.
const asyncCommit = `(SELECT ` + dialect.AsyncCommit + `) IS NOT NULL`

var pgStatements = statements{
	// The claim leases the rows it locked through the primary key (= ANY
	// of their ids: a join with them could be hashed over a sequential
	// scan of the table) and reads their bodies in the same statement, one
	// probe of the primary key each. It commits without waiting for the
	// WAL flush (asyncCommit).
	claim: `WITH ready AS (
	SELECT id FROM dbbus_deliveries
	WHERE group_name = @group AND lease_token IS NULL AND ` + asyncCommit + `
	ORDER BY id
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
), leased AS (
	UPDATE dbbus_deliveries
	SET lease_token = @token, leased_until = now() + @ms * interval '1 millisecond'
	WHERE id = ANY(ARRAY(SELECT id FROM ready))
	RETURNING id, message_id, topic, attempts
)
SELECT l.id, l.message_id, l.topic, l.attempts, b.metadata, b.payload
FROM leased AS l
LEFT JOIN LATERAL (SELECT metadata, payload FROM dbbus_messages AS m
	WHERE m.id = l.message_id AND m.topic = l.topic OFFSET 0) AS b ON true`,
	claimBodies: true,
	rescue: `UPDATE dbbus_deliveries
SET lease_token = NULL, leased_until = NULL, attempts = attempts + 1
WHERE id IN (
	SELECT id FROM dbbus_deliveries
	WHERE group_name = @group AND lease_token IS NOT NULL AND leased_until < now()
	ORDER BY leased_until
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
) AND lease_token IS NOT NULL AND leased_until < now()`,
	// The statements keyed by a list of messages probe the primary key
	// once per key, id and topic (unnest ... CROSS JOIN LATERAL), and the
	// check for deliveries left is a subplan run per body, stopping at the
	// first (OFFSET 0 keeps a subquery from being folded into a join the
	// planner may hash). With `id IN (...)` the planner, misjudging a
	// never-analyzed table's rows, chose sequential scans and hash joins
	// over every delivery, and with the id alone (not unique) it expected
	// so many rows per id that the estimated cost passed jit_above_cost:
	// compiling took 100-200 ms per ack (TestPostgresSettlePlans).
	lockBodies: `SELECT m.id FROM unnest(CAST(? AS text[]), CAST(? AS text[])) AS k(id, topic)
CROSS JOIN LATERAL (SELECT id FROM dbbus_messages WHERE id = k.id AND topic = k.topic FOR UPDATE) AS m`,
	readBodies: `SELECT m.id, m.topic, m.metadata, m.payload FROM unnest(CAST(? AS text[]), CAST(? AS text[])) AS k(id, topic)
CROSS JOIN LATERAL (SELECT id, topic, metadata, payload FROM dbbus_messages
	WHERE id = k.id AND topic = k.topic OFFSET 0) AS m`,
	deleteBodies: `DELETE FROM dbbus_messages AS m USING unnest(CAST(? AS text[]), CAST(? AS text[])) AS k(id, topic)
WHERE m.id = k.id AND m.topic = k.topic
AND NOT EXISTS (SELECT 1 FROM dbbus_deliveries AS d WHERE d.message_id = m.id AND d.topic = m.topic LIMIT 1 OFFSET 0)`,
	keys:   keyArrays,
	browse: peekDeliveries + "\nFOR UPDATE",
	own: `INSERT INTO dbbus_queue_owners (queue, owner, leased_until)
VALUES (@queue, @owner, now() + @ms * interval '1 millisecond')
ON CONFLICT (queue) DO UPDATE SET owner = excluded.owner, leased_until = excluded.leased_until
WHERE dbbus_queue_owners.owner = excluded.owner OR dbbus_queue_owners.leased_until < now()
RETURNING owner`,
	renew: `UPDATE dbbus_deliveries SET leased_until = now() + ? * interval '1 millisecond'
WHERE id IN ? AND lease_token = ?`,
}

// sqliteNow is the database's clock in milliseconds since the Unix epoch.
const sqliteNow = `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`

var sqliteStatements = statements{
	claim: `UPDATE dbbus_deliveries
SET lease_token = @token, leased_until = ` + sqliteNow + ` + @ms
WHERE id IN (
	SELECT id FROM dbbus_deliveries
	WHERE group_name = @group AND lease_token IS NULL
	ORDER BY id
	LIMIT @limit
)
RETURNING id, message_id, topic, attempts`,
	browse:       peekDeliveries,
	readBodies:   readBodies,
	deleteBodies: deleteBodies,
	keys:         keyIDs,
	rescue: `UPDATE dbbus_deliveries
SET lease_token = NULL, leased_until = NULL, attempts = attempts + 1
WHERE id IN (
	SELECT id FROM dbbus_deliveries
	WHERE group_name = @group AND lease_token IS NOT NULL AND leased_until < ` + sqliteNow + `
	ORDER BY leased_until
	LIMIT @limit
) AND lease_token IS NOT NULL AND leased_until < ` + sqliteNow,
	own: `INSERT INTO dbbus_queue_owners (queue, owner, leased_until)
VALUES (@queue, @owner, ` + sqliteNow + ` + @ms)
ON CONFLICT (queue) DO UPDATE SET owner = excluded.owner, leased_until = excluded.leased_until
WHERE dbbus_queue_owners.owner = excluded.owner OR dbbus_queue_owners.leased_until < ` + sqliteNow + `
RETURNING owner`,
	renew: `UPDATE dbbus_deliveries SET leased_until = ` + sqliteNow + ` + ?
WHERE id IN ? AND lease_token = ?`,
}

func statementsFor(d dialect.Dialect) *statements {
	if d == dialect.Postgres {
		return &pgStatements
	}
	return &sqliteStatements
}

// Statements shared by both dialects.
const (
	// peekDeliveries reads up to @limit ready deliveries of @group after
	// id @after, lowest id first, through dbbus_deliveries_ready, without
	// locking them: id, message_id, topic, attempts.
	peekDeliveries = `SELECT id, message_id, topic, attempts FROM dbbus_deliveries
WHERE group_name = @group AND lease_token IS NULL AND id > @after
ORDER BY id
LIMIT @limit`
	// readBodies reads the bodies of the message ids given, on every
	// topic: a delivery's is the one of its topic.
	readBodies = `SELECT id, topic, metadata, payload FROM dbbus_messages WHERE id IN ?`
	// deleteReady removes a ready delivery (one a browse holds).
	deleteReady = `DELETE FROM dbbus_deliveries WHERE id = ? AND lease_token IS NULL`
	// insertDelivery gives a group a new ready delivery of a message, at
	// the end of its queue.
	insertDelivery = `INSERT INTO dbbus_deliveries (group_name, message_id, topic) VALUES (?, ?, ?)`
	// setMetadata rewrites the metadata (JSON) of a message on a topic.
	setMetadata = `UPDATE dbbus_messages SET metadata = ? WHERE id = ? AND topic = ?`
	// deleteDeliveries is the fenced ack: only the lease holder's token
	// matches. It returns the ids deleted.
	deleteDeliveries = `DELETE FROM dbbus_deliveries WHERE id IN ? AND lease_token = ? RETURNING id`
	// pgAsyncAck is deleteDeliveries committing asynchronously
	// (asyncCommit), for a subscription's acks on PostgreSQL.
	pgAsyncAck = `DELETE FROM dbbus_deliveries WHERE id IN ? AND lease_token = ? AND ` + asyncCommit + ` RETURNING id`
	// deleteBodies removes the bodies, of the message ids given, that no
	// delivery references any more.
	deleteBodies = `DELETE FROM dbbus_messages WHERE id IN ?
AND NOT EXISTS (SELECT 1 FROM dbbus_deliveries AS d
	WHERE d.message_id = dbbus_messages.id AND d.topic = dbbus_messages.topic)`
	// nackDelivery makes a delivery ready again at once, counting a failed
	// attempt.
	nackDelivery = `UPDATE dbbus_deliveries
SET lease_token = NULL, leased_until = NULL, attempts = attempts + 1
WHERE id = ? AND lease_token = ?`
	// takeOver makes the deliveries of @queue leased under another token
	// than @owner ready again, counting a failed attempt: a new owner of
	// the queue runs it once, so that what its previous owner held (it
	// died, or lost the queue) comes first again, in order.
	takeOver = `UPDATE dbbus_deliveries
SET lease_token = NULL, leased_until = NULL, attempts = attempts + 1
WHERE group_name = @queue AND lease_token IS NOT NULL AND lease_token <> @owner`
	// disown ends @owner's ownership of @queue.
	disown = `DELETE FROM dbbus_queue_owners WHERE queue = @queue AND owner = @owner`
	// releaseDeliveries gives deliveries back without counting an attempt.
	releaseDeliveries = `UPDATE dbbus_deliveries
SET lease_token = NULL, leased_until = NULL
WHERE id IN ? AND lease_token = ?`
)
