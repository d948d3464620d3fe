package uow

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/dberr"
	"github.com/bentoevents/bento/internal/tracing"
	"github.com/bentoevents/bento/internal/txn"
	"github.com/bentoevents/bento/internal/wire"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
)

var savepointSeq atomic.Uint64

// UnitOfWork is one database transaction (or, when joined, one savepoint in
// the caller's transaction) plus the aggregates tracked in it. It is not safe
// for concurrent use.
type UnitOfWork struct {
	m         *Manager
	tx        *gorm.DB
	scope     *txScope // the transaction as contexts carry it: the caller's when joined
	savepoint string   // set when the unit joined a caller's transaction
	tenant    string
	tracked   []aggregate.Root
	seen      map[aggregate.Root]bool
	done      bool
}

// Tenant returns the unit's tenant id.
func (u *UnitOfWork) Tenant() string { return u.tenant }

// Joined reports whether the unit joined a caller's transaction.
func (u *UnitOfWork) Joined() bool { return u.savepoint != "" }

// Tx returns the unit's transaction bound to ctx, for queries of your own
// that must commit or roll back with the unit.
func (u *UnitOfWork) Tx(ctx context.Context) *gorm.DB { return u.tx.WithContext(ctx) }

// Context returns a copy of ctx carrying the unit's transaction and tenant,
// for code that finds them with TxFromContext, DB and tenant.From.
func (u *UnitOfWork) Context(ctx context.Context) context.Context {
	return tenant.With(withScope(ctx, u.scope), u.tenant)
}

// Track adds aggregates to the unit: at Commit each is saved and its pending
// events are written to the outbox. A new aggregate (PersistedVersion 0) is
// inserted; one loaded from the database is updated if its stored version is
// still PersistedVersion. Tracking an aggregate twice is harmless. Get tracks
// what it loads.
//
// Errors: ErrInvalidAggregate for a nil aggregate, ErrDone.
func (u *UnitOfWork) Track(roots ...aggregate.Root) error {
	if u.done {
		return ErrDone
	}
	for _, r := range roots {
		if r == nil || r.AggregateBase() == nil {
			return fmt.Errorf("%w: nil aggregate", ErrInvalidAggregate)
		}
		if !u.seen[r] {
			u.seen[r] = true
			u.tracked = append(u.tracked, r)
		}
	}
	return nil
}

// Commit saves every tracked aggregate, writes their pending events to the
// outbox and commits the transaction (or, in a joined unit, releases the
// savepoint). Everything is validated before anything is written.
//
// When Commit returns nil the aggregates' pending events have been pulled and
// their versions are the stored ones. When it returns an error nothing was
// written, the transaction (or savepoint) was rolled back, and the aggregates
// still hold their pending events and versions, so the caller can inspect or
// retry them.
//
// Commit runs in a "bento.uow.commit" span, a child of the span in ctx (see
// Config.TracerProvider). When that span has a valid context, every event
// written gets it as its traceparent (and tracestate) metadata, so the
// projector's publish span and the consumer's span continue the caller's
// trace; a traceparent set with outbox.WithMetadata is kept instead. Without
// a tracer or a span in ctx nothing is written.
//
// Errors: ErrConcurrencyConflict; ErrInvalidAggregate; outbox validation
// errors (ErrInvalidEvent, ErrPayloadTooLarge, ErrMetadataTooLarge,
// tenant.ErrInvalid) and
// outbox.ErrDuplicateKey; ErrDone; ErrClosed; or the database error.
func (u *UnitOfWork) Commit(ctx context.Context) (err error) {
	if u.done {
		return ErrDone
	}
	u.done = true
	ctx, span := u.m.tracing.Start(ctx, tracing.SpanCommit, trace.SpanKindInternal)
	events := 0
	defer func() {
		if span.IsRecording() {
			span.SetAttributes(tracing.AttrTenant.String(u.tenant), tracing.AttrJoined.Bool(u.Joined()),
				tracing.AttrEvents.Int(events))
		}
		tracing.End(span, err)
	}()
	bumped, err := u.flush(ctx)
	if err != nil {
		u.restore(bumped)
		if rbErr := u.rollback(ctx); rbErr != nil && !dberr.IsClosed(rbErr) {
			return errors.Join(err, rbErr)
		}
		return err
	}
	if u.Joined() {
		err = u.tx.WithContext(ctx).Exec("RELEASE SAVEPOINT " + u.savepoint).Error
	} else {
		err = txn.Commit(u.tx)
	}
	if err != nil {
		u.restore(bumped)
		if u.Joined() {
			_ = u.rollback(ctx)
		}
		return wrapDB("commit", err)
	}
	for _, r := range u.tracked {
		pulled := r.AggregateBase().PullEvents()
		events += len(pulled)
		if u.m.enqueued != nil {
			for _, ev := range pulled {
				u.m.enqueued.WithLabelValues(ev.Topic()).Inc()
			}
		}
	}
	if hook := u.m.cfg.AfterCommit; hook != nil && events > 0 {
		if u.Joined() {
			n := events
			u.scope.add(func() { hook(n) }) // runs when the owner of the transaction commits
		} else {
			hook(events)
		}
	}
	if !u.Joined() {
		u.scope.run() // the hooks of the units that joined this one
	}
	return nil
}

