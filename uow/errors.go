package uow

import (
	"errors"
	"fmt"

	"github.com/bentoevents/bento/internal/dberr"
	"github.com/bentoevents/bento/outbox"
)

var (
	// ErrInvalidConfig is returned by New for a bad configuration; the
	// message names every bad field.
	ErrInvalidConfig = errors.New("uow: invalid config")
	// ErrConcurrencyConflict is returned when an aggregate changed (or was
	// created) in the database since it was loaded. Nothing was written;
	// reload and try again, or let Manager.Run do it.
	ErrConcurrencyConflict = errors.New("uow: concurrency conflict")
	// ErrNotFound is returned by Get when no aggregate has the id.
	ErrNotFound = errors.New("uow: aggregate not found")
	// ErrInvalidAggregate is returned for an aggregate that cannot be saved:
	// nil, an empty or over-long id, or a malformed AggregateType.
	ErrInvalidAggregate = errors.New("uow: invalid aggregate")
	// ErrDone is returned when a unit that was already committed or rolled
	// back is used again.
	ErrDone = errors.New("uow: unit of work already committed or rolled back")
	// ErrClosed is outbox.ErrClosed, for callers that only import uow: the
	// database handle has been closed.
	ErrClosed = outbox.ErrClosed

	// ErrInvalidEvent is outbox.ErrInvalidEvent, for callers that only
	// import uow: an event with a malformed type name or a payload that does
	// not encode as JSON.
	ErrInvalidEvent = outbox.ErrInvalidEvent
	// ErrPayloadTooLarge is outbox.ErrPayloadTooLarge.
	ErrPayloadTooLarge = outbox.ErrPayloadTooLarge
	// ErrMetadataTooLarge is outbox.ErrMetadataTooLarge.
	ErrMetadataTooLarge = outbox.ErrMetadataTooLarge
)

// wrapDB wraps a database error with op, adding ErrClosed for a closed handle
// and ErrConcurrencyConflict for a serialization failure.
func wrapDB(op string, err error) error {
	switch {
	case !dberr.IsClosed(err) && dberr.IsSerializationFailure(err):
		return fmt.Errorf("uow: %s: %w: %w", op, ErrConcurrencyConflict, err)
	default:
		return dberr.Wrap("uow: "+op, err)
	}
}
