package outbox

import (
	"context"
	"time"
)

// Stats is a snapshot of the rows of the outbox that are not sent.
type Stats struct {
	// Counts holds the number of rows in each of UnsentStatuses, zero
	// included; sent rows are not counted (see UnsentStatuses).
	Counts map[Status]int64
	// Pending is the number of rows still to relay: new, publishing and failed.
	Pending int64
	// OldestPendingAt is the created_at of the oldest pending row; zero when
	// nothing is pending.
	OldestPendingAt time.Time
	// OldestPendingAge is how long the oldest pending row has waited, by the
	// application's clock; zero when nothing is pending.
	OldestPendingAge time.Duration
}

// StatsOpts narrow [Store.Stats]. A nil *StatsOpts means all tenants.
type StatsOpts struct {
	// Tenant restricts the figures to one tenant.
	Tenant string
}

// Stats counts the rows that are not sent by status and finds the oldest
// pending one. It sums [Store.Breakdown], so its figures come from one
// statement and agree with each other however busy the relay is, and its
// cost does not grow with the number of sent rows.
// Errors: ErrClosed or the database error.
func (s *Store) Stats(ctx context.Context, opts *StatsOpts) (*Stats, error) {
	groups, err := s.Breakdown(ctx, opts)
	if err != nil {
		return nil, err
	}
	st := &Stats{Counts: make(map[Status]int64, len(UnsentStatuses))}
	for _, status := range UnsentStatuses {
		st.Counts[status] = 0
	}
	for _, g := range groups {
		st.Counts[g.Status] += g.Count
		if !g.Status.Pending() {
			continue
		}
		st.Pending += g.Count
		if st.OldestPendingAt.IsZero() || g.Oldest.Before(st.OldestPendingAt) {
			st.OldestPendingAt = g.Oldest
		}
	}
	if st.Pending > 0 {
		st.OldestPendingAge = max(s.cfg.Clock.Now().Sub(st.OldestPendingAt), 0)
	}
	return st, nil
}
