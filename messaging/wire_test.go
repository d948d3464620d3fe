package messaging_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

func sampleRow() *outbox.Message {
	return &outbox.Message{
		ID:               "01JD0000000000000000000001",
		TenantID:         "acme",
		Topic:            "order.paid",
		AggregateType:    "order",
		AggregateID:      "o-42",
		AggregateVersion: 7,
		SchemaVersion:    2,
		Payload:          outbox.JSON(`{"order_id":"o-42","amount_cents":1200}`),
		Metadata: outbox.Metadata{
			messaging.MetaCorrelationID: "01JD0000000000000000000000",
			messaging.MetaCausationID:   "01JD00000000000000000000ZZ",
			messaging.MetaTraceparent:   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			messaging.MetaProducer:      "checkout",
		},
		OccurredAt: time.Date(2026, 11, 21, 10, 30, 0, 123456789, time.FixedZone("JST", 9*3600)),
	}
}

func TestNewMessageDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	row := sampleRow()
	msg, err := messaging.NewMessage(row)
	require.NoError(t, err)

	assert.Equal(t, row.ID, msg.UUID)
	assert.JSONEq(t, string(row.Payload), string(msg.Payload))
	assert.Equal(t, map[string]string{
		"event_type":        "order.paid",
		"aggregate_type":    "order",
		"aggregate_id":      "o-42",
		"aggregate_version": "7",
		"tenant_id":         "acme",
		"partition_key":     "acme|order|o-42",
		"schema_version":    "2",
		"occurred_at":       "2026-11-21T01:30:00.123456789Z",
		"correlation_id":    "01JD0000000000000000000000",
		"causation_id":      "01JD00000000000000000000ZZ",
		"traceparent":       "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"producer":          "checkout",
	}, map[string]string(msg.Metadata))

	env, err := messaging.Decode(msg)
	require.NoError(t, err)
	assert.Equal(t, row.ID, env.ID)
	assert.Equal(t, row.Topic, env.EventType)
	assert.Equal(t, row.AggregateType, env.AggregateType)
	assert.Equal(t, row.AggregateID, env.AggregateID)
	assert.Equal(t, row.AggregateVersion, env.AggregateVersion)
	assert.Equal(t, row.TenantID, env.TenantID)
	assert.Equal(t, row.SchemaVersion, env.SchemaVersion)
	assert.True(t, row.OccurredAt.Equal(env.OccurredAt), "occurred_at %v != %v", env.OccurredAt, row.OccurredAt)
	assert.Equal(t, time.UTC, env.OccurredAt.Location())
	assert.Equal(t, row.Metadata[messaging.MetaCorrelationID], env.CorrelationID)
	assert.Equal(t, row.Metadata[messaging.MetaCausationID], env.CausationID)
	assert.Equal(t, row.Metadata[messaging.MetaTraceparent], env.Traceparent)
	assert.JSONEq(t, string(row.Payload), string(env.Payload))
	assert.Equal(t, map[string]string(msg.Metadata), env.Metadata)
}

func TestNewMessageDefaults(t *testing.T) {
	t.Parallel()
	row := sampleRow()
	row.AggregateType, row.AggregateID, row.AggregateVersion = "", "", 0
	row.Metadata = outbox.Metadata{
		// Row columns win over metadata entries of the same name.
		messaging.MetaEventType:   "spoofed",
		messaging.MetaAggregateID: "spoofed",
		messaging.MetaCausationID: "",
		messaging.MetaTracestate:  "",
	}
	msg, err := messaging.NewMessage(row)
	require.NoError(t, err)
	assert.Equal(t, "order.paid", msg.Metadata.Get(messaging.MetaEventType))
	assert.Equal(t, row.ID, msg.Metadata.Get(messaging.MetaCorrelationID), "a chain starts at its first event")
	for _, k := range []string{messaging.MetaAggregateType, messaging.MetaAggregateID, messaging.MetaAggregateVersion, messaging.MetaCausationID, messaging.MetaTraceparent, messaging.MetaTracestate} {
		_, ok := msg.Metadata[k]
		assert.False(t, ok, "key %s must be absent", k)
	}

	env, err := messaging.Decode(msg)
	require.NoError(t, err)
	assert.Empty(t, env.AggregateID)
	assert.Zero(t, env.AggregateVersion)
	assert.Equal(t, row.ID, env.CorrelationID)
}

func TestNewMessageTrustsItsRow(t *testing.T) {
	t.Parallel()
	// Rows are validated once, when written; NewMessage refuses only nil.
	_, err := messaging.NewMessage(nil)
	require.ErrorIs(t, err, messaging.ErrMalformedMessage)
	row := sampleRow()
	row.Payload = outbox.JSON(`{"a":`) // Prepare would have refused it
	msg, err := messaging.NewMessage(row)
	require.NoError(t, err)
	_, err = messaging.Decode(msg)
	require.ErrorIs(t, err, messaging.ErrMalformedMessage, "a consumer still refuses what the writer would have")
}

