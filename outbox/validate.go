package outbox

import (
	"encoding/json"
	"fmt"
	"regexp"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"

	"github.com/bentoevents/bento/internal/clip"
	"github.com/bentoevents/bento/internal/wire"
	"github.com/bentoevents/bento/tenant"
)

// Field limits, matching the column sizes.
const (
	// MaxTopicLen is the longest topic: the one limit every bus checks too.
	MaxTopicLen         = wire.MaxTopicLen
	MaxAggregateTypeLen = 50
	MaxAggregateIDLen   = 64
	MaxDedupKeyLen      = 255
	MaxLastErrorLen     = 2000
)

var aggregateTypeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]*$`)

// ValidateTopic checks an event type name against bento's one topic rule,
// which the buses check too: 1 to MaxTopicLen bytes, words of ASCII
// letters, digits, '_' and '-' separated by single dots ("order.paid"). The
// AMQP wildcards '*' and '#' are not allowed. It returns an error wrapping
// ErrInvalidEvent.
func ValidateTopic(topic string) error {
	return asError(wire.Topic(topic), "topic", topic)
}

// ValidateAggregateType checks an aggregate type name: 1 to 50 characters,
// starting with a letter, then letters, digits, '_', '-' or '.'.
func ValidateAggregateType(t string) error {
	return asError(checkAggregateType(t), "aggregate_type", t)
}

func asError(reason, field, value string) error {
	if reason == "" {
		return nil
	}
	return &ValidationError{Field: field, Reason: fmt.Sprintf("%q %s", clip.String(value), reason), Err: ErrInvalidEvent}
}

func checkAggregateType(t string) string {
	switch {
	case t == "":
		return "is empty"
	case len(t) > MaxAggregateTypeLen:
		return fmt.Sprintf("is longer than %d characters", MaxAggregateTypeLen)
	case !aggregateTypeRE.MatchString(t):
		return "must start with a letter and hold only ASCII letters, digits, '_', '-' or '.'"
	}
	return ""
}

func checkPrintable(s string, max int) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > max:
		return fmt.Sprintf("is longer than %d bytes", max)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return "contains a control character"
		}
	}
	return ""
}

// validate checks m, whose defaults have been filled in.
func (s *Store) validate(m *Message) error {
	bad := func(field, reason string, sentinel error) error {
		return &ValidationError{EventID: m.ID, Topic: m.Topic, Field: field, Reason: reason, Err: sentinel}
	}
	if _, err := ulid.ParseStrict(m.ID); err != nil {
		return bad("id", fmt.Sprintf("%q is not a ULID", clip.String(m.ID)), ErrInvalidEvent)
	}
	if err := tenant.Validate(m.TenantID); err != nil {
		return bad("tenant_id", fmt.Sprintf("%q is invalid", clip.String(m.TenantID)), err)
	}
	if r := wire.Topic(m.Topic); r != "" {
		return bad("topic", fmt.Sprintf("%q %s", clip.String(m.Topic), r), ErrInvalidEvent)
	}
	if m.AggregateType != "" || m.AggregateID != "" {
		if r := checkAggregateType(m.AggregateType); r != "" {
			return bad("aggregate_type", fmt.Sprintf("%q %s", clip.String(m.AggregateType), r), ErrInvalidEvent)
		}
		if r := checkPrintable(m.AggregateID, MaxAggregateIDLen); r != "" {
			return bad("aggregate_id", fmt.Sprintf("%q %s", clip.String(m.AggregateID), r), ErrInvalidEvent)
		}
	}
	switch {
	case m.AggregateVersion < 0:
		return bad("aggregate_version", fmt.Sprintf("%d is negative", m.AggregateVersion), ErrInvalidEvent)
	case m.AggregateID != "" && m.AggregateVersion < 1:
		return bad("aggregate_version", "must be at least 1 for an event of an aggregate (versions order its events)", ErrInvalidEvent)
	case m.AggregateID == "" && m.AggregateVersion != 0:
		return bad("aggregate_version", fmt.Sprintf("%d without an aggregate id", m.AggregateVersion), ErrInvalidEvent)
	}
	if m.SchemaVersion < 1 || m.SchemaVersion > 32767 {
		return bad("schema_version", fmt.Sprintf("%d is outside 1..32767", m.SchemaVersion), ErrInvalidEvent)
	}
	if len(m.Payload) > s.cfg.MaxPayloadBytes {
		return bad("payload", fmt.Sprintf("is %d bytes, the limit is %d", len(m.Payload), s.cfg.MaxPayloadBytes), ErrPayloadTooLarge)
	}
	if !json.Valid(m.Payload) {
		return bad("payload", "is not valid JSON", ErrInvalidEvent)
	}
	for k := range m.Metadata {
		if k == "" {
			return bad("metadata", "has an empty key", ErrInvalidEvent)
		}
		if len(k) > MaxMetadataKeyLen {
			return bad("metadata", fmt.Sprintf("key %q is longer than %d bytes", clip.String(k), MaxMetadataKeyLen), ErrInvalidEvent)
		}
	}
	if n := m.Metadata.headerBytes(); n > s.cfg.MaxMetadataBytes {
		return bad("metadata", fmt.Sprintf("is %d bytes as headers, the limit is %d", n, s.cfg.MaxMetadataBytes), ErrMetadataTooLarge)
	}
	if m.DedupKey != nil {
		if r := checkPrintable(*m.DedupKey, MaxDedupKeyLen); r != "" {
			return bad("dedup_key", fmt.Sprintf("%q %s", clip.String(*m.DedupKey), r), ErrInvalidEvent)
		}
	}
	if m.OccurredAt.IsZero() {
		return bad("occurred_at", "is zero", ErrInvalidEvent)
	}
	return nil
}

// EncodePayload turns v into the JSON stored as an event payload: []byte and
// json.RawMessage are taken as already-encoded JSON, anything else goes
// through encoding/json. Errors wrap ErrInvalidEvent.
func EncodePayload(v any) (JSON, error) {
	var b []byte
	switch p := v.(type) {
	case nil:
		return nil, fmt.Errorf("%w: payload is nil", ErrInvalidEvent)
	case JSON:
		b = p
	case json.RawMessage:
		b = p
	case []byte:
		b = p
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("%w: encode payload %T: %w", ErrInvalidEvent, v, err)
		}
	}
	return JSON(b), nil
}
