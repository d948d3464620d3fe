// Package aggregate gives domain aggregates the ability to record what
// happened to them as domain events.
//
// Embed [Base] in a GORM model and give the type an AggregateType method; the
// aggregate's methods validate a change, apply it, and call [Base.Record] with
// a past-tense event such as OrderPaid. Recording never touches the database:
// the events stay pending on the aggregate until a unit of work (package uow)
// commits the aggregate and its events in one transaction, and only then are
// they pulled off the aggregate.
//
// # Events
//
// An event is a plain Go struct that names itself with EventType; the name is
// the event's wire identity and the topic (and RabbitMQ routing key) it is
// published under:
//
//	type OrderPaid struct {
//		OrderID     string `json:"order_id"`
//		AmountCents int64  `json:"amount_cents"`
//	}
//
//	func (OrderPaid) EventType() string { return "order.paid" }
//
// An event may also implement [Versioned] to declare its schema version.
//
// # Versions
//
// [Base.Version] counts the changes made to an aggregate. Every recorded event
// advances it by one and carries the version it produced, so the events of one
// aggregate are numbered 1, 2, 3, ... in the order they happened. The version
// the aggregate had when it was loaded is Version minus the number of pending
// events; the unit of work uses it for its optimistic concurrency check.
//
// # Ids and times
//
// Domain code records only what happened. The unit of work stamps each event
// with a ULID event id and an occurred-at time when it writes the event, from
// its [Clock] ([SystemClock] unless configured: the system clock and
// [NewIDAt], strictly monotonic within a process, so the ids of one
// aggregate's events sort in version order). Tests give the unit of work a
// fake clock; the aggregates need none.
package aggregate