func TestDecodeRejectsMalformedMessages(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(m *message.Message)
		key    string
	}{
		{"no uuid", func(m *message.Message) { m.UUID = "" }, "uuid"},
		{"no event type", func(m *message.Message) { delete(m.Metadata, messaging.MetaEventType) }, messaging.MetaEventType},
		{"empty event type", func(m *message.Message) { m.Metadata.Set(messaging.MetaEventType, "") }, messaging.MetaEventType},
		{"no tenant", func(m *message.Message) { delete(m.Metadata, messaging.MetaTenantID) }, messaging.MetaTenantID},
		{"no schema version", func(m *message.Message) { delete(m.Metadata, messaging.MetaSchemaVersion) }, messaging.MetaSchemaVersion},
		{"schema version not a number", func(m *message.Message) { m.Metadata.Set(messaging.MetaSchemaVersion, "v2") }, messaging.MetaSchemaVersion},
		{"schema version zero", func(m *message.Message) { m.Metadata.Set(messaging.MetaSchemaVersion, "0") }, messaging.MetaSchemaVersion},
		{"schema version negative", func(m *message.Message) { m.Metadata.Set(messaging.MetaSchemaVersion, "-1") }, messaging.MetaSchemaVersion},
		{"no occurred at", func(m *message.Message) { delete(m.Metadata, messaging.MetaOccurredAt) }, messaging.MetaOccurredAt},
		{"occurred at not RFC 3339", func(m *message.Message) { m.Metadata.Set(messaging.MetaOccurredAt, "21/11/2026") }, messaging.MetaOccurredAt},
		{"aggregate version not a number", func(m *message.Message) { m.Metadata.Set(messaging.MetaAggregateVersion, "seven") }, messaging.MetaAggregateVersion},
		{"payload not JSON", func(m *message.Message) { m.Payload = []byte("not json") }, "payload"},
		{"payload empty", func(m *message.Message) { m.Payload = nil }, "payload"},
		{"no metadata at all", func(m *message.Message) { m.Metadata = nil }, messaging.MetaEventType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			msg, err := messaging.NewMessage(sampleRow())
			require.NoError(t, err)
			tt.mutate(msg)
			env, err := messaging.Decode(msg)
			require.Error(t, err)
			assert.Nil(t, env)
			assert.ErrorIs(t, err, messaging.ErrMalformedMessage)
			var de *messaging.DecodeError
			require.ErrorAs(t, err, &de)
			assert.Equal(t, tt.key, de.Key)
			assert.Equal(t, msg.UUID, de.MessageID)
		})
	}
}

func TestDecodeCopies(t *testing.T) {
	t.Parallel()
	msg, err := messaging.NewMessage(sampleRow())
	require.NoError(t, err)
	env, err := messaging.Decode(msg)
	require.NoError(t, err)
	msg.Payload[2] = 'X'
	msg.Metadata.Set("producer", "changed")
	assert.True(t, json.Valid(env.Payload))
	assert.Equal(t, "checkout", env.Metadata["producer"])
}

func TestDecodeErrorUnwraps(t *testing.T) {
	t.Parallel()
	var err error = &messaging.DecodeError{MessageID: "m1", Key: "uuid", Reason: "is empty"}
	assert.True(t, errors.Is(err, messaging.ErrMalformedMessage))
	assert.NotEmpty(t, err.Error())
}

// TestEnvelopeOfDecodesOncePerDelivery: the first call decodes and keeps
// the envelope in the message's context, later calls (and EnvelopeFrom on
// derived contexts) return that same envelope; a copy of the message, or a
// malformed one, is decoded on its own.
func TestEnvelopeOfDecodesOncePerDelivery(t *testing.T) {
	msg, err := messaging.NewMessage(&outbox.Message{ID: "01JD3ZQ8Y7C1W4K3M5N6P7Q8R9", TenantID: "default", Topic: "order.paid",
		AggregateType: "order", AggregateID: "o-1", AggregateVersion: 2, SchemaVersion: 1, Payload: outbox.JSON(`{}`), OccurredAt: time.Now()})
	require.NoError(t, err)
	_, ok := messaging.EnvelopeFrom(msg.Context())
	require.False(t, ok, "nothing decoded yet")

	first, err := messaging.EnvelopeOf(msg)
	require.NoError(t, err)
	assert.Equal(t, int64(2), first.AggregateVersion)
	msg.Metadata.Set(messaging.MetaAggregateVersion, "3") // a second decode would see this
	again, err := messaging.EnvelopeOf(msg)
	require.NoError(t, err)
	assert.Same(t, first, again, "decoded once")
	derived, ok := messaging.EnvelopeFrom(context.WithValue(msg.Context(), struct{}{}, 1))
	require.True(t, ok)
	assert.Same(t, first, derived, "a context derived from the message's carries it")

	cp := msg.Copy()
	cp.UUID = "01JD3ZQ8Y7C1W4K3M5N6P7Q8S0"
	cp.SetContext(msg.Context())
	other, err := messaging.EnvelopeOf(cp)
	require.NoError(t, err)
	assert.Equal(t, int64(3), other.AggregateVersion, "another message is decoded on its own")

	bad := message.NewMessage("m-1", []byte(`{}`))
	_, err = messaging.EnvelopeOf(bad)
	require.ErrorIs(t, err, messaging.ErrMalformedMessage)
	_, ok = messaging.EnvelopeFrom(bad.Context())
	assert.False(t, ok, "a failed decode keeps nothing")
}
