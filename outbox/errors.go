package outbox

import (
	"errors"
	"fmt"

	"github.com/bentoevents/bento/internal/dberr"
)

var (
	// ErrInvalidConfig is returned by NewStore for a bad configuration;
	// the message names every bad field.
	ErrInvalidConfig = errors.New("outbox: invalid config")
	// ErrInvalidEvent is returned (wrapped in a *ValidationError) for an event
	// the outbox cannot store: a malformed topic, aggregate type, aggregate id,
	// id, schema version, dedup key, or a payload or metadata that is not JSON.
	ErrInvalidEvent = errors.New("outbox: invalid event")
	// ErrPayloadTooLarge is returned (wrapped in a *ValidationError) for a
	// payload larger than Config.MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("outbox: payload too large")
	// ErrMetadataTooLarge is returned (wrapped in a *ValidationError) for
	// metadata larger than Config.MaxMetadataBytes.
	ErrMetadataTooLarge = errors.New("outbox: metadata too large")
	// ErrDuplicateKey is returned when a dedup key is already used by another
	// event of the same tenant. Nothing is written for that event.
	ErrDuplicateKey = errors.New("outbox: duplicate dedup key")
	// ErrDuplicateVersion is returned when an event of the same tenant,
	// aggregate type, aggregate id and version was already written: an
	// aggregate's events are relayed in version order, so a version names
	// one event. Nothing is written for that event.
	ErrDuplicateVersion = errors.New("outbox: duplicate aggregate version")
	// ErrClosed is returned (wrapped) when the database handle has been
	// closed. It is the one closed-database error of every bento package:
	// uow.ErrClosed, inbox.ErrClosed and idempotency.ErrClosed are this same
	// error, so errors.Is(err, outbox.ErrClosed) holds wherever it comes
	// from.
	ErrClosed = dberr.ErrClosed
	// ErrNotMigrated is returned by NewStore when the outbox table does not
	// exist in the database: Migrate (or MigrateWith) was not called.
	ErrNotMigrated = errors.New("outbox: outbox table missing: call outbox.Migrate(ctx, db) first")
)

// versionConstraint is the unique index (or, on a partitioned table, the
// trigger's constraint name) that makes an aggregate version unique.
const versionConstraint = "outbox_events_aggregate_version"

// versionColumns are the columns SQLite names when that index is violated.
const versionColumns = "outbox_events.tenant_id, outbox_events.aggregate_type, outbox_events.aggregate_id, outbox_events.aggregate_version"

// ValidationError says which field of which event is invalid. It unwraps to
// [ErrInvalidEvent], [ErrPayloadTooLarge], [ErrMetadataTooLarge] or
// tenant.ErrInvalid.
type ValidationError struct {
	// EventID and Topic identify the event, when known.
	EventID string
	Topic   string
	// Field is the invalid field, as its column name ("topic", "payload", ...).
	Field string
	// Err is the sentinel (or tenant error) with the reason.
	Err error
	// Reason says what is wrong.
	Reason string
}

// Error implements error.
func (e *ValidationError) Error() string {
	msg := fmt.Sprintf("%v: %s %s", e.Err, e.Field, e.Reason)
	if e.EventID != "" || e.Topic != "" {
		msg += fmt.Sprintf(" (event %s, topic %q)", e.EventID, e.Topic)
	}
	return msg
}

// Unwrap returns the sentinel.
func (e *ValidationError) Unwrap() error { return e.Err }

// wrapDB wraps a database error with op, adding ErrClosed when the handle is
// closed.
func wrapDB(op string, err error) error { return dberr.Wrap(op, err) }
