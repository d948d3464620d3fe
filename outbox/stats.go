package outbox

import (
	"context"
	"fmt"
	"sort"
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

// Group is the number of rows of one tenant, topic and status, and the
// created_at of the oldest of them. [Store.Breakdown] returns them; the CLI
// and the console sum them by tenant and status or by topic and status.
type Group struct {
	Tenant string
	Topic  string
	Status Status
	Count  int64
	// Oldest is the created_at of the oldest row in the group (UTC).
	Oldest time.Time
}

// Breakdown counts the rows that are not sent by tenant, topic and status,
// with the created_at of the oldest of each, ordered by tenant, topic and
// the state-machine order of UnsentStatuses. opts.Tenant narrows it to one
// tenant. It is one statement, so one snapshot, and it reads only the index
// of rows that are not sent: its cost follows the backlog and the dead rows,
// never the number of sent rows.
func (s *Store) Breakdown(ctx context.Context, opts *StatsOpts) ([]Group, error) {
	tenant := ""
	if opts != nil {
		tenant = opts.Tenant
	}
	var rows []struct {
		TenantID string
		Topic    string
		Status   Status
		N        int64
		Oldest   string
	}
	query := breakdownSQL(s.dialect, tenant != "")
	err := s.db.WithContext(ctx).Raw(query, bind(query, map[string]any{"tenant": tenant})...).Scan(&rows).Error
	if err != nil {
		return nil, wrapDB("outbox: breakdown", err)
	}
	out := make([]Group, 0, len(rows))
	for _, r := range rows {
		t, err := parseDBTime(r.Oldest)
		if err != nil {
			return nil, fmt.Errorf("outbox: breakdown: oldest of %s/%s/%s: %w", r.TenantID, r.Topic, r.Status, err)
		}
		out = append(out, Group{Tenant: r.TenantID, Topic: r.Topic, Status: r.Status, Count: r.N, Oldest: t})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Tenant != b.Tenant {
			return a.Tenant < b.Tenant
		}
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		return rank(a.Status) < rank(b.Status)
	})
	return out, nil
}

// rank orders statuses as Statuses lists them, unknown ones last.
func rank(s Status) int {
	if i := s.Index(); i >= 0 {
		return i
	}
	return len(Statuses)
}

// parseDBTime parses a timestamp as PostgreSQL's to_char above or the SQLite
// driver writes it.
func parseDBTime(s string) (time.Time, error) {
	for _, layout := range []string{
		time.RFC3339Nano,
		"2006-01-02 15:04:05.999999999-07:00",
		"2006-01-02 15:04:05.999999999",
		"2006-01-02T15:04:05.999999999",
	} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("unrecognised timestamp %q", s)
}

// Minute is one minute of relay activity.
type Minute struct {
	// Start is the first instant of the minute (UTC).
	Start time.Time
	// Published counts rows confirmed by the broker in the minute (rows
	// still in the table: a projector that deletes sent rows, or a purge,
	// removes them from this count).
	Published int64
	// Failed counts rows whose last failed attempt (or expired lease) fell
	// in the minute; a row that failed several times counts once, at its
	// latest failure.
	Failed int64
}

// Activity returns one Minute per minute of the last `minutes` minutes up to
// and including the current one, oldest first, with zero counts where
// nothing happened. opts.Tenant narrows it to one tenant.
func (s *Store) Activity(ctx context.Context, minutes int, opts *StatsOpts) ([]Minute, error) {
	if minutes < 1 || minutes > 24*60 {
		return nil, fmt.Errorf("outbox: activity: %w: %d minutes (want 1 to 1440)", ErrInvalidArgument, minutes)
	}
	now := s.cfg.Clock.Now().UTC()
	first := now.Truncate(time.Minute).Add(-time.Duration(minutes-1) * time.Minute)
	out := make([]Minute, minutes)
	for i := range out {
		out[i].Start = first.Add(time.Duration(i) * time.Minute)
	}
	byTenant, args := sinceArgs(first, opts)
	count := func(tl timeline, set func(*Minute, int64)) error {
		var rows []struct {
			Bucket int64
			N      int64
		}
		if err := s.db.WithContext(ctx).Raw(activitySQL(s.dialect, tl, byTenant), args).Scan(&rows).Error; err != nil {
			return wrapDB("outbox: activity", err)
		}
		base := first.Unix() / 60
		for _, r := range rows {
			if i := r.Bucket - base; i >= 0 && i < int64(minutes) {
				set(&out[i], r.N)
			}
		}
		return nil
	}
	if err := count(published, func(m *Minute, n int64) { m.Published = n }); err != nil {
		return nil, err
	}
	if err := count(failed, func(m *Minute, n int64) { m.Failed = n }); err != nil {
		return nil, err
	}
	return out, nil
}

// Throughput is what the relay did for one tenant in a recent window.
type Throughput struct {
	Tenant string
	// Published counts rows confirmed in the window (still in the table).
	Published int64
	// Failed counts rows whose last failure fell in the window.
	Failed int64
}

// Recent returns, per tenant with activity, the rows published and failed
// in the last window (up to now), ordered by tenant. opts.Tenant narrows it
// to one tenant.
func (s *Store) Recent(ctx context.Context, window time.Duration, opts *StatsOpts) ([]Throughput, error) {
	if window <= 0 {
		return nil, fmt.Errorf("outbox: recent: %w: window %v", ErrInvalidArgument, window)
	}
	since := s.cfg.Clock.Now().UTC().Add(-window)
	byTenant := map[string]*Throughput{}
	oneTenant, args := sinceArgs(since, opts)
	count := func(tl timeline, set func(*Throughput, int64)) error {
		var rows []struct {
			TenantID string
			N        int64
		}
		if err := s.db.WithContext(ctx).Raw(recentSQL(tl, oneTenant), args).Scan(&rows).Error; err != nil {
			return wrapDB("outbox: recent", err)
		}
		for _, r := range rows {
			t := byTenant[r.TenantID]
			if t == nil {
				t = &Throughput{Tenant: r.TenantID}
				byTenant[r.TenantID] = t
			}
			set(t, r.N)
		}
		return nil
	}
	if err := count(published, func(t *Throughput, n int64) { t.Published = n }); err != nil {
		return nil, err
	}
	if err := count(failed, func(t *Throughput, n int64) { t.Failed = n }); err != nil {
		return nil, err
	}
	out := make([]Throughput, 0, len(byTenant))
	for _, t := range byTenant {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	return out, nil
}

// sinceArgs are the bind parameters of activitySQL and recentSQL for the
// rows from t on, and whether opts narrows them to one tenant.
func sinceArgs(t time.Time, opts *StatsOpts) (byTenant bool, args map[string]any) {
	args = map[string]any{"since": t}
	if opts != nil && opts.Tenant != "" {
		args["tenant"] = opts.Tenant
		return true, args
	}
	return false, args
}
