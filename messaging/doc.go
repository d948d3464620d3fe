// Package messaging carries domain events between processes, whatever the
// bus: the wire format that maps an outbox row to a watermill message and
// back, the event registry that turns a message back into a Go value, the
// name rules of topics, binding patterns and consumer groups, partition
// keys, and an in-memory bus for development and tests. The RabbitMQ bus is
// package rabbitmq, built on this one. Both buses route with AMQP
// topic-exchange semantics, so code tested on the in-memory bus behaves the
// same on RabbitMQ.
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
// invalid key. On RabbitMQ (package rabbitmq) each metadata entry is an
// AMQP header, the UUID travels in the _watermill_message_uuid header and in
// the MessageId property, the content type is application/json and delivery
// is persistent.
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
//     [MemoryUnroutableQueue], as RabbitMQ parks it in its unroutable queue, so
//     an event no group consumes does not hold back its aggregate. Without an
//     alternate queue ([MemoryBus.DeclareAlternate] with "") it fails with
//     [ErrUnroutable] and delivers nothing.
//   - [MemoryBus.Subscriber] consumes a group's queue. Subscriptions of one
//     group compete for its messages; each delivers one message at a time,
//     waits for Ack or Nack, and a nacked message is redelivered with the same
//     UUID. Messages of a queue are delivered in the order they were published
//     (a nacked one goes back to the head).
//
// # Partitions
//
// A partitioned consumer group (package consumer) reads N queues instead of
// one, [PartitionQueue](group, 0..N-1), with a single active consumer each.
// A message's partition is chosen by its [PartitionKey], so an aggregate's
// events always land in the same partition, in the order they were
// published. On the memory bus: [MemoryBus.DeclarePartitions] and
// [MemoryBus.PartitionSubscriber]; on RabbitMQ: rabbitmq.DeclarePartitions
// and rabbitmq.NewPartitionSubscriber.
//
// # Names and shared errors
//
// [ValidateTopic], [ValidatePatterns], [ValidateGroup] and
// [ValidateExchange] are the name rules both buses apply ([ErrInvalidName]).
// [ErrClosed], [ErrQueueNotFound] and [ErrMessageTooLarge] mean the same on
// every bus; [Outgoing] is one message of a batch publish.
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
