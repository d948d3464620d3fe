package bustest_test

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/messaging/bustest"
)

// Wiring the suite for a bus: a Factory builds an isolated instance per
// check, and a test calls bustest.Run with it. The suite needs a
// *testing.T, so this example is compiled but not run; in a _test.go file
// the body below is a test:
//
//	func TestMyBusConforms(t *testing.T) { bustest.Run(t, factory) }
func Example() {
	factory := func(t bustest.TB) *bustest.Bus {
		bus := messaging.NewMemoryBus() // your bus, with fresh names
		t.Cleanup(func() { _ = bus.Close() })
		return &bustest.Bus{
			Publisher: bus,
			NewSubscriber: func(t bustest.TB, group string, topics []string) (message.Subscriber, error) {
				return bus.Subscriber(group, topics...), nil
			},
			OrderedPerTopic: true, // one consumer gets a topic's messages in publish order
			// RedeliveryTimeout: 30 * time.Second, // if redelivery waits for an idle time
		}
	}
	_ = factory // bustest.Run(t, factory)
}
