package bentotest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// Event is an event as the kit reports it: recorded, committed or
// published.
type Event struct {
	// ID is the event id; empty for a recorded event, which a unit of
	// work stamps when it writes it.
	ID               string
	Topic            string
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	TenantID         string
	Payload          json.RawMessage
	Metadata         map[string]string
}

// String describes the event for failure messages: topic, aggregate and
// payload.
func (e Event) String() string {
	s := e.Topic
	if e.AggregateID != "" {
		s += fmt.Sprintf(" %s/%s v%d", e.AggregateType, e.AggregateID, e.AggregateVersion)
	}
	return s + " " + string(e.Payload)
}

// Want describes an expected event. Empty fields match anything; Payload,
// when set, is a Go value (or json.RawMessage) that must encode to the same
// JSON as the event's payload.
type Want struct {
	Topic       string
	AggregateID string
	Payload     any
}

// String describes what w asks for, for failure messages.
func (w Want) String() string {
	parts := []string{}
	if w.Topic != "" {
		parts = append(parts, w.Topic)
	} else {
		parts = append(parts, "(any topic)")
	}
	if w.AggregateID != "" {
		parts = append(parts, "aggregate "+w.AggregateID)
	}
	if w.Payload != nil {
		b, err := encode(w.Payload)
		if err != nil {
			b = []byte(fmt.Sprintf("<%v>", err))
		}
		parts = append(parts, string(b))
	}
	return strings.Join(parts, " ")
}

// matches reports why e does not match w ("" when it does).
func (w Want) mismatch(e Event) string {
	if w.Topic != "" && w.Topic != e.Topic {
		return fmt.Sprintf("topic %q, want %q", e.Topic, w.Topic)
	}
	if w.AggregateID != "" && w.AggregateID != e.AggregateID {
		return fmt.Sprintf("aggregate %q, want %q", e.AggregateID, w.AggregateID)
	}
	if w.Payload != nil {
		want, err := encode(w.Payload)
		if err != nil {
			return fmt.Sprintf("cannot encode the wanted payload: %v", err)
		}
		if !jsonEqual(want, e.Payload) {
			return fmt.Sprintf("payload %s, want %s", e.Payload, want)
		}
	}
	return ""
}

func encode(v any) ([]byte, error) {
	switch p := v.(type) {
	case json.RawMessage:
		return p, nil
	case []byte:
		return p, nil
	}
	return json.Marshal(v)
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// requireEvents checks that got matches want exactly, in order.
func requireEvents(t TB, what string, got []Event, want []Want) {
	t.Helper()
	problem := ""
	if len(got) != len(want) {
		problem = fmt.Sprintf("%d events, want %d", len(got), len(want))
	} else {
		for i := range want {
			if m := want[i].mismatch(got[i]); m != "" {
				problem = fmt.Sprintf("event %d: %s", i+1, m)
				break
			}
		}
	}
	if problem == "" {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "bentotest: %s: %s\nexpected:\n", what, problem)
	for i, w := range want {
		fmt.Fprintf(&b, "  %d. %s\n", i+1, w)
	}
	if len(want) == 0 {
		b.WriteString("  (none)\n")
	}
	b.WriteString("recorded:\n")
	for i, e := range got {
		fmt.Fprintf(&b, "  %d. %s\n", i+1, e)
	}
	if len(got) == 0 {
		b.WriteString("  (none)\n")
	}
	t.Errorf("%s", b.String())
}

// Recorded returns the pending events of an aggregate as Events.
func Recorded(agg aggregate.Root) []Event {
	var out []Event
	for _, r := range agg.AggregateBase().PendingEvents() {
		payload, _ := json.Marshal(r.Event)
		out = append(out, Event{
			Topic: r.Topic(), AggregateType: agg.AggregateType(), AggregateID: r.AggregateID,
			AggregateVersion: r.AggregateVersion, Payload: payload,
		})
	}
	return out
}

// RequireRecorded checks that agg holds exactly the pending events want, in
// order: what its methods recorded and no unit of work committed yet.
func RequireRecorded(t TB, agg aggregate.Root, want ...Want) {
	t.Helper()
	requireEvents(t, "events recorded by "+agg.AggregateType(), Recorded(agg), want)
}

// Committed returns every outbox row, in id order.
func (e *Env) Committed(t TB) []Event {
	t.Helper()
	var rows []outbox.Message
	if err := e.DB.Order("id").Find(&rows).Error; err != nil {
		t.Fatalf("bentotest: read outbox: %v", err)
	}
	out := make([]Event, len(rows))
	for i, r := range rows {
		out[i] = Event{
			ID: r.ID, Topic: r.Topic, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
			AggregateVersion: r.AggregateVersion, TenantID: r.TenantID, Payload: json.RawMessage(r.Payload),
			Metadata: r.Metadata,
		}
	}
	return out
}

// RequireCommitted checks that the outbox holds exactly the events want, in
// commit (id) order.
func (e *Env) RequireCommitted(t TB, want ...Want) {
	t.Helper()
	requireEvents(t, "events committed to the outbox", e.Committed(t), want)
}

// PublishedEvents returns what the projector published, decoded.
func (e *Env) PublishedEvents(t TB) []Event {
	t.Helper()
	msgs := e.Published()
	out := make([]Event, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, eventOf(t, m))
	}
	return out
}

func eventOf(t TB, m *message.Message) Event {
	t.Helper()
	env, err := messaging.Decode(m)
	if err != nil {
		t.Fatalf("bentotest: published message %s: %v", m.UUID, err)
	}
	return Event{
		ID: env.ID, Topic: env.EventType, AggregateType: env.AggregateType, AggregateID: env.AggregateID,
		AggregateVersion: env.AggregateVersion, TenantID: env.TenantID, Payload: env.Payload, Metadata: env.Metadata,
	}
}

// RequirePublished checks that the projector published exactly the events
// want, in order.
func (e *Env) RequirePublished(t TB, want ...Want) {
	t.Helper()
	requireEvents(t, "events published to the bus", e.PublishedEvents(t), want)
}
