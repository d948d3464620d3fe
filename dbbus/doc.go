// Package dbbus is the database as the bus: consumer groups whose queues
// live in PostgreSQL or SQLite, for a durable deployment with no broker. It
// routes like the memory bus and RabbitMQ (topic patterns, competing
// consumers, fan-out across groups), and its [Bus] is a Watermill
// message.Publisher whose [Bus.Subscriber] is a message.Subscriber, so it
// passes the same conformance suite (package messaging/bustest).
//
// # Tables
//
// [Migrate] creates five tables. dbbus_messages holds one body row per
// published message, keyed by its Watermill UUID and its topic: id, topic,
// metadata (JSON), payload and created_at. dbbus_deliveries holds one
// delivery row per (queue, message), so each group acks, leases and counts
// attempts on its own rows: no group waits on another, and no row is shared
// by all of a group's consumers. dbbus_bindings holds each group's topic
// patterns ([DeclareGroup], [DeclarePartitions]), dbbus_partitions the
// partition count of a partitioned group, and dbbus_queue_owners the
// single active consumer of each partition queue. A message no binding
// matches is kept, not dropped: it gets one delivery row in the reserved
// group [UnroutableGroup], which [Depth] counts and a subscriber of that
// group reads.
//
// # Partitions
//
// [DeclarePartitions] splits a group into n queues,
// messaging.PartitionQueue(group, p): a matching message gets one delivery,
// in partition messaging.PartitionOf(messaging.PartitionKey(msg), n), the
// memory bus's choice too, so an aggregate's events stay in one queue in
// publish order. [Bus.PartitionSubscriber] consumes one such queue with a
// single active consumer across every process: the subscription owns the
// queue through a row of dbbus_queue_owners (a random token and an expiry
// by the database's clock, renewed while it lives); another subscription
// waits, and takes the queue over when the owner ends or its ownership
// lapses (after Config.VisibilityTimeout), what the predecessor held coming
// first again, in order. The consumer runtime runs on it with
// consumer.NewDatabase.
//
// # Publishing
//
// [Bus.Publish] writes the bodies and one delivery per matching group in one
// transaction; [Bus.PublishTx] does the same inside the caller's
// transaction and commits nothing, so a hop that consumes an input and
// publishes to the bus in one database transaction (marking its input done
// there) publishes each input exactly once. A message whose UUID the bus
// still holds on that topic is not published again; the same UUID on
// another topic (a dead letter keeps its message's UUID) is a message of
// its own. On PostgreSQL the transaction
// notifies [NotifyChannel] once (PostgreSQL folds identical notifications
// of one transaction into one), as a hint; subscribers also poll.
//
// # Delivery states
//
//	ready --claim--> leased --Ack--> deleted (and the body, once no delivery references it)
//	leased --Nack--> ready (attempts+1)
//	leased --give-back (Close, ctx cancelled)--> ready
//	leased --lease expired (Config.VisibilityTimeout)--> ready (attempts+1)
//
// A claim is one statement. On PostgreSQL a CTE selects the group's ready
// rows in id order from the partial index dbbus_deliveries_ready, FOR
// UPDATE SKIP LOCKED, and an UPDATE … RETURNING leases them; on SQLite it
// is UPDATE … WHERE id IN (SELECT … LIMIT n) RETURNING. The lease is a
// random token and an expiry by the database's clock: [Ack] and [Nack]
// settle a delivery only while its token still matches, and return
// [ErrLeaseLost] otherwise, leaving a newer lease's delivery alone. Nothing
// depends on transaction ids or snapshots: a long transaction elsewhere
// stalls no claim.
//
// A live subscription renews the leases it holds three times per
// visibility timeout, so a slow handler keeps its messages.
//
// Delivery is at least once. A message is delivered again when its
// subscriber nacks it, gives it back, or dies (or loses the database for
// longer than the visibility timeout: its ack then fails with
// ErrLeaseLost, logged). One subscription
// of a group receives the messages of one topic in publish order, as long
// as none comes back; competing subscriptions share the group's messages.
//
// On SQLite, which has one writer at a time, the bus's own writes queue
// for a mutex in the process rather than in SQLite's busy handler, so that
// competing subscriptions share a group's messages.
//
// # Not yet
//
// Dead letters by the bus itself (attempts are counted, and the consumer
// runtime dead-letters on its own, but the bus has no delivery limit),
// leader-only maintenance, and the wiring into the embedded default, the
// examples, the web console and the bento command are not part of this
// package yet.
package dbbus
