// Package messaging carries domain events between processes: the wire format
// that maps an outbox row to a watermill message and back, an in-memory bus
// for development and tests, and a RabbitMQ publisher and subscriber built on
// watermill-amqp/v2. Both buses route with AMQP topic-exchange semantics, so
// code tested on the in-memory bus behaves the same on RabbitMQ.
//
// # Wire format
//
// [NewMessage] turns an outbox row (outbox.Message) into a watermill message:
// the message UUID is the event id (a ULID), the payload is the event as
// JSON, and the metadata holds the row's own metadata entries overlaid with
// the well-known keys [MetaEventType], [MetaAggregateType],
// [MetaAggregateID], [MetaAggregateVersion], [MetaTenantID],
// [MetaSchemaVersion], [MetaOccurredAt] (RFC 3339 in UTC with nanoseconds),
// [MetaCorrelationID] (the event's own id when the row has none: a chain of
// events starts at its first one) and, when present, [MetaCausationID],
// [MetaTraceparent] and [MetaTracestate] (W3C Trace Context: the projector's
// publish span, which the consumer's span continues), and [MetaPartitionKey]
// (see [PartitionKey]). The aggregate keys are left out for an event
// without aggregate. The topic a message is published under is its event
// type.
//
// [Decode] reads a delivered message back into an [Envelope] and fails with
// a [*DecodeError] (wrapping [ErrMalformedMessage]) that names the missing or
// invalid key. On RabbitMQ each metadata entry is an AMQP header, the UUID
// travels in the _watermill_message_uuid header and in the MessageId
// property, the content type is application/json and delivery is
// persistent.
//
// # In-memory bus
//
// [MemoryBus] is an in-process broker that mirrors RabbitMQ rather than
// watermill's gochannel (which has neither topic patterns nor consumer
// groups, and drops messages nobody subscribed to):
//
//   - [MemoryBus.DeclareQueue] declares a consumer group's queue bound to
//     topic patterns ("order.*", "payment.#"; see [MatchTopic]). A queue keeps
//     what is routed to it until a consumer acks it, even while no consumer
//     is attached.
//   - [MemoryBus.Publish] copies each message into every queue with a matching
//     binding. When none matches it parks the message in the alternate queue
//     [MemoryUnroutableQueue], as RabbitMQ parks it in [UnroutableQueue], so
//     an event no group consumes does not hold back its aggregate. Without an
//     alternate queue ([MemoryBus.DeclareAlternate] with "") it fails with
//     [ErrUnroutable] and delivers nothing.
//   - [MemoryBus.Subscriber] consumes a group's queue. Subscriptions of one
//     group compete for its messages; each delivers one message at a time,
//     waits for Ack or Nack, and a nacked message is redelivered with the same
//     UUID. Messages of a queue are delivered in the order they were published
//     (a nacked one goes back to the head).
//
// # RabbitMQ topology
//
// [NewAMQPPublisher], [NewAMQPSubscriber], [DeclareTopology] and
// [DeclareQueue] all declare the same topology, configured by [AMQPConfig]:
//
//   - the main exchange, a durable topic exchange named AMQPConfig.Exchange
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
// queues (DeclareQueue, or NewAMQPSubscriber) before events flow, so that
// they are routed to their consumers in the first place.
//
// # Partitions
//
// A partitioned consumer group (package consumer) reads N queues instead of
// one: [DeclarePartitions] binds a consistent-hash exchange,
// "<exchange>.hash.<group>" (RabbitMQ's rabbitmq_consistent_hash_exchange
// plugin; [ErrHashExchangeMissing] without it), to the main exchange with the
// group's patterns, hashing each message's [MetaPartitionKey], and binds the
// queues [PartitionQueue](group, 0..N-1) to it. Each partition queue has a
// single active consumer; quorum queues (the default [QueueType]) carry a
// delivery limit. An aggregate's events always land in the same partition,
// in the order they were published. [NewPartitionSubscriber] consumes them
// one message at a time and gives a message back by closing its channel.
// The memory bus has the same: [MemoryBus.DeclarePartitions] and
// [MemoryBus.PartitionSubscriber].
//
// RabbitMQ refuses to redeclare an exchange with other arguments
// (PRECONDITION_FAILED). An exchange of the configured name created by other
// tools must therefore be a durable topic exchange with exactly the
// alternate-exchange argument above; otherwise pick another
// AMQPConfig.Exchange, or delete and recreate it.
//
// [AMQPPublisher.Publish] waits for the broker's confirm of each message in
// turn, one round trip per message; throughput comes from calling Publish
// from several goroutines at once (up to AMQPConfig.ChannelPoolSize run in
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
// fit an AMQP frame fails alone with [ErrMessageTooLarge]; and when the
// channel or connection fails mid-batch, the messages not yet confirmed are
// published again, so that only the message that causes the failure fails.
//
// The subscriber accepts messages from producers other than
// watermill: headers that are not strings (such as RabbitMQ's x-death) are
// turned into strings, and without a watermill UUID header the UUID is the
// AMQP MessageId.
//
// # Event registry
//
// A [Registry] turns a decoded [Envelope] into a Go value for typed
// consumers. [Register] records a struct type as the current type of its
// event type, at the schema version aggregate.SchemaVersionOf reports for
// it; [RegisterUpcaster] records a function that turns an older schema
// version into a newer one. [Registry.Decode] decodes the payload into the
// current type directly, or into the envelope's older version and then
// through the chain of upcasters (v1 to v2, v2 to v3, ...) up to the current
// one, without re-encoding between steps. Each (event type, schema version)
// stands for exactly one Go type. Build the registry at start-up, from
// main; registrations that conflict are refused with [ErrRegistration]
// ([MustRegister] and [MustRegisterUpcaster] panic instead). Decode fails
// with [ErrUnknownEventType], [ErrUnknownSchemaVersion] or
// [ErrMalformedPayload], or [ErrUpcast] wrapping the upcaster's own error. [Registry.Types]
// lists the registered event types, to bind a consumer's queue.
package messaging
