package aggregate

// Root is what a unit of work needs from an aggregate. A type satisfies it by
// embedding [Base] (which provides AggregateBase) and declaring its type name:
//
//	type Order struct {
//		aggregate.Base
//		Status string
//	}
//
//	func (*Order) AggregateType() string { return "order" }
type Root interface {
	// AggregateType names the kind of aggregate, such as "order". It is
	// stored on every outbox row and must be constant for the type.
	AggregateType() string
	// AggregateBase returns the embedded Base.
	AggregateBase() *Base
}

// Base is embedded in an aggregate's GORM model. It holds the aggregate id,
// its version and the events recorded since it was loaded. Pending events are
// unexported and so never persisted by GORM.
//
// Base is not safe for concurrent use, like the aggregate that embeds it.
type Base struct {
	// ID identifies the aggregate. It is the primary key of the aggregate's
	// table; [NewID] makes a suitable one.
	ID string `gorm:"primaryKey;size:64"`
	// Version counts the changes made to the aggregate, including pending
	// ones; see the package documentation.
	Version int64 `gorm:"not null"`

	pending []Recorded
}

// AggregateBase returns b. It lets any type that embeds Base satisfy [Root].
func (b *Base) AggregateBase() *Base { return b }

// Record appends e to the aggregate's pending events, advancing Version by one
// and noting the aggregate id and the new version. Call it from the
// aggregate's own methods after the change has been validated and applied.
// Record only records what happened: the unit of work gives the event its id
// and occurred-at time when it writes it, from its clock.
//
// Record does not validate e; a unit of work rejects a malformed event (empty
// or invalid type name, payload that does not encode) at commit, writing
// nothing and leaving the event pending.
func (b *Base) Record(e Event) {
	b.Version++
	b.pending = append(b.pending, Recorded{Event: e, AggregateID: b.ID, AggregateVersion: b.Version})
}

// PendingEvents returns a copy of the events recorded and not yet committed,
// in the order they were recorded.
func (b *Base) PendingEvents() []Recorded {
	return append([]Recorded(nil), b.pending...)
}

// PullEvents returns the pending events and forgets them. A unit of work calls
// it once the events are committed; aggregates rarely need to.
func (b *Base) PullEvents() []Recorded {
	p := b.pending
	b.pending = nil
	return p
}

// PersistedVersion returns the version the aggregate had before its pending
// events: the version its stored row is expected to have.
func (b *Base) PersistedVersion() int64 {
	return b.Version - int64(len(b.pending))
}
