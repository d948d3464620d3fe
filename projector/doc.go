// Package projector relays the transactional outbox to a message bus.
//
// An [OutboxProjector] claims a batch of due outbox rows in a short
// transaction (FOR UPDATE SKIP LOCKED on PostgreSQL) under a lease, publishes
// them outside any transaction through a Watermill message.Publisher
// (RabbitMQ via package rabbitmq, the in-memory bus of package messaging,
// or any publisher you bring: Kafka, NATS, ...), and records the outcome: the batch is marked sent
// in one statement (or deleted), a failed event is retried with jittered
// exponential backoff, and an event that keeps failing ends dead with its last
// error kept, without holding up the others. A bus whose queues live in the
// outbox's own database (package dbbus) is the exception: there the batch is
// published and marked sent in one transaction (see Guarantees).
//
// # Guarantees
//
// At least once: an event is marked sent only after the publisher returned
// without error (for RabbitMQ, after the broker's confirm). A projector killed
// between publish and mark leaves its rows leased; once the lease ends,
// another projector claims them and publishes again, so consumers must be
// idempotent (package inbox). An outage of the broker turns into failed
// attempts and backoff, never into loss.
//
// Exactly once to the database bus: when the publisher is a [TxPublisher]
// on the outbox's own database (a dbbus.Bus opened on the same *gorm.DB),
// the projector writes a batch into the groups' queues and marks it sent
// (or deletes it, with DeleteOnSuccess) in one transaction, which commits
// only while the projector still holds the lease of every row of the
// batch. A failure rolls back both and counts a failed attempt; a
// projector whose lease was taken over commits nothing and releases the
// rows still its own. No row is published twice, however the projector
// or the database fails, and the consumers of the bus see each event once
// per group (they still settle their own deliveries at least once).
//
// Per-aggregate order: a row is only claimed while no earlier event of the
// same aggregate is unsent, so across any number of projectors the first
// delivery of an aggregate's events follows their versions. A dead event
// holds back the later events of its own aggregate, and only those, until it
// is requeued (outbox.Store.Requeue). Retries and lease takeovers can add
// duplicates after later events; first deliveries stay in order.
//
// # Wake-up
//
// On PostgreSQL the projector LISTENs on outbox.NotifyChannel, which the
// outbox insert trigger notifies on commit, so a committed event is published
// within milliseconds; polling every IdleSleep is the fallback, and the
// listening connection is re-established when it drops. [OutboxProjector.Wake]
// wakes it from the same process (wire it to uow.Config.AfterCommit on
// SQLite). The listener holds one connection of the *gorm.DB pool.
//
// # Operating it
//
// [OutboxProjector.Run] blocks until its context ends, then waits for the
// publishes in flight (up to PublishTimeout), records their outcome, releases
// the rows it did not try, and returns. [OutboxProjector.Drain] relays
// everything due and returns, for tests, scripts and benchmarks. Run several
// projectors for throughput and availability; they share the work.
//
// # Tracing
//
// Each publish of an event runs in an OpenTelemetry producer span,
// "bento.publish <topic>", whose parent is the trace context the unit of work
// stored with the event (its traceparent metadata), so the span joins the
// trace of the request that committed it; an event without one starts a new
// trace. The message goes on the wire with the publish span's own
// traceparent, so the consumer's span (package inbox) is its child. A failed
// publish marks its span as failed; every retry is a span of its own
// (attribute bento.outbox.attempt). Config.TracerProvider defaults to the
// global provider, a no-op until the application sets one; the stored
// traceparent is then passed on unchanged.
//
// Metrics (when Config.Registerer is set): bento_outbox_published_total,
// bento_outbox_failed_total and bento_outbox_dead_total by topic,
// bento_outbox_publish_latency_seconds (occurred_at to confirm),
// bento_outbox_backlog by status (rows not yet sent: new, publishing, failed,
// dead) and bento_outbox_oldest_pending_age_seconds, and
// bento_projector_running, the projectors inside Run.
package projector
