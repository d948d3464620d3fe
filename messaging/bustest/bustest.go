package bustest

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// TB is the part of testing.TB the suite uses, so a recorder can run a check
// and inspect its failures. *testing.T implements it.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any) // must not return (testing.T calls runtime.Goexit; a recorder may panic)
	Cleanup(func())
}

// Bus is one instance of the bus under test: its publisher, how to
// subscribe to it, and which parts of the contract it promises. A field
// left false or zero asks for the strictest contract.
type Bus struct {
	// Publisher publishes each message under its topic, the event type,
	// which a broker uses as routing key. The Factory closes it.
	Publisher message.Publisher
	// NewSubscriber returns a subscriber of consumer group `group` that
	// receives every message published to any of `topics` (exact event
	// types, no wildcards). The suite calls Subscribe(ctx, group) on it
	// once, and BEFORE publishing anything it expects to receive; the suite
	// acks or nacks the messages.
	//
	// Closing the subscriber, or cancelling the Subscribe context, with a
	// message delivered but not acked must make that message available
	// again to the group. Close must return, and close the channel, also
	// while the Subscribe context is live and nobody reads the channel (it
	// is how the suite simulates a crashed consumer). A subscriber created
	// later for a group that already exists (the dropped-connection check)
	// must receive what the group still holds.
	//
	// The suite closes every subscriber NewSubscriber returns, at the
	// latest in a t.Cleanup registered after the Factory returned (so it
	// runs before the Factory's own cleanups). NewSubscriber is called from
	// the check's goroutine.
	NewSubscriber func(t TB, group string, topics []string) (message.Subscriber, error)
	// OrderedPerTopic reports that one consumer of a group receives the
	// messages of one topic in publish order. When it is false,
	// CheckOrderPerTopic logs that and checks nothing.
	OrderedPerTopic bool
	// SingleActiveConsumer reports that the consumers of a group do not
	// compete: one of them, the active one, receives all of the group's
	// messages while the others stand by, and one of those takes over when
	// it ends (RabbitMQ's single active consumer, as on bento's partition
	// queues). CheckConsumerGroups then requires that exactly one of the two
	// consumers of its shared group receives messages, instead of both.
	SingleActiveConsumer bool
	// RedeliveryTimeout bounds how long the suite waits for a redelivery
	// (some buses redeliver only after an idle time, e.g. Redis Streams
	// pending-entry claims). Zero means 10 s.
	RedeliveryTimeout time.Duration
}

// Factory returns a fresh, isolated Bus for one check (fresh names: the suite
// also uses random group names). The Factory owns what it creates: it
// closes the Bus's Publisher, and deletes whatever the Bus declared on a
// broker, with t.Cleanup. It may call t.Fatalf when the bus cannot be
// built. [Run] calls it from several checks at once.
type Factory func(t TB) *Bus

// Timing of the checks. Every wait is bounded by one of these.
const (
	// defaultRedeliveryTimeout is used when Bus.RedeliveryTimeout is zero.
	defaultRedeliveryTimeout = 10 * time.Second
	// idleTimeout is how long a check waits for the next message it
	// expects before it gives up and reports what is missing.
	idleTimeout = 5 * time.Second
	// checkTimeout caps a whole receive loop, however busy the bus.
	checkTimeout = 60 * time.Second
	// quietPeriod is how long a check keeps listening, after everything it
	// expected arrived, for messages it did not expect.
	quietPeriod = 250 * time.Millisecond
	// ackedQuiet is how long an acked message must stay away.
	ackedQuiet = time.Second
	// closeTimeout bounds a subscriber's Close and the closing of its
	// channel.
	closeTimeout = 10 * time.Second
	// maxListed is how many message ids a failure lists.
	maxListed = 10
)

func (b *Bus) redeliveryTimeout() time.Duration {
	if b.RedeliveryTimeout > 0 {
		return b.RedeliveryTimeout
	}
	return defaultRedeliveryTimeout
}

// checks lists the checks [Run] runs, in order.
var checks = []struct {
	name string
	fn   func(TB, Factory)
}{
	{"Delivery", CheckDelivery},
	{"RoundTrip", CheckRoundTrip},
	{"NackRedelivery", CheckNackRedelivery},
	{"DroppedConnection", CheckDroppedConnection},
	{"ConsumerGroups", CheckConsumerGroups},
	{"OrderPerTopic", CheckOrderPerTopic},
}

// Run runs every check as a parallel-safe subtest of t (t.Run per check):
// Delivery, RoundTrip, NackRedelivery, DroppedConnection, ConsumerGroups
// and OrderPerTopic. Each subtest calls t.Parallel, so the checks run
// concurrently, each on its own Bus from f, once the calling test function
// has returned (t's cleanups run after them).
func Run(t *testing.T, f Factory) {
	t.Helper()
	if f == nil {
		t.Fatal("bustest.Run: nil Factory")
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, f)
		})
	}
}
