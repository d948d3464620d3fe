// Package consumer runs a consumer group: typed handlers that apply each
// event exactly once, with retries and dead letters.
//
// A [Consumer] reads its group's queue on RabbitMQ ([NewAMQP]), the
// in-memory bus ([NewMemory]) or any Watermill subscriber ([New]).
// Handlers registered with [Handle] receive the decoded event (upcast from
// older schema versions) and its envelope, and run inside the inbox's
// transaction (package inbox): a duplicate delivery is acknowledged and
// skipped, and the handler's writes, the events it records through a unit
// of work begun with its context, and the inbox record commit together.
//
// A handler that fails is retried with backoff ([Config].MaxRetries,
// RetryInitialInterval, RetryMaxInterval); a message that keeps failing
// is moved to the group's dead-letter destination, "<group>.dead", with the
// error in its metadata ([MetaDeadReason]), and the consumer goes on. A
// message that cannot be decoded, whose event type has no handler, or
// whose handler returned an error wrapped with [Permanent] goes there at
// once. A consumer that stops leaves the messages in flight to be
// redelivered, never dead-lettered.
package consumer
