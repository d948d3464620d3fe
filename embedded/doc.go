// Package embedded is bento's embedded default: a SQLite file opened the
// way bento needs it, and one call, [Open], that wires a database, a bus,
// the unit-of-work manager and the projector, for development, tests and
// examples that need no services.
//
// [OpenSQLite] opens (creating) a pure-Go SQLite file with WAL, a busy
// timeout, foreign keys and transactions that take the write lock when they
// begin, so concurrent units of work queue instead of failing with
// SQLITE_BUSY. Open any SQLite database bento uses with it (or with [DSN]).
//
// [Open] creates bento's tables (outbox, inbox, idempotency), the outbox
// store, a projector that publishes to an in-memory bus
// ([messaging.NewMemoryBus]: an event no group consumes is parked in its
// alternate queue, as on RabbitMQ) and a unit-of-work manager whose commits
// wake that projector. [Config.DB] and [Config.Publisher] swap in PostgreSQL
// and RabbitMQ, so the same wiring runs in production.
package embedded
