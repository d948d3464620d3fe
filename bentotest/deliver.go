package bentotest

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// MessageOpts adjust Message. A nil *MessageOpts means defaults.
type MessageOpts struct {
	// AggregateType, AggregateID and AggregateVersion describe the
	// aggregate. Default to none.
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	// Tenant defaults to "default".
	Tenant string
	// Metadata is added to the wire metadata.
	Metadata map[string]string
}

// Message builds the message a projector would publish for ev, with an id
// and time from the env's clock.
func (e *Env) Message(t TB, ev aggregate.Event, opts *MessageOpts) *message.Message {
	t.Helper()
	if opts == nil {
		opts = &MessageOpts{}
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		t.Fatalf("bentotest: encode %T: %v", ev, err)
	}
	tid := opts.Tenant
	if tid == "" {
		tid = "default"
	}
	now := e.Clock.Now()
	msg, err := messaging.NewMessage(&outbox.Message{
		ID: e.Clock.NewID(now), TenantID: tid, Topic: ev.EventType(),
		AggregateType: opts.AggregateType, AggregateID: opts.AggregateID, AggregateVersion: opts.AggregateVersion,
		SchemaVersion: aggregate.SchemaVersionOf(ev), Payload: payload, Metadata: opts.Metadata, OccurredAt: now,
	})
	if err != nil {
		t.Fatalf("bentotest: message for %T: %v", ev, err)
	}
	return msg
}

// Deliver publishes times copies of msg to the bus at once (as redeliveries
// and racing duplicates would arrive), waits until the consumers have
// handled them, and then drains: what the outbox holds already (a
// scheduled message released, say) reaches the consumers after msg, not
// racing it. Its routing key is the message's event type.
func (e *Env) Deliver(t TB, msg *message.Message, times int) {
	t.Helper()
	topic := msg.Metadata.Get(messaging.MetaEventType)
	var wg sync.WaitGroup
	errs := make(chan error, times)
	for i := 0; i < times; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- e.Bus.Publish(topic, msg.Copy())
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("bentotest: deliver %s: %v (is a consumer of %s started?)", msg.UUID, err, topic)
		}
	}
	e.waitIdle(t, time.Now().Add(e.drainTimeout))
	e.Drain(t)
}

// RequireAppliedOnce delivers msg once, then twice more in a row and three
// times at once, draining after each, and checks that effects — a count of
// what the handler does, such as rows it writes — grew by exactly one.
func (e *Env) RequireAppliedOnce(t TB, msg *message.Message, effects func() int64) {
	t.Helper()
	before := effects()
	e.Deliver(t, msg, 1)
	e.Deliver(t, msg, 1)
	e.Deliver(t, msg, 1)
	e.Deliver(t, msg, 3)
	if got := effects() - before; got != 1 {
		t.Errorf("bentotest: message %s (%s) delivered 6 times took effect %d times, want 1",
			msg.UUID, msg.Metadata.Get(messaging.MetaEventType), got)
	}
}