// Rollback discards the unit's work: the transaction is rolled back (or, in a
// joined unit, the savepoint). Tracked aggregates keep their pending events.
// It returns ErrDone if the unit has already ended, so it is safe to defer.
func (u *UnitOfWork) Rollback() error {
	if u.done {
		return ErrDone
	}
	u.done = true
	return u.rollback(context.Background())
}

func (u *UnitOfWork) rollback(ctx context.Context) error {
	var err error
	if u.Joined() {
		err = u.tx.WithContext(ctx).RollbackTo(u.savepoint).Error
		if err == nil {
			err = u.tx.WithContext(ctx).Exec("RELEASE SAVEPOINT " + u.savepoint).Error
		}
	} else {
		err = u.tx.Rollback().Error
	}
	if err != nil {
		return wrapDB("rollback", err)
	}
	return nil
}

// bump records an aggregate whose version flush advanced without an event,
// so a failed commit can put it back.
type bump struct {
	base    *aggregate.Base
	version int64
}

func (u *UnitOfWork) restore(bumped []bump) {
	for _, b := range bumped {
		b.base.Version = b.version
	}
}

// flush validates the tracked aggregates and their events, then saves the
// aggregates and inserts the outbox rows.
func (u *UnitOfWork) flush(ctx context.Context) ([]bump, error) {
	var msgs []*outbox.Message
	for _, r := range u.tracked {
		ms, err := u.messages(r)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, ms...)
	}
	store := u.m.store
	if len(msgs) > 0 {
		ctx = u.traceMetadata(ctx)
		if err := store.Prepare(ctx, msgs); err != nil {
			return nil, fmt.Errorf("uow: commit: %w", err)
		}
	}
	var bumped []bump
	for _, r := range u.tracked {
		b := r.AggregateBase()
		expected := b.PersistedVersion()
		if len(b.PendingEvents()) == 0 {
			// A change without events still advances the version, so that
			// concurrent writers conflict instead of losing an update.
			bumped = append(bumped, bump{base: b, version: b.Version})
			b.Version++
		}
		if err := u.save(ctx, r, expected); err != nil {
			return bumped, err
		}
	}
	if len(msgs) > 0 {
		if err := store.Insert(ctx, u.tx, msgs); err != nil {
			return bumped, fmt.Errorf("uow: commit: %w", err)
		}
		if hook := u.m.cfg.BeforeCommit; hook != nil {
			if err := hook(ctx, u.tx.WithContext(ctx), msgs); err != nil {
				return bumped, fmt.Errorf("uow: commit: before-commit hook: %w", err)
			}
		}
	}
	return bumped, nil
}

// traceMetadata returns ctx carrying, as outbox metadata, the trace context
// of the span in ctx (the commit span), so that Prepare writes it into every
// event. A traceparent already in ctx's metadata (outbox.WithMetadata) is
// the caller's choice and is kept.
func (u *UnitOfWork) traceMetadata(ctx context.Context) context.Context {
	if _, set := outbox.MetadataFrom(ctx)[wire.Traceparent]; set {
		return ctx
	}
	if md := u.m.tracing.Inject(ctx, nil); len(md) > 0 {
		return outbox.WithMetadata(ctx, md)
	}
	return ctx
}

