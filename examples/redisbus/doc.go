// Package redisbus is a worked example of a custom bus for bento: Redis
// Streams through the Watermill module watermill-redisstream, wired to
// bento's relay (package projector) and consumers (package inbox), and
// proved with bento's conformance suite, messaging/bustest. It is a module
// of its own, github.com/bentoevents/bento/examples/redisbus, so that its
// Redis dependencies stay out of bento's go.mod. docs/custom-buses.md walks
// through it.
//
// # Wiring
//
//	cfg := redisbus.Config{Addr: "127.0.0.1:6379"}
//	pub, err := redisbus.NewPublisher(cfg)
//	relay, err := projector.New(store, pub, nil)
//	c, err := redisbus.NewConsumer(db, cfg, &consumer.Config{Group: "billing"})
//	err = consumer.Handle(c, onOrderPaid)
//	err = c.Run(ctx)
//
// # Mapping
//
// Each Watermill topic, which in bento is the event type, is one stream,
// named Config.StreamPrefix + topic. [NewPublisher] appends a message with
// XADD, in watermill-redisstream's format: the UUID (the event id), the
// metadata (bento's wire keys, msgpack-encoded) and the payload. Each bento
// consumer group is a Redis consumer group of the same name on each stream
// it reads, created by [NewSubscriber]; each Subscribe is one Redis
// consumer of it. Dead letters of a group go to the stream
// consumer.DeadLetterTopic(group).
//
// # Guarantees
//
//   - Nothing accepted is dropped: XADD returns once Redis holds the entry,
//     and a stream keeps its entries whether or not a group reads it. A
//     group is created at the stream's first entry ("0"), so a group created
//     after events were published still gets them: a new group starts with
//     the stream's whole retained history (the inbox applies each event
//     once; to start a new group at the end instead, create it yourself with
//     XGROUP CREATE <stream> <group> $ MKSTREAM before its first
//     subscriber). Streams are never trimmed here: trimming could remove
//     entries a lagging group has not read.
//   - Consumer groups: every group gets every entry of its streams; the
//     consumers of one group share them (XREADGROUP).
//   - Redelivery: a nacked message is delivered again at once by the same
//     subscription. An entry delivered and not acked (its consumer crashed,
//     closed, or lost its connection) stays in the group's pending entries
//     list; once it has been idle for Config.MaxIdleTime, a running
//     subscription of the group claims it (XCLAIM, checked every
//     Config.ClaimInterval) and delivers it again.
//   - Order: one subscription delivers the entries of a stream in stream
//     order, one at a time per stream (streams are read in parallel).
//     Redeliveries can come after later entries.
//
// # Limits
//
//   - Exact topics only. Redis has no topic patterns; a topic holding '*'
//     or '#' is rejected with [ErrTopicPattern]. That is enough for
//     consumer.Consumer, which subscribes to the exact event types of its
//     handlers. A group that wants every event type must name them.
//   - Redelivery after a crash waits for MaxIdleTime (2s by default). A
//     message that stays longer than MaxIdleTime in a handler, retries
//     included, is claimed by another consumer while still in hand: a
//     duplicate, which the inbox absorbs. Set MaxIdleTime above the longest
//     handling time of a message, including consumer.Config's retry
//     backoff.
//   - A subscription reads a few entries per stream ahead of the one in
//     hand; when it stops, those wait MaxIdleTime before another consumer
//     claims them.
//   - Durability is Redis's: without AOF (appendonly yes, ideally with
//     appendfsync always) a Redis restart loses the entries and groups it
//     held, including events the relay has already marked sent.
//   - Consumers come and go with subscriptions; watermill-redisstream
//     deletes a consumer idle for 10 minutes with nothing pending.
//   - An entry that is not in watermill-redisstream's format (one appended
//     by another program) is delivered with a fresh UUID, its fields as a
//     JSON payload and the error under [MetaUnmarshalError]; bento's inbox
//     cannot decode it and dead-letters it, and the stream goes on.
package redisbus
