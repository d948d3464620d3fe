package aggregate

import "time"

// Event is a domain event: a plain struct describing a fact, named in the past
// tense. EventType returns the event's wire name, such as "order.paid"; it is
// the topic the event is published under and must be a constant for the type.
type Event interface {
	EventType() string
}

// Versioned is implemented by events whose payload schema has evolved.
// SchemaVersion returns the version of the type's JSON shape; events that do
// not implement Versioned are schema version 1.
type Versioned interface {
	SchemaVersion() int
}

// SchemaVersionOf returns e's schema version: e.SchemaVersion() when e
// implements [Versioned], otherwise 1.
func SchemaVersionOf(e Event) int {
	if v, ok := e.(Versioned); ok {
		return v.SchemaVersion()
	}
	return 1
}

// Recorded is an event as recorded by an aggregate, stamped with everything
// the outbox needs to know about it.
type Recorded struct {
	// ID is the event's ULID. It becomes the outbox row id and the message id
	// on the wire.
	ID string
	// Event is the domain event itself.
	Event Event
	// AggregateID is the id of the aggregate that recorded the event.
	AggregateID string
	// AggregateVersion is the aggregate version this event produced.
	AggregateVersion int64
	// OccurredAt is when the event was recorded, in UTC.
	OccurredAt time.Time
}

// Topic returns the event's type name, the topic it is published under.
func (r Recorded) Topic() string { return r.Event.EventType() }
