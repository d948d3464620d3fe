// Package bustest is a conformance suite for message buses: given a
// [Factory] that builds a Watermill publisher and subscribers of a bus, it
// checks what bento needs from a bus to deliver domain events reliably. It
// runs on every publisher and subscriber bento ships: the memory bus
// (messaging.MemoryBus, with its group and its partition subscribers), and
// RabbitMQ with rabbitmq.Publisher and rabbitmq.ConfirmPublisher,
// each with rabbitmq.Subscriber and with rabbitmq.NewPartitionSubscriber.
// Run it on any other bus you put between bento's relay and your consumers.
//
// # What bento needs, and the check that proves it
//
// bento's relay publishes each outbox row, with its event type as topic,
// until the bus accepts it; consumers of a consumer group ack what they have
// handled. Together that is at-least-once delivery, provided the bus keeps
// its side of the bargain:
//
//   - [CheckDelivery]: every accepted message reaches a subscribed group,
//     also when several goroutines publish at once (the relay publishes
//     concurrently) and one Publish call carries many messages, and
//     nothing arrives that was not published. A message
//     the bus accepts and then loses is an event lost for good: the outbox
//     row is already marked sent.
//   - [CheckRoundTrip]: UUID, metadata and payload arrive byte for byte. The
//     UUID is the event id consumers deduplicate on; the metadata carries
//     the wire format (event type, aggregate, tenant, schema version,
//     occurred-at, correlation, causation, trace context; see
//     messaging.NewMessage) and [messaging.Decode] must read back the same
//     Envelope; the payload is the event itself.
//   - [CheckNackRedelivery]: a nacked message comes back unchanged, and an
//     acked one does not. A consumer that fails nacks and relies on the
//     retry; one that succeeded must not see the event again.
//   - [CheckDroppedConnection]: a message delivered but never acked, because
//     the consumer crashed or its connection dropped, goes back to the
//     group. Without this at-least-once is only "at most once" for every
//     consumer that dies mid-message. The subscriber of the crashed
//     consumer must close even though nobody reads its channel any more:
//     a process that cannot close it cannot shut down.
//   - [CheckConsumerGroups]: bento's consumer groups are one queue per
//     group. Every group gets every message of its topics (the billing and
//     the audit service both see order.paid), and the consumers of one group
//     share its messages, each handled once (scaling a service out does not
//     handle an event twice). A bus whose groups have a single active
//     consumer, such as bento's partition queues, says so with
//     Bus.SingleActiveConsumer = true: one consumer must then receive all
//     of the group's messages and the other none.
//   - [CheckOrderPerTopic]: one consumer receives the messages of a topic in
//     publish order. The relay publishes each aggregate's events in version
//     order, so with this the first deliveries of an aggregate's events
//     come in version order too (redeliveries may come later; consumers
//     handle them by version). A bus without this guarantee says so with
//     Bus.OrderedPerTopic = false, and the check logs that it checked
//     nothing.
//
// A bus that cannot honour part of this contract says which part through
// the fields of [Bus], never by leaving a check out: OrderedPerTopic and
// SingleActiveConsumer above, and RedeliveryTimeout for a bus that
// redelivers only after an idle time.
//
// Each check uses fresh random topic and group names
// ("bustest.<random>.a"), builds its messages from outbox rows with
// messaging.NewMessage, so they carry the real wire metadata, and bounds
// every wait: a message it expects may take up to 5 s after the previous
// one (Bus.RedeliveryTimeout for a redelivery). A failure names the
// messages concerned, e.g.
//
//	CheckDelivery: 270 of 300 messages arrived (waited 5s after the last one); missing: [01J... (bustest.3f1c.a #9), ...]
//
// # Using it for your own bus
//
// Write a [Factory] that builds an isolated instance of the bus (its own
// stream, exchange or key prefix), whose NewSubscriber returns a subscriber
// of a consumer group for exact topics, and call [Run] from a test:
//
//	func TestMyBusConforms(t *testing.T) {
//		client := connect(t)
//		bustest.Run(t, func(t bustest.TB) *bustest.Bus {
//			prefix := "test-" + randomName()
//			pub := mybus.NewPublisher(client, prefix)
//			t.Cleanup(func() { _ = pub.Close(); deleteKeys(client, prefix) })
//			return &bustest.Bus{
//				Publisher: pub,
//				NewSubscriber: func(t bustest.TB, group string, topics []string) (message.Subscriber, error) {
//					return mybus.NewSubscriber(client, prefix, group, topics...)
//				},
//				OrderedPerTopic:   true,
//				RedeliveryTimeout: 5 * time.Second,
//			}
//		})
//	}
//
// [Run] runs each check as a parallel subtest, each on its own Bus. The
// checks are exported too, so a test can run one alone, or with a [TB] that
// records failures instead of reporting them (that is how this package
// tests that a broken bus fails the suite).
package bustest
