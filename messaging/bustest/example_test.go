package bustest_test

import (
	"fmt"
	"regexp"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/bentotest"
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

// roundTripRecorder runs a check outside a test: bentotest.Recorder
// records the failures, and Logf drops the check's notes.
type roundTripRecorder struct{ *bentotest.Recorder }

func (roundTripRecorder) Logf(string, ...any) {}

// A check also runs outside a test, with a TB that records its failures
// instead of failing: here CheckRoundTrip on the memory bus, which must
// deliver every metadata entry and payload byte unchanged, and on a bus
// that loses the correlation id on the way.
func ExampleCheckRoundTrip() {
	memory := func(t bustest.TB) *bustest.Bus {
		bus := messaging.NewMemoryBus()
		t.Cleanup(func() { _ = bus.Close() })
		return &bustest.Bus{
			Publisher: bus,
			NewSubscriber: func(t bustest.TB, group string, topics []string) (message.Subscriber, error) {
				return bus.Subscriber(group, topics...), nil
			},
		}
	}
	lossy := func(t bustest.TB) *bustest.Bus {
		b := memory(t)
		b.Publisher = dropCorrelation{b.Publisher}
		return b
	}
	for _, f := range []bustest.Factory{memory, lossy} {
		r := roundTripRecorder{&bentotest.Recorder{}}
		r.Run(func(bentotest.TB) { bustest.CheckRoundTrip(r, f) })
		r.Close()
		failures := r.Failures()
		fmt.Println("failures:", len(failures))
		for _, msg := range failures[:min(2, len(failures))] { // the first message's
			fmt.Println(regexp.MustCompile(`[0-9A-Z]{26}`).ReplaceAllString(msg, "<id>"))
		}
	}
	// Output:
	// failures: 0
	// failures: 4
	// CheckRoundTrip: the delivered message <id> differs from the published one: [metadata "correlation_id" is missing (want "<id>")]
	// CheckRoundTrip: Decode of message <id> gives another Envelope than the published message: [CorrelationID "", want "<id>"]
}

// dropCorrelation publishes copies of the messages without their
// correlation id.
type dropCorrelation struct{ message.Publisher }

func (p dropCorrelation) Publish(topic string, msgs ...*message.Message) error {
	out := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		out[i] = m.Copy()
		delete(out[i].Metadata, messaging.MetaCorrelationID)
	}
	return p.Publisher.Publish(topic, out...)
}
