package main

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"
)

// heldPlan is an abridged EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) of the
// claim with 100,000 held rows: the ready index scan drops them, the
// NOT EXISTS probe runs once per row it looks at, and a sequential scan
// (not part of the walk) drops a row too.
const heldPlan = `Update on outbox_events (actual time=1739.654..1739.777 rows=10 loops=1)
  Buffers: shared hit=307172 read=28 dirtied=2
  CTE ready
    ->  Limit (actual time=1739.455..1739.489 rows=10 loops=1)
          Buffers: shared hit=307020
          ->  Index Scan using outbox_events_ready on outbox_events o (actual time=1739.445..1739.474 rows=10 loops=1)
                Filter: (((status)::text = ANY ('{new,publishing,failed}'::text[])) AND (NOT (SubPlan 1)))
                Rows Removed by Filter: 100000
                Buffers: shared hit=307010
                SubPlan 1
                  ->  Index Only Scan using outbox_events_unsent_aggregate on outbox_events p (actual time=0.016..0.016 rows=1 loops=100010)
                        Heap Fetches: 0
                        Buffers: shared hit=300031
  ->  Hash Join (actual time=5.981..6.070 rows=10 loops=1)
        ->  Seq Scan on outbox_events (actual time=0.005..0.161 rows=600 loops=1)
              Filter: ((status)::text = ANY ('{new,publishing,failed}'::text[]))
              Rows Removed by Filter: 1
        ->  Index Scan using outbox_events_pkey on outbox_events (actual time=0.003..0.003 rows=1 loops=10)
              Filter: ((ready.created_at = created_at))
              Rows Removed by Filter: 2
Planning:
  Buffers: shared hit=89
Planning Time: 0.404 ms
Execution Time: 1739.816 ms`

func TestParsePlanStats(t *testing.T) {
	t.Parallel()
	got := parsePlanStats(heldPlan)
	// 100,000 by the ready index, 2 per loop times 10 loops by the primary
	// key; the sequential scan's row does not count.
	want := planStats{IndexRowsRemoved: 100020, SharedHit: 307172, SharedRead: 28, ExecMS: 1739.816}
	if got != want {
		t.Errorf("parsePlanStats = %+v, want %+v", got, want)
	}
	if got.Buffers() != 307200 {
		t.Errorf("Buffers() = %d, want 307,200", got.Buffers())
	}
	if z := parsePlanStats("not a plan"); z != (planStats{}) {
		t.Errorf("stats of no plan: %+v", z)
	}
}

func TestDeadHeads(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		shape      string
		held, want int
	}{{shapeOne, 0, 0}, {shapeOne, 100000, 1}, {shapeMany, 0, 0}, {shapeMany, 100000, 10000}, {shapeMany, 15, 2}} {
		if got := deadHeads(c.shape, c.held, 10); got != c.want {
			t.Errorf("deadHeads(%s, %d, 10) = %d, want %d", c.shape, c.held, got, c.want)
		}
	}
}

func TestClaimHeldConfigValidate(t *testing.T) {
	t.Parallel()
	if err := defaultClaimHeldConfig().validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	c := defaultClaimHeldConfig()
	c.Ready, c.Shapes, c.Held = 100, []string{"some"}, []int{-1}
	err := c.validate()
	for _, want := range []string{"-claimheld-ready", "-claimheld-shapes", "-claimheld-held"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate() = %v, want it to name %s", err, want)
		}
	}
}

// heldPoint is a measured point with the given claim p50 and cold claim.
func heldPoint(shape string, held, limit int, p50, cold float64, count int) claimHeldPoint {
	return claimHeldPoint{Layout: layoutPlain, Shape: shape, Held: held, Limit: limit, ColdMS: cold, Plan: "a plan",
		Claim: latencies{Count: count, P50: p50, P99: 2 * p50}}
}

