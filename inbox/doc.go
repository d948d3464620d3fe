// Package inbox makes consumers apply each message exactly once.
//
// Delivery through a broker is at least once: a projector republishes after a
// crash, RabbitMQ redelivers unacknowledged messages. The inbox turns that
// into exactly-once effects. [Inbox.Middleware] records (consumer, message
// id) in the inbox_messages table in the same database transaction as the
// handler's own writes, with an insert that cannot duplicate; a message
// whose record exists is acknowledged and skipped. Two deliveries racing each
// other serialise on that insert: the second waits for the first's
// transaction and is skipped if it committed, applied if it rolled back.
//
// Handlers reach the transaction through package uow: a unit of work begun
// with the handler's context joins it, so a handler that changes an
// aggregate commits the change, the events it records (carrying the message's
// correlation id, and its id as causation id) and the inbox record together,
// or none of them.
//
// The consumer package runs the middleware for a consumer group, with typed
// handlers, retries and dead letters; use the middleware directly only to
// build a runtime of your own.
//
// # Tracing
//
// Each delivery runs in an OpenTelemetry consumer span,
// "bento.consume <event type>", whose parent is the trace context the
// message carries (the projector's publish span, itself continuing the trace
// of the unit of work that committed the event). The handler's context holds
// the span: spans it starts are children of it, and events it commits
// through a unit of work carry its trace on to the next consumer. A missing
// or malformed traceparent never fails a message; the span then starts a new
// trace. Configure it with Config.TracerProvider (consumer.Config in
// package consumer); the default is the global provider, a no-op until the
// application sets one, with which an incoming traceparent still passes on
// to the events the handler emits.
//
// # Retention
//
// [Purge] deletes old inbox records. The retention window is the dedup
// window: see Purge.
package inbox
