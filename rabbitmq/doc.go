// Package rabbitmq is bento's RabbitMQ bus, built on watermill-amqp/v2 and
// amqp091-go: a publisher ([Publisher]), a batch publisher with pipelined
// confirms ([ConfirmPublisher]), consumer-group and partition subscribers
// ([NewSubscriber], [NewPartitionSubscriber]), and the calls that declare,
// inspect and delete the topology ([DeclareTopology], [DeclareQueue],
// [DeclarePartitions], [QueueDepth], [Ping], [GroupRoute], [BrowseQueue],
// [ListUnroutable], [ReplayUnroutable], [DeleteQueues], [DeletePartitions],
// [DeleteTopology]). It speaks the wire format of package messaging: every
// message is a messaging.NewMessage, read back with messaging.Decode.
//
// # RabbitMQ topology
//
// [NewPublisher], [NewSubscriber], [DeclareTopology] and
// [DeclareQueue] all declare the same topology, configured by [Config]:
//
//   - the main exchange, a durable topic exchange named Config.Exchange
//     ("bento.events" by default), declared with the argument
//     alternate-exchange = "<exchange>.unroutable". Events are published to
//     it with the event type as routing key, as persistent messages, with
//     publisher confirms;
//   - the alternate exchange "<exchange>.unroutable", a durable fanout
//     exchange bound to a durable queue of the same name;
//   - one durable queue per consumer group, named after the group and bound
//     to the main exchange with each of the group's patterns.
//
// The alternate exchange is the answer to a trap of watermill-amqp: it never
// registers a basic.return listener, so a message that matches no binding
// would be confirmed by the broker and silently dropped, and the relay would
// mark it sent. With the alternate exchange such a message lands in the
// "<exchange>.unroutable" queue instead, where an operator can see it and
// shovel it back once a binding exists; nothing is lost. Declare consumer
// queues (DeclareQueue, or NewSubscriber) before events flow, so that
// they are routed to their consumers in the first place.
//
// # Partitions
//
// A partitioned consumer group (package consumer) reads N queues instead of
// one: [DeclarePartitions] binds a consistent-hash exchange,
// "<exchange>.hash.<group>" (RabbitMQ's rabbitmq_consistent_hash_exchange
// plugin; [ErrHashExchangeMissing] without it), to the main exchange with the
// group's patterns, hashing each message's [messaging.MetaPartitionKey], and binds the
// queues [messaging.PartitionQueue](group, 0..N-1) to it. Each partition queue has a
// single active consumer; quorum queues (the default [QueueType]) carry a
// delivery limit. An aggregate's events always land in the same partition,
// in the order they were published. [NewPartitionSubscriber] consumes them
// one message at a time and gives a message back by closing its channel.
// The memory bus has the same: messaging.MemoryBus.DeclarePartitions and
// messaging.MemoryBus.PartitionSubscriber.
//
// RabbitMQ refuses to redeclare an exchange with other arguments
// (PRECONDITION_FAILED). An exchange of the configured name created by other
// tools must therefore be a durable topic exchange with exactly the
// alternate-exchange argument above; otherwise pick another
// Config.Exchange, or delete and recreate it.
//
// [Publisher.Publish] waits for the broker's confirm of each message in
// turn, one round trip per message; throughput comes from calling Publish
// from several goroutines at once (up to Config.ChannelPoolSize run in
// parallel). While the connection is down Publish fails at once and the
// publisher reconnects in the background: treat any Publish error as "retry
// later". It has no deadline of its own (see its doc).
//
// [ConfirmPublisher] publishes the same messages to the same topology with
// pipelined confirms: [ConfirmPublisher.PublishBatch] writes a whole batch,
// then waits for its confirms together, and reports each message's outcome.
// Its context bounds it even on a link that stops answering; while the
// broker blocks publishers (connection.blocked) it writes nothing and fails
// with [ErrBlocked] when its context ends; a message whose metadata does not
// fit an AMQP frame fails alone with [messaging.ErrMessageTooLarge]; and when the
// channel or connection fails mid-batch, the messages not yet confirmed are
// published again, so that only the message that causes the failure fails.
//
// The subscriber accepts messages from producers other than
// watermill: headers that are not strings (such as RabbitMQ's x-death) are
// turned into strings, and without a watermill UUID header the UUID is the
// AMQP MessageId.
package rabbitmq
