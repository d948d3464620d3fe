package messaging

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/internal/wire"
	"github.com/bentoevents/bento/outbox"
)

// Metadata keys of the wire format: the one list of them (outbox metadata
// uses the same keys). Every message carries MetaEventType, MetaTenantID,
// MetaSchemaVersion, MetaOccurredAt and MetaCorrelationID; the aggregate
// keys are present when the event belongs to an aggregate; MetaCausationID,
// MetaTraceparent and MetaTracestate when the event has them;
// MetaPartitionKey always; MetaProducer when the unit of work that wrote
// the event names its producer (uow.Config.Producer). MetaTraceparent and
// MetaTracestate are the W3C Trace Context of the projector's publish span
// (see package projector); a consumer's span continues from it.
const (
	MetaEventType        = wire.EventType
	MetaAggregateType    = wire.AggregateType
	MetaAggregateID      = wire.AggregateID
	MetaAggregateVersion = wire.AggregateVersion
	MetaTenantID         = wire.TenantID
	MetaSchemaVersion    = wire.SchemaVersion
	MetaOccurredAt       = wire.OccurredAt
	// MetaCorrelationID is the id of the first event of a chain; set it
	// (outbox.WithMetadata) to continue a chain begun elsewhere.
	MetaCorrelationID = wire.CorrelationID
	// MetaCausationID is the id of the event whose handling wrote this one.
	MetaCausationID = wire.CausationID
	MetaTraceparent = wire.Traceparent
	MetaTracestate  = wire.Tracestate
	// MetaProducer names the service that wrote the event.
	MetaProducer = wire.Producer
	// MetaPartitionKey chooses the consumer partition of the message (see
	// PartitionKey): "tenant|aggregate type|aggregate id" for an event of
	// an aggregate, else the key a scheduled message was written with
	// (outbox.ScheduleOpts.PartitionKey), else the event id. RabbitMQ's
	// consistent-hash exchange hashes it.
	MetaPartitionKey = wire.PartitionKey
	// MetaDueAt is when a scheduled message (outbox.Store.Schedule) fell
	// due, RFC 3339 in UTC, set by the relay when it released the message.
	MetaDueAt = wire.DueAt
	// MetaRedelivered is "true" on a message the broker delivered before
	// (a bus sets it on the way in, never on the way out): its consumer may
	// have died while handling it.
	MetaRedelivered = wire.Redelivered
	// MetaDeliveryCount is how many times the database bus delivered a
	// message to its queue before (package dbbus sets it on the way in,
	// with MetaRedelivered, when it is not zero), as a RabbitMQ quorum
	// queue counts them in its x-delivery-count header.
	MetaDeliveryCount = wire.DeliveryCount
	// MetaReplays counts the times a dead letter was replayed: a message
	// that carries it was dead-lettered, so never applied, by the group it
	// was replayed to.
	MetaReplays = wire.Replays
)

// ErrMalformedMessage is returned (usually inside a [*DecodeError]) for a
// message or outbox row that does not follow the wire format.
var ErrMalformedMessage = errors.New("messaging: malformed message")

// DecodeError says which part of a message breaks the wire format. It unwraps
// to [ErrMalformedMessage].
type DecodeError struct {
	// MessageID is the message's UUID (possibly empty).
	MessageID string
	// Key is the offending metadata key, or "uuid" or "payload".
	Key string
	// Reason says what is wrong.
	Reason string
}

// Error implements error.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("%v %q: %s %s", ErrMalformedMessage, e.MessageID, e.Key, e.Reason)
}

// Unwrap returns [ErrMalformedMessage].
func (e *DecodeError) Unwrap() error { return ErrMalformedMessage }

// Envelope is a decoded message: the event's identity and context, and its
// JSON payload still undecoded.
type Envelope struct {
	// ID is the event id (the outbox row id and the message UUID).
	ID string
	// EventType is the event's wire name, e.g. "order.paid".
	EventType string
	// AggregateType and AggregateID identify the aggregate the event belongs
	// to; both are empty for an event without aggregate.
	AggregateType string
	AggregateID   string
	// AggregateVersion is the aggregate version the event produced (0 when
	// the message carries none).
	AggregateVersion int64
	// TenantID is the tenant the event belongs to.
	TenantID string
	// SchemaVersion is the version of the payload's JSON shape.
	SchemaVersion int
	// OccurredAt is when the event happened, in UTC.
	OccurredAt time.Time
	// CorrelationID ties together every event caused, directly or not, by
	// the same first event; CausationID is the id of the message whose
	// handling produced this event. Traceparent is the W3C trace context.
	CorrelationID string
	CausationID   string
	Traceparent   string
	// Payload is the event as JSON.
	Payload json.RawMessage
	// Metadata holds every metadata entry of the message, the well-known
	// keys included.
	Metadata map[string]string
}