// messages turns r's pending events into outbox rows, checking r itself.
func (u *UnitOfWork) messages(r aggregate.Root) ([]*outbox.Message, error) {
	b := r.AggregateBase()
	typ := r.AggregateType()
	if err := outbox.ValidateAggregateType(typ); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidAggregate, err)
	}
	if b.ID == "" {
		return nil, fmt.Errorf("%w: %s has an empty id", ErrInvalidAggregate, typ)
	}
	if len(b.ID) > outbox.MaxAggregateIDLen {
		return nil, fmt.Errorf("%w: %s id is longer than %d bytes", ErrInvalidAggregate, typ, outbox.MaxAggregateIDLen)
	}
	pending := b.PendingEvents()
	msgs := make([]*outbox.Message, 0, len(pending))
	for _, ev := range pending {
		if ev.Event == nil {
			return nil, fmt.Errorf("uow: commit: %w: nil event recorded by %s %s", ErrInvalidEvent, typ, b.ID)
		}
		topic := ev.Event.EventType()
		if ev.AggregateID != b.ID {
			return nil, fmt.Errorf("uow: commit: %w: event v%d (%s) was recorded by %s %q, not %q: set the id before recording",
				ErrInvalidEvent, ev.AggregateVersion, topic, typ, ev.AggregateID, b.ID)
		}
		payload, err := outbox.EncodePayload(ev.Event)
		if err != nil {
			return nil, fmt.Errorf("uow: commit: event v%d (%s) of %s %s: %w", ev.AggregateVersion, topic, typ, b.ID, err)
		}
		var md outbox.Metadata
		if u.m.cfg.Producer != "" {
			md = outbox.Metadata{wire.Producer: u.m.cfg.Producer}
		}
		msgs = append(msgs, &outbox.Message{ // the store stamps ID and OccurredAt
			TenantID:         u.tenant,
			Topic:            topic,
			AggregateType:    typ,
			AggregateID:      b.ID,
			AggregateVersion: ev.AggregateVersion,
			SchemaVersion:    aggregate.SchemaVersionOf(ev.Event),
			Payload:          payload,
			Metadata:         md,
		})
	}
	return msgs, nil
}

// save inserts a new aggregate (expected 0) or updates a loaded one whose
// stored version must still be expected.
func (u *UnitOfWork) save(ctx context.Context, r aggregate.Root, expected int64) error {
	b := r.AggregateBase()
	if b.Version <= expected {
		// flush bumps event-less aggregates, so this cannot happen; keep the
		// check so a bug can never write an unchecked version.
		return fmt.Errorf("uow: internal error: %s %s has no new version", r.AggregateType(), b.ID)
	}
	db := u.tx.WithContext(ctx)
	if expected == 0 {
		res := db.Create(r)
		if res.Error != nil {
			if dberr.IsUniqueViolation(res.Error) {
				return fmt.Errorf("%w: %s %s already exists", ErrConcurrencyConflict, r.AggregateType(), b.ID)
			}
			return wrapDB(fmt.Sprintf("insert %s %s", r.AggregateType(), b.ID), res.Error)
		}
		return nil
	}
	res := db.Model(r).Where("version = ?", expected).Select("*").Updates(r)
	if res.Error != nil {
		return wrapDB(fmt.Sprintf("update %s %s", r.AggregateType(), b.ID), res.Error)
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("%w: %s %s is no longer at version %d", ErrConcurrencyConflict, r.AggregateType(), b.ID, expected)
	}
	return nil
}

// Schedule writes, in the unit's transaction, a message to be relayed when
// due (see outbox.Store.Schedule): it commits with the unit and is
// dropped with it. The message is in the unit's tenant unless opts says
// otherwise, and carries the metadata ctx does (outbox.WithMetadata).
//
// Errors: ErrDone, and those of outbox.Store.Schedule.
func (u *UnitOfWork) Schedule(ctx context.Context, topic string, payload any, due outbox.Due, opts *outbox.ScheduleOpts) (*outbox.ScheduledMessage, error) {
	if u.done {
		return nil, ErrDone
	}
	return u.m.store.Schedule(tenant.With(ctx, u.tenant), u.tx, topic, payload, due, opts)
}

// Cancel deletes, in the unit's transaction, the messages of the unit's
// tenant scheduled under key and still waiting (see outbox.Store.Cancel):
// once the unit commits none of them is delivered; if it rolls back, the
// cancel never happened.
//
// Errors: ErrDone; outbox.ErrCancelTooLate when every message of the key
// was already released for delivery; outbox.ErrNotScheduled when none has
// the key; and the others of outbox.Store.Cancel.
func (u *UnitOfWork) Cancel(ctx context.Context, key string) (int64, error) {
	if u.done {
		return 0, ErrDone
	}
	return u.m.store.Cancel(ctx, u.tx, key, &outbox.CancelOpts{Tenant: u.tenant})
}
