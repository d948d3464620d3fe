// Package consumer runs a consumer group: typed handlers that apply each
// event exactly once, with retries and dead letters.
//
// A [Consumer] reads its group's queues on RabbitMQ ([NewAMQP]), the
// in-memory bus ([NewMemory]), the database bus of package dbbus
// ([NewDatabase]) or any Watermill subscriber ([New]).
//
// A group is split into partitions ([Config].Partitions, 16 by default) by
// a hash of each event's tenant, aggregate type and aggregate id. Each
// partition is a queue with a single active consumer, handled one message
// at a time, so an aggregate's events reach the handler in the order they
// were published. The running instances of a group deal the partitions
// among themselves through the consumer_members table (inbox migrations)
// and deal them again when one starts, stops or dies, within
// [Config].TakeoverTime; one instance handles its partitions in parallel.
// On RabbitMQ the partition queues sit behind the consistent-hash exchange
// plugin and are quorum queues whose delivery limit dead-letters a message
// that keeps crashing its consumers. [Declare] declares a group's queues
// from its [Config] in one call, as its instances do, ahead of its first
// events; [Delete] deletes them.
// Handlers registered with [Handle] (a [HandlerFunc]) run inside the
// inbox's transaction (package inbox) and receive it, with the decoded
// event (upcast from older schema versions) and its envelope: a duplicate
// delivery is acknowledged and skipped, and what the handler writes
// through that transaction, the events it records through a unit of work
// begun with its context, and the inbox record commit together. Write
// through the transaction the handler receives, never through a *gorm.DB
// of your own: such a write is not part of the message's transaction.
//
// A handler that fails is retried in place with backoff ([Config].MaxRetries,
// RetryInitialInterval, RetryMaxInterval; transient database failures for
// up to OutageWindow without counting), holding its partition; a message
// that keeps failing is moved to the group's dead-letter destination,
// "<group>.dead", with the error in its metadata ([MetaDeadReason]), and
// the consumer goes on. A
// message that cannot be decoded, whose event type has no handler, or
// whose handler returned an error wrapped with [Permanent] goes there at
// once. A consumer that stops leaves the messages in flight to be
// redelivered, never dead-lettered.
//
// In a partitioned group with hold-back (the default; see
// [Config].DisableHoldBack), a dead letter holds its aggregate back: the
// aggregate's later events are parked in the database (the inbox_parked
// table) while the partition moves on, and they are applied in order once the dead letter is replayed and
// applied, or the aggregate is released ([Consumer.Release]). Under
// inbox.VersionsContiguous, an event whose predecessor has not been
// applied waits parked the same way, and becomes a "gap" dead letter after
// [Config].GapTimeout. [Consumer.Parked] lists what is parked.
// [Inspect] returns an [Inspector] that shows a group's parked events,
// holds and members, and releases aggregates, from the database alone,
// for operators' tools.
package consumer