// NewMessage turns an outbox row into the watermill message that carries it
// on the wire: UUID = m.ID, Payload = m.Payload, and as metadata every entry
// of m.Metadata overlaid with the well-known keys taken from the row's
// columns. The correlation id is m.Metadata's when set, else the event's own
// id (a chain starts at its first event).
//
// A row is validated once, when it is written (outbox.Store.Prepare, which
// Insert, Add and every unit of work call): NewMessage trusts it and checks
// nothing again, so the relay does not re-validate each row it publishes.
// Build rows by hand through Prepare, or with every field set. It returns an
// error wrapping [ErrMalformedMessage] only for a nil row.
func NewMessage(m *outbox.Message) (*message.Message, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: nil outbox message", ErrMalformedMessage)
	}

	msg := message.NewMessage(m.ID, message.Payload(m.Payload))
	maps.Copy(msg.Metadata, m.Metadata)
	md := msg.Metadata
	md[MetaEventType] = m.Topic
	if m.AggregateID != "" {
		md[MetaAggregateType] = m.AggregateType
		md[MetaAggregateID] = m.AggregateID
		md[MetaAggregateVersion] = strconv.FormatInt(m.AggregateVersion, 10)
	} else {
		delete(md, MetaAggregateType)
		delete(md, MetaAggregateID)
		delete(md, MetaAggregateVersion)
	}
	md[MetaTenantID] = m.TenantID
	if m.AggregateID != "" || md[MetaPartitionKey] == "" {
		// An event of an aggregate always goes to its aggregate's
		// partition; a message without one keeps the key it was written
		// with (outbox.ScheduleOpts.PartitionKey), else its own id.
		md[MetaPartitionKey] = partitionKey(m.ID, m.TenantID, m.AggregateType, m.AggregateID)
	}
	md[MetaSchemaVersion] = strconv.Itoa(m.SchemaVersion)
	md[MetaOccurredAt] = m.OccurredAt.UTC().Format(time.RFC3339Nano)
	if md[MetaCorrelationID] == "" {
		md[MetaCorrelationID] = m.ID
	}
	for _, k := range []string{MetaCausationID, MetaTraceparent, MetaTracestate} {
		if md[k] == "" {
			delete(md, k)
		}
	}
	return msg, nil
}

// envelopeKey keys the envelope EnvelopeOf keeps in a message's context.
type envelopeKey struct{}

// EnvelopeOf returns msg's envelope, decoding msg (see Decode) only the
// first time: it keeps the envelope in msg's context, so that the
// middlewares and the handler that see one delivery decode it once. A
// consumer calls it before its inbox and its handler; they read the same
// envelope. The envelope is shared: do not modify it.
//
// Errors: those of Decode.
func EnvelopeOf(msg *message.Message) (*Envelope, error) {
	if msg == nil {
		return Decode(nil)
	}
	if env, ok := EnvelopeFrom(msg.Context()); ok && env.ID == msg.UUID {
		return env, nil
	}
	env, err := Decode(msg)
	if err != nil {
		return nil, err
	}
	msg.SetContext(context.WithValue(msg.Context(), envelopeKey{}, env))
	return env, nil
}

// EnvelopeFrom returns the envelope EnvelopeOf kept in ctx (a message's
// context, or one derived from it), if any.
func EnvelopeFrom(ctx context.Context) (*Envelope, bool) {
	env, ok := ctx.Value(envelopeKey{}).(*Envelope)
	return env, ok
}

// Decode reads the wire format back from msg. It requires a UUID, the
// event_type, tenant_id, schema_version (a positive integer) and occurred_at
// (RFC 3339) keys and a JSON payload; aggregate_version must be an integer
// when present. Any failure is a [*DecodeError] naming the key ("uuid",
// "payload" or the metadata key), which unwraps to [ErrMalformedMessage].
// The envelope does not share memory with msg.
func Decode(msg *message.Message) (*Envelope, error) {
	if msg == nil {
		return nil, &DecodeError{Key: "uuid", Reason: "message is nil"}
	}
	bad := func(key, reason string) error {
		return &DecodeError{MessageID: msg.UUID, Key: key, Reason: reason}
	}
	if msg.UUID == "" {
		return nil, bad("uuid", "is empty")
	}
	md := msg.Metadata
	env := &Envelope{
		ID:            msg.UUID,
		EventType:     md[MetaEventType],
		AggregateType: md[MetaAggregateType],
		AggregateID:   md[MetaAggregateID],
		TenantID:      md[MetaTenantID],
		CorrelationID: md[MetaCorrelationID],
		CausationID:   md[MetaCausationID],
		Traceparent:   md[MetaTraceparent],
		Metadata:      maps.Clone(map[string]string(md)),
	}
	if env.Metadata == nil {
		env.Metadata = map[string]string{}
	}
	if env.EventType == "" {
		return nil, bad(MetaEventType, "is missing")
	}
	if env.TenantID == "" {
		return nil, bad(MetaTenantID, "is missing")
	}
	sv, ok := md[MetaSchemaVersion]
	if !ok {
		return nil, bad(MetaSchemaVersion, "is missing")
	}
	n, err := strconv.Atoi(sv)
	if err != nil || n < 1 {
		return nil, bad(MetaSchemaVersion, fmt.Sprintf("%q is not a positive integer", sv))
	}
	env.SchemaVersion = n
	if av, ok := md[MetaAggregateVersion]; ok {
		v, err := strconv.ParseInt(av, 10, 64)
		if err != nil {
			return nil, bad(MetaAggregateVersion, fmt.Sprintf("%q is not an integer", av))
		}
		env.AggregateVersion = v
	}
	oa, ok := md[MetaOccurredAt]
	if !ok {
		return nil, bad(MetaOccurredAt, "is missing")
	}
	t, err := time.Parse(time.RFC3339Nano, oa)
	if err != nil {
		return nil, bad(MetaOccurredAt, fmt.Sprintf("%q is not an RFC 3339 time", oa))
	}
	env.OccurredAt = t.UTC()
	if !json.Valid(msg.Payload) {
		return nil, bad("payload", "is not valid JSON")
	}
	env.Payload = json.RawMessage(bytes.Clone(msg.Payload))
	return env, nil
}
