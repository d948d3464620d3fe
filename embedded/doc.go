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
// [Open] creates bento's tables (outbox, inbox, idempotency, and the
// database bus's), the outbox store, a projector that publishes to the
// database bus in the same database ([dbbus.Bus]: its queues are tables,
// so what was relayed and not yet consumed survives a crash or kill -9;
// an event no group is bound to is kept aside in [dbbus.UnroutableGroup])
// and a unit-of-work manager whose commits wake that projector.
// [Config.DB] swaps in PostgreSQL, where the same database bus needs no
// broker; [Config.Publisher] swaps in RabbitMQ, so the same wiring runs in
// production either way.
//
// [Config.Memory] makes the projector publish to an in-memory bus
// ([messaging.NewMemoryBus]) instead, for unit tests and examples: it
// loses what it holds when the process ends.
package embedded
