package uow

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/bentoevents/bento/aggregate"
)

// Get loads the aggregate of type T with the given id within the unit's
// transaction and tracks it, so Commit saves it and writes the events its
// methods record:
//
//	order, err := uow.Get[Order](ctx, u, id)
//
// Errors: ErrNotFound (wrapped, naming the type and id), ErrDone, ErrClosed,
// or the database error.
func Get[T any, P interface {
	*T
	aggregate.Root
}](ctx context.Context, u *UnitOfWork, id string) (P, error) {
	if u.done {
		return nil, ErrDone
	}
	var v P = new(T)
	err := u.tx.WithContext(ctx).
		Where(clause.Eq{Column: clause.Column{Table: clause.CurrentTable, Name: clause.PrimaryKey}, Value: id}).
		Take(v).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, fmt.Errorf("%w: %s %q", ErrNotFound, v.AggregateType(), id)
	}
	if err != nil {
		return nil, wrapDB(fmt.Sprintf("get %s %q", v.AggregateType(), id), err)
	}
	if err := u.Track(v); err != nil {
		return nil, err
	}
	return v, nil
}

// Add tracks a new aggregate, to be inserted at Commit. It is Track with a
// check of intent: the aggregate must never have been stored
// (PersistedVersion 0), otherwise Add returns ErrInvalidAggregate. Inserting
// an id that already exists fails at Commit with ErrConcurrencyConflict.
func (u *UnitOfWork) Add(r aggregate.Root) error {
	if r != nil && r.AggregateBase() != nil && r.AggregateBase().PersistedVersion() != 0 {
		return fmt.Errorf("%w: Add of %s %s, which was loaded at version %d: use Save",
			ErrInvalidAggregate, r.AggregateType(), r.AggregateBase().ID, r.AggregateBase().PersistedVersion())
	}
	return u.Track(r)
}

// Save tracks an aggregate loaded from the database outside this unit, to be
// updated at Commit if its stored version is still PersistedVersion (else
// Commit returns ErrConcurrencyConflict). It is Track with a check of
// intent: a never-stored aggregate gets ErrInvalidAggregate (use Add).
// Aggregates loaded with Get need neither call.
func (u *UnitOfWork) Save(r aggregate.Root) error {
	if r != nil && r.AggregateBase() != nil && r.AggregateBase().PersistedVersion() == 0 {
		return fmt.Errorf("%w: Save of %s %q, which was never stored: use Add",
			ErrInvalidAggregate, r.AggregateType(), r.AggregateBase().ID)
	}
	return u.Track(r)
}
