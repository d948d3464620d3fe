package messaging_test

import (
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
			outbox.MetaCorrelationID: "01JD0000000000000000000000",
			outbox.MetaCausationID:   "01JD00000000000000000000ZZ",
			outbox.MetaTraceparent:   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			outbox.MetaProducer:      "checkout",
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
	assert.Equal(t, row.Metadata[outbox.MetaCorrelationID], env.CorrelationID)
	assert.Equal(t, row.Metadata[outbox.MetaCausationID], env.CausationID)
	assert.Equal(t, row.Metadata[outbox.MetaTraceparent], env.Traceparent)
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

func TestNewMessageRejectsBadRows(t *testing.T) {
	t.Parallel()
	tests := map[string]func(m *outbox.Message){
		"empty id":         func(m *outbox.Message) { m.ID = "" },
		"empty topic":      func(m *outbox.Message) { m.Topic = "" },
		"empty tenant":     func(m *outbox.Message) { m.TenantID = "" },
		"schema version 0": func(m *outbox.Message) { m.SchemaVersion = 0 },
		"payload not JSON": func(m *outbox.Message) { m.Payload = outbox.JSON(`{"a":`) },
		"payload empty":    func(m *outbox.Message) { m.Payload = nil },
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			row := sampleRow()
			mutate(row)
			_, err := messaging.NewMessage(row)
			require.ErrorIs(t, err, messaging.ErrMalformedMessage)
		})
	}
	_, err := messaging.NewMessage(nil)
	require.ErrorIs(t, err, messaging.ErrMalformedMessage)
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
