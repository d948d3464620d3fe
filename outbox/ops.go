package outbox

import (
	"context"
	"errors"
	"maps"
)

// ErrInvalidArgument is returned by the operator calls for an argument out
// of range, such as a negative age.
var ErrInvalidArgument = errors.New("outbox: invalid argument")

// Filter selects rows for the operator calls. Empty fields match anything.
type Filter struct {
	// IDs restricts to these event ids.
	IDs []string
	// Tenant, Topic, AggregateType and AggregateID match exactly.
	Tenant        string
	Topic         string
	AggregateType string
	AggregateID   string
}

func (f Filter) empty() bool {
	return len(f.IDs) == 0 && f.Tenant == "" && f.Topic == "" && f.AggregateType == "" && f.AggregateID == ""
}

// args are the bind parameters of deadWhere(f), plus extra.
func (f Filter) args(extra map[string]any) map[string]any {
	a := map[string]any{"ids": f.IDs, "tenant": f.Tenant, "topic": f.Topic,
		"aggregate_type": f.AggregateType, "aggregate_id": f.AggregateID}
	maps.Copy(a, extra)
	return a
}

// ListDead returns up to limit dead rows matching f, oldest first, with their
// last error.
func (s *Store) ListDead(ctx context.Context, f Filter, limit int) ([]Message, error) {
	if limit < 1 {
		limit = 100
	}
	var rows []Message
	if err := s.db.WithContext(ctx).Raw(listDeadSQL(f), f.args(map[string]any{"limit": limit})).Scan(&rows).Error; err != nil {
		return nil, wrapDB("outbox: list dead", err)
	}
	return rows, nil
}

// ErrNoFilter is returned by Requeue when the filter is empty and all is
// false, so a mistake cannot requeue every dead event.
var ErrNoFilter = errors.New("outbox: filter required (or requeue all explicitly)")

// Requeue moves dead rows matching f back to new with zero attempts, ready
// at once; their last error is kept until the next attempt. An empty filter
// requeues nothing unless all is true. It returns how many rows moved.
func (s *Store) Requeue(ctx context.Context, f Filter, all bool) (int64, error) {
	if f.empty() && !all {
		return 0, ErrNoFilter
	}
	res := s.db.WithContext(ctx).Exec(requeueSQL(f), f.args(map[string]any{"now": s.clock.now()}))
	if res.Error != nil {
		return 0, wrapDB("outbox: requeue", res.Error)
	}
	return res.RowsAffected, nil
}

// CountDead counts the dead rows matching f (an empty filter counts them
// all): what Requeue or Discard with the same filter would move.
func (s *Store) CountDead(ctx context.Context, f Filter) (int64, error) {
	var n int64
	query := countDeadSQL(f)
	if err := s.db.WithContext(ctx).Raw(query, bind(query, f.args(nil))...).Scan(&n).Error; err != nil {
		return 0, wrapDB("outbox: count dead", err)
	}
	return n, nil
}

// Discard deletes the dead rows matching f and returns how many it deleted.
// Their events are gone for good: use it for events nobody must receive,
// after reading them with ListDead. An empty filter deletes nothing unless
// all is true ([ErrNoFilter]). Later events of a discarded event's
// aggregate are no longer held back.
func (s *Store) Discard(ctx context.Context, f Filter, all bool) (int64, error) {
	if f.empty() && !all {
		return 0, ErrNoFilter
	}
	// The deleted rows' aggregates come back (RETURNING), so the next held
	// event of each is released in the same transaction.
	n, err := s.leaveTx(ctx, discardSQL(f), f.args(nil))
	if err != nil {
		return 0, wrapDB("outbox: discard", err)
	}
	return n, nil
}

// Get returns the row with id, or gorm.ErrRecordNotFound (wrapped).
func (s *Store) Get(ctx context.Context, id string) (*Message, error) {
	var m Message
	if err := s.db.WithContext(ctx).Raw(getSQL, map[string]any{"id": id}).Take(&m).Error; err != nil {
		return nil, wrapDB("outbox: get", err)
	}
	return &m, nil
}
