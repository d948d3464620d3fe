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
// its own. On PostgreSQL the transaction notifies [NotifyChannel] with the
// queues it delivered to, as a hint that wakes only their subscriptions;
// subscribers also poll.
//
// # Relaying the outbox
//
// A bus on the outbox's own database relays it exactly once: given a Bus
// as its publisher, package projector publishes each batch with
// [Bus.PublishTx] in the transaction that marks the rows sent, under the
// rows' lease, and commits nothing once another projector took them over
// ([Bus.DB] tells it that the databases are one). Without that, a relay
// that published and then failed to mark would publish again, and the
// UUID check above hides the second copy only while a group has not acked
// the first.
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
// UPDATE SKIP LOCKED, an UPDATE … RETURNING leases them through the
// primary key, and the statement reads their bodies, one probe of the
// primary key each; on SQLite it is UPDATE … WHERE id IN (SELECT … LIMIT
// n) RETURNING, then a read of the bodies. Bodies are read, locked and
// deleted by their whole key (id and topic) in every statement, so no
// statement's plan or cost depends on the tables' statistics. The lease is a
// random token and an expiry by the database's clock: [Ack] and [Nack]
// settle a delivery only while its token still matches, and return
// [ErrLeaseLost] otherwise, leaving a newer lease's delivery alone. Nothing
// depends on transaction ids or snapshots: a long transaction elsewhere
// stalls no claim. On PostgreSQL a claim and a subscription's acks commit
// asynchronously (synchronous_commit off for their transaction alone): a
// crash of the server can only undo them, which delivers the messages
// again; [Ack] leaves the caller's transaction as it is. The bus deletes
// what its subscriptions acked within 10 ms of each other (or a quarter of
// the visibility timeout, if shorter) in one transaction, each delivery
// fenced by the lease of the subscription that acked it, rather than in a
// transaction per subscription.
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
// # Delivery limit
//
// A delivery that failed more often than Config.DeliveryLimit (default
// [DefaultDeliveryLimit]; nacks, lapsed leases and take-overs count,
// give-backs do not) is not handed out at its next claim: in one
// transaction it is deleted and its message published on the dead-letter
// topic of its group ("bento-dead.<group>", as package consumer names it;
// a partition queue's group is the partitioned group), with the metadata
// dead_cause "poison", reason_poisoned, dead_at and dead_attempts, so it
// lands in the group's dead-letter queue (or, with none declared, is kept
// in [UnroutableGroup]). Every message a subscription hands out carries
// its earlier failed deliveries in messaging.MetaDeliveryCount (and
// messaging.MetaRedelivered) when there were any, as a RabbitMQ quorum
// queue counts them, so that the consumer runtime dead-letters a message
// itself, holding its aggregate back, before the bus does ([Bus.DeliveryLimit]).
//
// On SQLite, which has one writer at a time, the bus's own writes queue
// for a mutex in the process rather than in SQLite's busy handler, so that
// competing subscriptions share a group's messages.
//
// # Browsing a queue
//
// [Browse] is how an operator handles a queue nobody consumes, such as a
// consumer group's dead-letter queue: it shows a group's ready deliveries,
// oldest first, and removes the ones its function chooses, or moves them
// to another group ([BrowseAction.MoveTo]; a partitioned group's
// partition queue by the message's partition key) with new metadata, each
// move in one transaction (exactly once: never lost, never duplicated).
// Concurrent browses of one group lock its rows in id order and wait for
// each other's, so none misses a delivery or acts twice on one; a browse
// whose context ends rolls back the transaction under way and leaves its
// deliveries in place. [Peek] shows them without locking anything.
//
// # Operating the bus
//
// [Stats] counts a queue's (or a partitioned group's) ready and leased
// deliveries. [PurgeUnroutable] deletes the messages kept in
// [UnroutableGroup] older than an age, or all of them: nothing else
// removes them. [ListUnroutable] shows them with their ages, and
// [ReplayUnroutable] delivers them to the groups bound to their topic
// since, each taken out of UnroutableGroup in the transaction that
// delivers it (exactly once, also under concurrent replays, which lock
// the deliveries in id order as [Browse] does); one still bound to no
// group stays kept. [DeleteGroup] retires a group: its bindings, so that it no
// longer collects copies of new messages, its partitions and queue
// owners, and every delivery it holds. Both walk their rows through the
// partial indexes in bounded batches, each in a transaction of its own.
// A body is deleted with its last delivery (an ack, a browse's removal, a
// purge, a group's deletion), so acked messages leave nothing behind.
//
// # Not yet
//
// Leader-only maintenance is not part of this package yet. The
// embedded default (package embedded), the examples, the web console and
// the bento command run on it; the console and the command handle a
// consumer group's dead letters through [Browse] and [Peek].
package dbbus
