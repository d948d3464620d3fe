package main

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// ClaimHeldReport is the claimheld scenario over all runs.
type ClaimHeldReport struct {
	Config claimHeldConfig `json:"config"`
	// Runs are every run's points; only the last run's keep the text of
	// their plans (the partitioned table's are long), the others their
	// planStats.
	Runs [][]claimHeldPoint `json:"runs"`
	Rows []ClaimHeldRow     `json:"medians"`
}

// ClaimHeldRow is the median over runs of one point's figures; the ratios
// compare it with the point of the same layout, shape and limit with the
// fewest held rows (the base, 0 by default).
type ClaimHeldRow struct {
	Layout    string `json:"layout"`
	Shape     string `json:"shape"`
	Held      int    `json:"held_rows"`
	DeadHeads int    `json:"dead_rows"`
	Limit     int    `json:"limit"`
	// Claims is the fewest claims a run timed at this point.
	Claims     int     `json:"claims_timed"`
	ColdMS     float64 `json:"cold_claim_ms"`
	P50        float64 `json:"claim_p50_ms"`
	P99        float64 `json:"claim_p99_ms"`
	ReleaseP50 float64 `json:"release_p50_ms"`
	P50VsBase  float64 `json:"p50_over_base"`
	P99VsBase  float64 `json:"p99_over_base"`
	ColdVsBase float64 `json:"cold_over_base"`
	// PlanStats are of the last run's plan.
	PlanStats planStats `json:"plan_stats"`
}

// claimHeldKey identifies a point across runs.
type claimHeldKey struct {
	Layout, Shape string
	Held, Limit   int
}

func (p claimHeldPoint) key() claimHeldKey {
	return claimHeldKey{p.Layout, p.Shape, p.Held, p.Limit}
}

// base is the key of the point k is compared with: the same layout, shape
// and limit, with held rows.
func (k claimHeldKey) base(held int) claimHeldKey {
	k.Held = held
	return k
}

func summarizeClaimHeld(runs [][]claimHeldPoint, cfg claimHeldConfig) *ClaimHeldReport {
	c := &ClaimHeldReport{Config: cfg}
	if len(runs) == 0 || len(cfg.Held) == 0 {
		return c
	}
	for i, run := range runs {
		if i < len(runs)-1 {
			run = slices.Clone(run)
			for j := range run {
				run[j].Plan = ""
			}
		}
		c.Runs = append(c.Runs, run)
	}
	byKey := map[claimHeldKey]int{} // index into c.Rows
	for _, first := range runs[0] {
		var cold, p50, p99, rel []float64
		var last claimHeldPoint
		claims := first.Claim.Count
		for _, run := range runs {
			for _, p := range run {
				if p.key() == first.key() {
					cold, p50, p99, rel = append(cold, p.ColdMS), append(p50, p.Claim.P50), append(p99, p.Claim.P99),
						append(rel, p.Release.P50)
					last, claims = p, min(claims, p.Claim.Count)
				}
			}
		}
		byKey[first.key()] = len(c.Rows)
		c.Rows = append(c.Rows, ClaimHeldRow{Layout: first.Layout, Shape: first.Shape, Held: first.Held,
			DeadHeads: first.DeadHeads, Limit: first.Limit, Claims: claims, ColdMS: median(cold), P50: median(p50), P99: median(p99),
			ReleaseP50: median(rel), PlanStats: last.PlanStats})
	}
	baseHeld := slices.Min(cfg.Held)
	for i, r := range c.Rows {
		j, ok := byKey[claimHeldKey{r.Layout, r.Shape, r.Held, r.Limit}.base(baseHeld)]
		if !ok {
			continue
		}
		b := c.Rows[j]
		c.Rows[i].P50VsBase, c.Rows[i].P99VsBase, c.Rows[i].ColdVsBase = ratio(r.P50, b.P50), ratio(r.P99, b.P99), ratio(r.ColdMS, b.ColdMS)
	}
	return c
}

// claimHeldMaxRatio is the target: a claim with the most held rows at most
// this many times as slow (p50) as with the fewest.
const claimHeldMaxRatio = 2

