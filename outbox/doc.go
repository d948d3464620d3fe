// Package outbox owns the transactional outbox: the outbox_events table, its
// migrations, and the [Store] that writes and reads it.
//
// An event enters the outbox in the same database transaction as the state
// change that caused it, so either both are committed or neither is. A
// projector (package projector) later claims the rows and relays them to the
// broker. Most code never calls this package directly: a unit of work (package
// uow) turns the events an aggregate recorded into outbox rows at commit.
// [Store.Add] is the manual mode, for code that has no aggregate.
//
// # Table
//
// Each row is a [Message]: a ULID id (also the message id on the wire), the
// tenant, the topic (the event type and routing key), the aggregate's type, id
// and version, the schema version, the JSON payload and metadata, and the relay
// state: status, attempts, available_at, lease and last error. A partial index
// covers only the rows that still need work, so claiming stays cheap however
// many sent rows the table holds. On PostgreSQL an insert trigger issues
// pg_notify on the channel [NotifyChannel] so projectors wake on commit.
//
// Create the table with [Migrate], or take the SQL from [Migrations] for your
// own migration tool.
//
// # Jobs
//
// [NewStore] builds a [Store] (store.go), which serves four jobs, each in
// its own files:
//
//   - Writing (write.go), for units of work and manual mode: [Store.Add],
//     [Store.Prepare] and [Store.Insert] validate events and insert them
//     within the caller's transaction.
//   - Relaying (relay.go, relays.go), for projectors: [Store.Claim] leases
//     due rows; [Store.MarkSent], [Store.DeleteSent], [Store.MarkFailed] and
//     [Store.Release] record outcomes, fenced by the worker's lease;
//     [Store.SetRelayIdle], [Store.WritersOpen], [Store.RemoveRelay] and
//     [Store.Relays] keep track of listening projectors so that writers
//     notify only while one is idle.
//   - Operating (ops.go, stats.go), for the CLI and the console: [Store.Get],
//     [Store.ListDead], [Store.CountDead], [Store.Requeue] and
//     [Store.Discard] inspect and settle dead events selected by a
//     [Filter]; [Store.Stats], [Store.Breakdown], [Store.Activity] and
//     [Store.Recent] report the backlog and the relay's recent work.
//   - Retention (retention.go, partition.go): [Store.PurgeSent] and
//     [Store.CountSent] for an unpartitioned table, [Maintain] for a
//     partitioned one.
//
// Every SQL statement the package runs is in queries.go, one named constant
// or builder per statement, with the index it relies on.
//
// # Retention
//
// [Store.PurgeSent] deletes old sent rows in short batches. On PostgreSQL the
// table can instead be created partitioned by day or month
// ([MigrateWith] with [partition.MigrateOpts].Partitioning); [Maintain], run on a
// schedule, then creates partitions ahead, seals old ones so claims skip
// them, and drops those past retention whose rows are all sent.
//
// # Limits
//
// Payloads must be valid JSON of at most [Config].MaxPayloadBytes (1 MiB by
// default), and metadata, which travels as AMQP headers in one frame, at
// most [Config].MaxMetadataBytes (16 KiB by default, counted as the headers
// encode it). Topics, tenants and aggregate fields are validated before
// anything is written; a bad one gets an error wrapping [ErrInvalidEvent],
// [ErrPayloadTooLarge], [ErrMetadataTooLarge] or tenant.ErrInvalid, and
// nothing is written.
package outbox
