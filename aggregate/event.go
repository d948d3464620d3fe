package aggregate

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

// Recorded is an event as recorded by an aggregate: the event and the
// aggregate version it produced. Its id and occurred-at time are given by
// the unit of work that writes it; (aggregate type, AggregateID,
// AggregateVersion) identifies it before and after.
type Recorded struct {
	// Event is the domain event itself.
	Event Event
	// AggregateID is the id of the aggregate that recorded the event.
	AggregateID string
	// AggregateVersion is the aggregate version this event produced.
	AggregateVersion int64
}

// Topic returns the event's type name, the topic it is published under.
func (r Recorded) Topic() string { return r.Event.EventType() }
