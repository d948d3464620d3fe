package bustest

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// CheckRoundTrip publishes two messages built with [messaging.NewMessage]:
// one with every well-known metadata key (the Meta* constants of package
// messaging) plus arbitrary entries whose values hold spaces, quotes and
// unicode, and a payload whose exact bytes (spacing, escapes, unicode)
// matter; and one without aggregate, with only the keys every message has.
// Each must arrive with the same UUID, every metadata entry and the payload
// bytes unchanged, and [messaging.Decode] must give the same
// [messaging.Envelope] as for the published message. Metadata entries the
// bus adds are logged, not failed.
func CheckRoundTrip(t TB, f Factory) {
	t.Helper()
	c := begin(t, f, "CheckRoundTrip")
	topic := c.topic("a")
	c.subscribe("the consumer of group g", c.group("g"), topic)

	full := c.build(&outbox.Message{
		ID:               aggregate.NewID(),
		TenantID:         "tenant ü-1",
		Topic:            topic,
		AggregateType:    "order",
		AggregateID:      "order 42 / Ünïcödé",
		AggregateVersion: 42,
		SchemaVersion:    3,
		Payload: outbox.JSON("{\"note\": \"héllo wörld ✓ 日本語 🚀\",  \"amount\": 1.50,\n" +
			"  \"escaped\": \"line\\nbreak \\\"quoted\\\" \\u00e9\", \"nested\": {\"a\": [1, 2, 3], \"b\": null}}"),
		Metadata: outbox.Metadata{
			messaging.MetaCorrelationID: aggregate.NewID(),
			messaging.MetaCausationID:   aggregate.NewID(),
			messaging.MetaTraceparent:   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"bustest_spaces":            "  a value  with spaces  ",
			"bustest_unicode":           "héllo wörld ✓ 日本語 🚀",
			"bustest_quotes":            `"double" 'single' \back\slash`,
			"bustest-Mixed_Case.key":    "MiXeD CaSe",
			"bustest_json":              `{"k": ["v", 1]}`,
		},
		OccurredAt: time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.FixedZone("UTC+1", 3600)),
	})
	bare := c.build(&outbox.Message{
		ID:            aggregate.NewID(),
		TenantID:      "t",
		Topic:         topic,
		SchemaVersion: 1,
		Payload:       outbox.JSON(`{}`),
		OccurredAt:    time.Now(),
	})
	want := map[string]*message.Message{full.UUID: full, bare.UUID: bare}
	c.publish(topic, full, bare)

	seen := map[string]int{}
	take := func(d delivery) {
		got := d.msg
		got.Ack()
		w := want[got.UUID]
		if w == nil {
			c.errorf("a message with an unknown UUID %q arrived", got.UUID)
			return
		}
		seen[got.UUID]++
		if seen[got.UUID] > 1 {
			return
		}
		c.compare("the delivered message", w, got)
		if extra := extraKeys(w, got); len(extra) > 0 {
			c.logf("message %s arrived with metadata the bus added: %v (tolerated)", got.UUID, extra)
		}
		wantEnv, err := messaging.Decode(w)
		if err != nil {
			c.fatalf("Decode of the published message %s: %v", w.UUID, err)
		}
		gotEnv, err := messaging.Decode(got)
		if err != nil {
			c.errorf("Decode of the delivered message %s: %v", got.UUID, err)
			return
		}
		if diffs := diffEnvelope(wantEnv, gotEnv); len(diffs) > 0 {
			c.errorf("Decode of message %s gives another Envelope than the published message: %v", got.UUID, diffs)
		}
	}
	c.receive(idleTimeout, take, func() bool { return len(seen) == len(want) })
	for _, w := range []*message.Message{full, bare} {
		if seen[w.UUID] == 0 {
			c.errorf("message %s was not delivered within %v", w.UUID, idleTimeout)
		}
	}
}

// build turns an outbox row into its wire message.
func (c *check) build(row *outbox.Message) *message.Message {
	c.t.Helper()
	m, err := messaging.NewMessage(row)
	if err != nil {
		c.fatalf("build message: %v", err)
	}
	return m
}

// compare reports with Errorf how got differs from want in UUID, metadata
// (entries of want that are missing or changed) and payload bytes. what
// names got in the message.
func (c *check) compare(what string, want, got *message.Message) {
	c.t.Helper()
	var diffs []string
	if got.UUID != want.UUID {
		diffs = append(diffs, fmt.Sprintf("UUID %q, want %q", got.UUID, want.UUID))
	}
	for _, k := range slices.Sorted(maps.Keys(want.Metadata)) {
		v, ok := got.Metadata[k]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("metadata %q is missing (want %q)", k, want.Metadata[k]))
		case v != want.Metadata[k]:
			diffs = append(diffs, fmt.Sprintf("metadata %q is %q, want %q", k, v, want.Metadata[k]))
		}
	}
	if !bytes.Equal(got.Payload, want.Payload) {
		diffs = append(diffs, fmt.Sprintf("payload is %q, want %q", got.Payload, want.Payload))
	}
	if len(diffs) > 0 {
		c.errorf("%s %s differs from the published one: %v", what, want.UUID, diffs)
	}
}

// extraKeys returns the metadata keys of got that want lacks, sorted.
func extraKeys(want, got *message.Message) []string {
	var out []string
	for k := range got.Metadata {
		if _, ok := want.Metadata[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// diffEnvelope lists the fields in which got differs from want, leaving out
// Metadata (compare checks want's entries; extra entries are tolerated).
func diffEnvelope(want, got *messaging.Envelope) []string {
	var diffs []string
	field := func(name string, g, w any) {
		if g != w {
			diffs = append(diffs, fmt.Sprintf("%s %q, want %q", name, fmt.Sprint(g), fmt.Sprint(w)))
		}
	}
	field("ID", got.ID, want.ID)
	field("EventType", got.EventType, want.EventType)
	field("AggregateType", got.AggregateType, want.AggregateType)
	field("AggregateID", got.AggregateID, want.AggregateID)
	field("AggregateVersion", got.AggregateVersion, want.AggregateVersion)
	field("TenantID", got.TenantID, want.TenantID)
	field("SchemaVersion", got.SchemaVersion, want.SchemaVersion)
	if !got.OccurredAt.Equal(want.OccurredAt) {
		diffs = append(diffs, fmt.Sprintf("OccurredAt %v, want %v", got.OccurredAt, want.OccurredAt))
	}
	field("CorrelationID", got.CorrelationID, want.CorrelationID)
	field("CausationID", got.CausationID, want.CausationID)
	field("Traceparent", got.Traceparent, want.Traceparent)
	if !bytes.Equal(got.Payload, want.Payload) {
		diffs = append(diffs, fmt.Sprintf("Payload %q, want %q", got.Payload, want.Payload))
	}
	return diffs
}
