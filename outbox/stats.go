package outbox

import (
	"context"
	"time"

	"gorm.io/gorm"
)

// Stats is a snapshot of the outbox.
type Stats struct {
	// Counts holds the number of rows in each status; every status is present.
	Counts map[Status]int64
	// Pending is the number of rows still to relay: new, publishing and failed.
	Pending int64
	// OldestPendingAt is the created_at of the oldest pending row; zero when
	// nothing is pending.
	OldestPendingAt time.Time
	// OldestPendingAge is how long the oldest pending row has waited; zero
	// when nothing is pending.
	OldestPendingAge time.Duration
}

// StatsOpts narrow [Store.Stats]. A nil *StatsOpts means all tenants.
type StatsOpts struct {
	// Tenant restricts the figures to one tenant.
	Tenant string
}

// Stats counts the outbox rows by status and finds the oldest pending one.
// Errors: ErrClosed or the database error.
func (s *Store) Stats(ctx context.Context, opts *StatsOpts) (*Stats, error) {
	q := s.db.WithContext(ctx).Model(&Message{})
	if opts != nil && opts.Tenant != "" {
		q = q.Where("tenant_id = ?", opts.Tenant)
	}
	var rows []struct {
		Status Status
		N      int64
	}
	if err := q.Session(&gorm.Session{}).Select("status, count(*) AS n").Group("status").Scan(&rows).Error; err != nil {
		return nil, wrapDB("outbox: stats", err)
	}
	st := &Stats{Counts: map[Status]int64{}}
	for _, st2 := range Statuses {
		st.Counts[st2] = 0
	}
	for _, r := range rows {
		st.Counts[r.Status] = r.N
	}
	for status, n := range st.Counts {
		if status.Pending() {
			st.Pending += n
		}
	}
	if st.Pending == 0 {
		return st, nil
	}
	var oldest Message
	err := q.Session(&gorm.Session{}).Select("created_at").
		Where("status IN ?", []Status{StatusNew, StatusPublishing, StatusFailed}).
		Order("created_at").Limit(1).Take(&oldest).Error
	if err != nil {
		return nil, wrapDB("outbox: stats oldest pending", err)
	}
	st.OldestPendingAt = oldest.CreatedAt.UTC()
	st.OldestPendingAge = s.cfg.Stamper.Now().Sub(st.OldestPendingAt)
	if st.OldestPendingAge < 0 {
		st.OldestPendingAge = 0
	}
	return st, nil
}
