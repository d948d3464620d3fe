// Package uow provides the unit of work: one database transaction in which
// the aggregates you change are saved and the events they recorded are written
// to the outbox, so that state and events commit together or not at all.
//
// # Use
//
// Create a [Manager] once, then run each command in [Manager.Run]:
//
//	units, err := uow.New(db, nil)
//	// ...
//	err = units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
//		order, err := uow.Get[Order](ctx, u, id) // loads and tracks
//		if err != nil {
//			return err
//		}
//		return order.Pay() // records OrderPaid
//	})
//
// Run begins a transaction, calls the function, and commits: every tracked
// aggregate is saved with an optimistic version check and one outbox_events
// row is inserted per pending event. On PostgreSQL the outbox insert notifies
// projectors (pg_notify) when the transaction commits. A function error, a
// panic or a failed commit rolls everything back, and the aggregates keep
// their pending events.
//
// New aggregates enter a unit with [UnitOfWork.Add]; aggregates loaded
// elsewhere with [UnitOfWork.Save]; [Get] loads and tracks in one step.
//
// [Manager.Begin] gives the same unit without the helper, for code that wants
// to call [UnitOfWork.Commit] and [UnitOfWork.Rollback] itself.
//
// # Optimistic concurrency
//
// An aggregate's stored version must still be the version it was loaded at
// when it is saved. If another unit changed it first, Commit returns an error
// wrapping [ErrConcurrencyConflict] and writes nothing. Run retries such
// conflicts (Config.MaxAttempts), calling the function again so it reloads
// the aggregate.
//
// # Transactions in the context
//
// The function passed to Run receives a context that carries the transaction;
// [TxFromContext] and [DB] give it to repositories and queries of your own,
// which then commit or roll back with the unit. A unit begun under a context
// that already carries a transaction (an inbox handler's, or one from
// [ContextWithTx]) joins it through a savepoint: its Commit releases the
// savepoint and never commits the caller's transaction, and its Rollback
// undoes only its own work. [Manager.RunTx] is the explicit form.
//
// # Tracing
//
// [UnitOfWork.Commit] runs in a "bento.uow.commit" OpenTelemetry span, a
// child of the span in its context, and writes that span's W3C trace context
// into the traceparent (and tracestate) metadata of every event it commits.
// The projector and the inbox continue the trace from there, so one trace
// shows request, commit, publish and consume. Config.TracerProvider and
// Config.Propagator choose the tracer and the format; by default the global
// tracer provider is used, which is a no-op until the application installs
// one, and nothing is written for a context without a span.
//
// # Tenants
//
// Every outbox row carries a tenant id: the one given in [BeginOpts], else the
// one in the context (tenant.With), else Config.Tenant, else "default".
package uow
