package console

import (
	"net/http"
	"slices"
	"sort"
	"time"

	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
)

// overviewData is the content of the overview page.
type overviewData struct {
	// Tenant is the tenant the figures are narrowed to ("" for all).
	Tenant string
	// Tenants lists the tenants with rows, for the filter; nil when the
	// console is locked to one tenant.
	Tenants  []string
	Statuses []outbox.Status
	Counts   []statusCount
	Total    int64
	Pending  int64
	// OldestPendingAt and OldestPendingAge are zero when nothing is pending.
	OldestPendingAt  time.Time
	OldestPendingAge time.Duration
	ByTopic          []backlogRow
	// ByTenant is shown when the figures span every tenant.
	ByTenant []backlogRow
	Chart    *chart
}

type statusCount struct {
	Status outbox.Status
	Count  int64
}

// backlogRow is one topic's (or tenant's) row counts, in UnsentStatuses order.
type backlogRow struct {
	Name   string
	Counts []int64
	Total  int64
	// OldestPendingAt is the created_at of its oldest pending row; zero when
	// none is pending.
	OldestPendingAt  time.Time
	OldestPendingAge time.Duration
}

// tenantParam returns the tenant the request is narrowed to: the console's
// own tenant when it is locked to one, else the "tenant" query parameter.
// It answers 400 and returns false for an invalid tenant id.
func (c *Console) tenantParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	if c.cfg.Tenant != "" {
		return c.cfg.Tenant, true
	}
	t := r.URL.Query().Get("tenant")
	if t == "" {
		return "", true
	}
	if err := tenant.Validate(t); err != nil {
		c.renderError(w, r, http.StatusBadRequest, "Bad tenant filter: "+err.Error())
		return "", false
	}
	return t, true
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	t, ok := c.tenantParam(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	st, err := c.data.stats(ctx, t)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	groups, err := c.data.breakdown(ctx, t)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	activity, err := c.data.activity(ctx, ChartMinutes, t)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := &overviewData{
		Tenant: t, Statuses: outbox.UnsentStatuses, Pending: st.Pending,
		OldestPendingAt: st.OldestPendingAt, OldestPendingAge: st.OldestPendingAge,
		Chart: newChart(activity),
	}
	for _, s := range outbox.UnsentStatuses {
		d.Counts = append(d.Counts, statusCount{Status: s, Count: st.Counts[s]})
		d.Total += st.Counts[s]
	}
	now := c.data.now()
	d.ByTopic = backlog(groups, func(g outbox.Group) string { return g.Topic }, now)
	if t == "" {
		d.ByTenant = backlog(groups, func(g outbox.Group) string { return g.Tenant }, now)
	}
	if c.cfg.Tenant == "" {
		d.Tenants = tenantsOf(groups)
		if t != "" && !slices.Contains(d.Tenants, t) {
			d.Tenants = append(d.Tenants, t)
			sort.Strings(d.Tenants)
		}
	}
	p := c.newPage(w, r, "overview", "Overview", d)
	p.Refresh = int(c.cfg.Refresh / time.Second)
	c.render(w, r, http.StatusOK, "overview", p)
}

// backlog sums groups by key into rows ordered by key.
func backlog(groups []outbox.Group, key func(outbox.Group) string, now time.Time) []backlogRow {
	idx := map[string]int{}
	var rows []backlogRow
	for _, g := range groups {
		k := key(g)
		i, ok := idx[k]
		if !ok {
			i = len(rows)
			idx[k] = i
			rows = append(rows, backlogRow{Name: k, Counts: make([]int64, len(outbox.UnsentStatuses))})
		}
		row := &rows[i]
		if si := slices.Index(outbox.UnsentStatuses, g.Status); si >= 0 {
			row.Counts[si] += g.Count
		}
		row.Total += g.Count
		if g.Status.Pending() && (row.OldestPendingAt.IsZero() || g.Oldest.Before(row.OldestPendingAt)) {
			row.OldestPendingAt = g.Oldest
		}
	}
	for i := range rows {
		if !rows[i].OldestPendingAt.IsZero() {
			rows[i].OldestPendingAge = max(now.Sub(rows[i].OldestPendingAt), 0)
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Name < rows[j].Name })
	return rows
}

func tenantsOf(groups []outbox.Group) []string {
	seen := map[string]bool{}
	var out []string
	for _, g := range groups {
		if !seen[g.Tenant] {
			seen[g.Tenant] = true
			out = append(out, g.Tenant)
		}
	}
	sort.Strings(out)
	return out
}
