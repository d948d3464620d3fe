package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bentoevents/bento/outbox"
)

// tenantStats is one tenant's line of `bento stats`, and its JSON form.
type tenantStats struct {
	Tenant string `json:"tenant"`
	// Counts has every status but sent, zero included.
	Counts map[outbox.Status]int64 `json:"counts"`
	// Pending counts new, publishing and failed rows.
	Pending int64 `json:"pending"`
	// OldestPendingAt is the created_at of the oldest pending row.
	OldestPendingAt *time.Time `json:"oldest_pending_at,omitempty"`
	// OldestPendingAgeSeconds is how long that row has waited.
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	Dead                    int64   `json:"dead"`
	// PublishedLastMinute and FailedLastMinute are the relay's rate.
	PublishedLastMinute int64 `json:"published_last_minute"`
	FailedLastMinute    int64 `json:"failed_last_minute"`
}

// statsReport is the JSON document of `bento stats --json`.
type statsReport struct {
	At      time.Time     `json:"at"`
	Tenants []tenantStats `json:"tenants"`
	// Projectors are the listening projectors registered on PostgreSQL.
	Projectors []projectorState `json:"projectors"`
}

// projectorState is one registered projector.
type projectorState struct {
	WorkerID string `json:"worker_id"`
	// State is "idle" (asleep, woken by commits) or "busy" (working
	// through a backlog).
	State string    `json:"state"`
	Since time.Time `json:"since"`
}

func (c *cli) stats(ctx context.Context, args []string) error {
	fs := c.newFlags("stats", "[--tenant T] [--json]")
	tenant := fs.String("tenant", "", "only this tenant")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	st, done, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer done()
	rep, err := collectStats(ctx, st, *tenant)
	if err != nil {
		return err
	}
	if *asJSON {
		return c.printJSON(rep)
	}
	return printStats(c, rep, *tenant)
}

// collectStats builds the report from the store's Breakdown and Recent.
func collectStats(ctx context.Context, st *outbox.Store, tenant string) (*statsReport, error) {
	opts := &outbox.StatsOpts{Tenant: tenant}
	groups, err := st.Breakdown(ctx, opts)
	if err != nil {
		return nil, err
	}
	recent, err := st.Recent(ctx, time.Minute, opts)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	byTenant := map[string]*tenantStats{}
	get := func(name string) *tenantStats {
		t := byTenant[name]
		if t == nil {
			t = &tenantStats{Tenant: name, Counts: map[outbox.Status]int64{}}
			for _, s := range outbox.UnsentStatuses {
				t.Counts[s] = 0
			}
			byTenant[name] = t
		}
		return t
	}
	for _, g := range groups {
		t := get(g.Tenant)
		t.Counts[g.Status] += g.Count
		switch {
		case g.Status.Pending():
			t.Pending += g.Count
			if t.OldestPendingAt == nil || g.Oldest.Before(*t.OldestPendingAt) {
				oldest := g.Oldest
				t.OldestPendingAt = &oldest
			}
		case g.Status == outbox.StatusDead:
			t.Dead += g.Count
		}
	}
	for _, r := range recent {
		t := get(r.Tenant)
		t.PublishedLastMinute, t.FailedLastMinute = r.Published, r.Failed
	}
	relays, err := st.Relays(ctx)
	if err != nil {
		return nil, err
	}
	rep := &statsReport{At: now, Tenants: []tenantStats{}, Projectors: []projectorState{}}
	for _, r := range relays {
		state := "busy"
		if r.Idle {
			state = "idle"
		}
		rep.Projectors = append(rep.Projectors, projectorState{WorkerID: r.WorkerID, State: state, Since: r.ChangedAt})
	}
	for _, t := range byTenant {
		if t.OldestPendingAt != nil {
			t.OldestPendingAgeSeconds = max(0, now.Sub(*t.OldestPendingAt).Seconds())
		}
		rep.Tenants = append(rep.Tenants, *t)
	}
	sort.Slice(rep.Tenants, func(i, j int) bool { return rep.Tenants[i].Tenant < rep.Tenants[j].Tenant })
	return rep, nil
}

// printStats prints one aligned table with a line per tenant (its counts per
// status, the oldest pending age and the last minute's rate), then the
// registered projectors. tenant is the one the report is narrowed to, if
// any.
func printStats(c *cli, rep *statsReport, tenant string) error {
	if err := printTenants(c, rep, tenant); err != nil {
		return err
	}
	if len(rep.Projectors) == 0 {
		return nil
	}
	fmt.Fprintln(c.stdout)
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECTOR\tSTATE\tSINCE")
	for _, p := range rep.Projectors {
		fmt.Fprintf(tw, "%s\t%s\t%s ago\n", p.WorkerID, p.State, humanAge(rep.At.Sub(p.Since)))
	}
	return tw.Flush()
}

// nothingPending says what `bento stats` knows when no tenant has a row to
// show: no row (of tenant, if given) is pending or dead, and none was
// published or failed in the last minute. Sent rows are not counted (their
// number grows without bound), so the outbox may well hold many.
func nothingPending(tenant string) string {
	of := ""
	if tenant != "" {
		of = " for tenant " + tenant
	}
	return "nothing pending or dead" + of + "; nothing published or failed in the last minute (sent rows are not counted)"
}

// printTenants prints the per-tenant table.
func printTenants(c *cli, rep *statsReport, tenant string) error {
	if len(rep.Tenants) == 0 {
		fmt.Fprintln(c.stdout, nothingPending(tenant))
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "TENANT\t")
	for _, s := range outbox.UnsentStatuses {
		fmt.Fprintf(tw, "%s\t", strings.ToUpper(string(s)))
	}
	fmt.Fprintln(tw, "OLDEST PENDING\tPUBLISHED/MIN\tFAILED/MIN\t")
	for _, t := range rep.Tenants {
		fmt.Fprintf(tw, "%s\t", t.Tenant)
		for _, s := range outbox.UnsentStatuses {
			fmt.Fprintf(tw, "%d\t", t.Counts[s])
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t\n", humanAge(time.Duration(t.OldestPendingAgeSeconds*float64(time.Second))),
			t.PublishedLastMinute, t.FailedLastMinute)
	}
	return tw.Flush()
}