// claimHeldTargets checks, for each layout, shape and limit, the p50 with
// the most held rows against the base.
func claimHeldTargets(c *ClaimHeldReport) []Target {
	if len(c.Config.Held) < 2 {
		return nil
	}
	most, fewest := slices.Max(c.Config.Held), slices.Min(c.Config.Held)
	if most == fewest {
		return nil
	}
	var ts []Target
	for _, r := range c.Rows {
		if r.Held != most || r.P50VsBase == 0 {
			continue
		}
		ts = append(ts, Target{
			Name: fmt.Sprintf("claimheld p50 %s vs %s held (%s, %s, limit %d)", thousands(float64(most)),
				thousands(float64(fewest)), r.Layout, r.Shape, r.Limit),
			Want: fmt.Sprintf("<= %dx", claimHeldMaxRatio), Got: r.P50VsBase, Met: r.P50VsBase <= claimHeldMaxRatio,
		})
	}
	return ts
}

func printClaimHeld(w io.Writer, c *ClaimHeldReport) {
	cfg := c.Config
	fmt.Fprintf(w, "\nClaim with events held behind dead ones, beside %s ready rows of other aggregates.\n", thousands(float64(cfg.Ready)))
	fmt.Fprintf(w, "cold: the first claim on the filled table; then a Drain-like pass (claims of %d until one is empty, all released);\n",
		cfg.WarmupLimit)
	fmt.Fprintf(w, "then %d timed claims (at least %d, fewer once %v is spent), each followed by a release.\n", cfg.Claims,
		claimHeldMinClaims, cfg.Budget)
	fmt.Fprintf(w, "Shapes: one = one dead event with every held event behind it, ")
	fmt.Fprintf(w, "many = %d held events behind each dead one.\nx base: over the same column with %s held.\n", cfg.PerAggregate,
		thousands(float64(slices.Min(cfg.Held))))
	for _, layout := range cfg.Layouts {
		fmt.Fprintf(w, "\n%s table:\n", layout)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "shape\theld\tdead\tlimit\tclaims\tcold ms\tp50 ms\tp99 ms\tcold x base\tp50 x base\tp99 x base\trelease p50 ms\tplan: rows walked past\tbuffers\t")
		for _, r := range c.Rows {
			if r.Layout != layout {
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%.2f\t%.2f\t%.2f\t%s\t%s\t%s\t%.2f\t%s\t%s\t\n", r.Shape, thousands(float64(r.Held)),
				thousands(float64(r.DeadHeads)), r.Limit, r.Claims, r.ColdMS, r.P50, r.P99, times(r.ColdVsBase), times(r.P50VsBase),
				times(r.P99VsBase), r.ReleaseP50, thousands(float64(r.PlanStats.IndexRowsRemoved)),
				thousands(float64(r.PlanStats.Buffers())))
		}
		tw.Flush()
	}
	if p, ok := claimHeldShownPlan(c); ok {
		fmt.Fprintf(w, "\nEXPLAIN (ANALYZE, BUFFERS) of the claim, %s table, shape %s, %s held, limit %d (last run):\n%s\n",
			p.Layout, p.Shape, thousands(float64(p.Held)), p.Limit, p.Plan)
	}
}

// claimHeldShownPlan is the point whose plan the tables are followed by:
// of the last run, the first layout and shape, the most held rows, the
// smallest limit.
func claimHeldShownPlan(c *ClaimHeldReport) (claimHeldPoint, bool) {
	cfg := c.Config
	if len(c.Runs) == 0 || len(cfg.Layouts) == 0 || len(cfg.Shapes) == 0 || len(cfg.Held) == 0 || len(cfg.Limits) == 0 {
		return claimHeldPoint{}, false
	}
	want := claimHeldKey{cfg.Layouts[0], cfg.Shapes[0], slices.Max(cfg.Held), slices.Min(cfg.Limits)}
	for _, p := range c.Runs[len(c.Runs)-1] {
		if p.key() == want {
			return p, true
		}
	}
	return claimHeldPoint{}, false
}
