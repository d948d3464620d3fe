package outbox

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"maps"
	"time"
)

// Status is where a row is in the relay's state machine:
// new -> publishing -> sent, or publishing -> failed -> publishing ... -> dead.
type Status string

// The statuses of an outbox row.
const (
	StatusNew        Status = "new"        // committed, never tried
	StatusPublishing Status = "publishing" // claimed by a projector under a lease
	StatusSent       Status = "sent"       // confirmed by the broker
	StatusFailed     Status = "failed"     // last try failed; retried at available_at
	StatusDead       Status = "dead"       // gave up after the configured attempts
)

// Statuses lists every status in state-machine order.
var Statuses = []Status{StatusNew, StatusPublishing, StatusSent, StatusFailed, StatusDead}

// UnsentStatuses lists, in state-machine order, the statuses that
// [Store.Stats] and [Store.Breakdown] count: every status but sent. Sent
// rows pile up with traffic until retention removes them, so monitoring
// leaves them out and its cost follows the backlog, not the history;
// [Store.CountSent] counts them when an operator asks.
var UnsentStatuses = []Status{StatusNew, StatusPublishing, StatusFailed, StatusDead}

// Pending reports whether a row in status s still has to be relayed: new,
// publishing or failed.
func (s Status) Pending() bool {
	return s == StatusNew || s == StatusPublishing || s == StatusFailed
}

// Index returns the position of s in Statuses, or -1 for an unknown status.
func (s Status) Index() int {
	for i, st := range Statuses {
		if st == s {
			return i
		}
	}
	return -1
}

// NotifyChannel is the PostgreSQL LISTEN channel the outbox insert trigger
// notifies. The payload is "schema:tenant".
const NotifyChannel = "bento_outbox"

// Message is one row of the outbox_events table.
type Message struct {
	ID               string `gorm:"primaryKey"`
	TenantID         string
	Topic            string
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	SchemaVersion    int
	Payload          JSON
	Metadata         Metadata
	OccurredAt       time.Time
	CreatedAt        time.Time `gorm:"autoCreateTime:false"`
	Status           Status
	Attempts         int
	AvailableAt      time.Time
	LockedBy         *string
	LockedUntil      *time.Time
	LastError        *string
	PublishedAt      *time.Time
	// FailedAt is when the last publish attempt failed or its lease
	// expired; nil for a row that never failed.
	FailedAt *time.Time
	DedupKey *string
	// Held is true while the row waits behind an earlier unsent or dead
	// event of its aggregate; a claim sets it on first sight and the
	// settling of that earlier event clears it. Held rows stay out of the
	// index claims walk.
	Held bool
	// SizeBytes is the payload's and metadata's size as written, what the
	// projector's batch byte budget counts.
	SizeBytes int
	// NextWaits is set on a row Claim returns when a later event of its
	// aggregate is still to be sent: settling this row is what lets that
	// one go, so a relay should claim again at once instead of sleeping
	// after a short batch. Not stored.
	NextWaits bool `gorm:"-"`

	// prepared is set by Store.Prepare, so Insert does not fill in and
	// validate the same messages twice (a unit of work prepares before its
	// first write, then inserts). GORM ignores unexported fields.
	prepared bool
}

// size is the byte count stored in size_bytes: the payload and the
// metadata's keys and values.
func (m *Message) size() int {
	n := len(m.Payload)
	for k, v := range m.Metadata {
		n += len(k) + len(v)
	}
	return n
}

// headerBytes is the size of m as an AMQP field table: per entry a one-byte
// name length, the name, a type byte, a four-byte value length and the
// value.
func (m Metadata) headerBytes() int {
	n := 0
	for k, v := range m {
		n += len(k) + len(v) + 6
	}
	return n
}

// TableName tells GORM the table.
func (Message) TableName() string { return "outbox_events" }

// JSON is a JSON document stored in a jsonb (PostgreSQL) or text (SQLite)
// column.
type JSON []byte

// Value implements driver.Valuer, sending the document as text.
func (j JSON) Value() (driver.Value, error) {
	if j == nil {
		return nil, nil
	}
	return string(j), nil
}

// Scan implements sql.Scanner.
func (j *JSON) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*j = nil
	case []byte:
		*j = append(JSON(nil), v...)
	case string:
		*j = JSON(v)
	default:
		return fmt.Errorf("outbox: cannot scan %T into JSON", src)
	}
	return nil
}

// MarshalJSON returns the document itself.
func (j JSON) MarshalJSON() ([]byte, error) {
	if j == nil {
		return []byte("null"), nil
	}
	return j, nil
}

// Metadata is the string map stored with each event: correlation and
// causation ids, traceparent, producer. It travels as message metadata.
type Metadata map[string]string

// Value implements driver.Valuer.
func (m Metadata) Value() (driver.Value, error) {
	if m == nil {
		return "{}", nil
	}
	b, err := json.Marshal(map[string]string(m))
	return string(b), err
}

// Scan implements sql.Scanner.
func (m *Metadata) Scan(src any) error {
	var b []byte
	switch v := src.(type) {
	case nil:
		*m = nil
		return nil
	case []byte:
		b = v
	case string:
		b = []byte(v)
	default:
		return fmt.Errorf("outbox: cannot scan %T into Metadata", src)
	}
	out := Metadata{}
	if err := json.Unmarshal(b, &out); err != nil {
		return fmt.Errorf("outbox: scan metadata: %w", err)
	}
	*m = out
	return nil
}

type metaKey struct{}

// WithMetadata returns a copy of ctx carrying md. Events written under that
// context get these entries in their metadata, unless the event sets the key
// itself. Nested calls merge, inner keys winning.
func WithMetadata(ctx context.Context, md Metadata) context.Context {
	merged := Metadata{}
	maps.Copy(merged, MetadataFrom(ctx))
	maps.Copy(merged, md)
	return context.WithValue(ctx, metaKey{}, merged)
}

// MetadataFrom returns the metadata carried by ctx (nil if none). The map
// must not be modified.
func MetadataFrom(ctx context.Context) Metadata {
	md, _ := ctx.Value(metaKey{}).(Metadata)
	return md
}