func TestSummarizeClaimHeldAndTargets(t *testing.T) {
	t.Parallel()
	cfg := defaultClaimHeldConfig()
	cfg.Held, cfg.Limits, cfg.Shapes, cfg.Layouts = []int{0, 100000}, []int{10}, []string{shapeOne, shapeMany}, []string{layoutPlain}
	runs := [][]claimHeldPoint{
		{heldPoint(shapeOne, 0, 10, 1, 3, 50), heldPoint(shapeOne, 100000, 10, 200, 250, 9),
			heldPoint(shapeMany, 0, 10, 1, 2, 50), heldPoint(shapeMany, 100000, 10, 1.5, 40, 50)},
		{heldPoint(shapeOne, 0, 10, 3, 5, 50), heldPoint(shapeOne, 100000, 10, 300, 350, 7),
			heldPoint(shapeMany, 0, 10, 1, 2, 50), heldPoint(shapeMany, 100000, 10, 2.5, 60, 50)},
	}
	c := summarizeClaimHeld(runs, cfg)
	if len(c.Rows) != 4 {
		t.Fatalf("%d rows, want 4", len(c.Rows))
	}
	one := c.Rows[1]
	if one.P50 != 250 || one.ColdMS != 300 || one.Claims != 7 || one.P50VsBase != 125 || one.ColdVsBase != 75 || one.P99VsBase != 125 {
		t.Errorf("one, 100k held: %+v; want p50 250 (125x the base of 2), cold 300 (75x), 7 claims", one)
	}
	if b := c.Rows[0]; b.P50VsBase != 1 {
		t.Errorf("the base row compares with itself as %v, want 1", b.P50VsBase)
	}
	if many := c.Rows[3]; math.Abs(many.P50VsBase-2) > 1e-9 {
		t.Errorf("many, 100k held: p50 x base %v, want 2", many.P50VsBase)
	}
	ts := claimHeldTargets(c)
	if len(ts) != 2 || ts[0].Met || !ts[1].Met || !strings.Contains(ts[0].Name, "100,000 vs 0 held (plain, one, limit 10)") {
		t.Errorf("targets %+v: want one (125x) missed, many (2x) met", ts)
	}
	if runs[0][0].Plan != "a plan" || c.Runs[0][0].Plan != "" || c.Runs[1][0].Plan != "a plan" {
		t.Errorf("plans kept: %q of the first run, %q of the last; want only the last's", c.Runs[0][0].Plan, c.Runs[1][0].Plan)
	}
	if p, ok := claimHeldShownPlan(c); !ok || p.Shape != shapeOne || p.Held != 100000 {
		t.Errorf("shown plan of %+v, want shape one at 100,000 held", p)
	}
}

// TestSmokeClaimHeld runs the claimheld scenario at a small size on every
// layout, analyzed and with no statistics: every claim must take only ready rows (claimReady checks), and
// the plans must show the held rows walked past.
func TestSmokeClaimHeld(t *testing.T) {
	t.Parallel()
	e := testEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := claimHeldConfig{Held: []int{0, 300}, Ready: 20, PerAggregate: 10, Limits: []int{5}, Claims: 3,
		Budget: time.Second, WarmupLimit: 8, Shapes: claimHeldShapes, Layouts: claimHeldLayouts}
	res, err := runClaimHeld(ctx, e, cfg, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	if want := 4 * len(cfg.Layouts); len(res) != want {
		t.Fatalf("%d points, want %d: %d layouts x 2 shapes x 2 sizes", len(res), want, len(cfg.Layouts))
	}
	for _, p := range res {
		if p.Claim.Count != 3 || p.ColdMS <= 0 || p.WarmupClaims != 3 {
			t.Errorf("%+v: want 3 timed claims, a cold one, 3 warm-up claims (the 15 rows the cold one left: 8, 7, none)", p.key())
		}
		// Today's claim walks past every held row; a claim that stops
		// doing so may walk fewer, never more.
		if p.PlanStats.IndexRowsRemoved > p.Held || p.PlanStats.Buffers() == 0 {
			t.Errorf("%+v: plan %s", p.key(), p.PlanStats)
		}
	}
	if c := summarizeClaimHeld([][]claimHeldPoint{res}, cfg); len(c.Rows) != 4*len(cfg.Layouts) || len(claimHeldTargets(c)) != 2*len(cfg.Layouts) {
		t.Errorf("summary %+v", c.Rows)
	}
}
