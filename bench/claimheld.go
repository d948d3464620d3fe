package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/partition"
)

// claimHeldConfig sizes the claimheld scenario: the claim cost with events
// held back behind dead ones.
type claimHeldConfig struct {
	// Held are the numbers of events held back, one measurement each; the
	// first (0 by default) is the baseline the others are compared with.
	Held []int `json:"held_rows"`
	// Ready are the rows of other aggregates, each first in line, that the
	// claims take.
	Ready int `json:"ready_rows"`
	// PerAggregate is how many events wait behind each dead one in the
	// "many" shape.
	PerAggregate int `json:"held_per_aggregate"`
	// Limits are the claim sizes measured.
	Limits []int `json:"limits"`
	// Claims are the timed claims of each measurement, unless Budget runs
	// out first.
	Claims int `json:"claims"`
	// Budget ends a measurement's timed claims early once it is spent and
	// at least claimHeldMinClaims were timed, so sizes where a claim takes
	// seconds do not take many minutes.
	Budget time.Duration `json:"budget_ns"`
	// WarmupLimit is the batch of the Drain-like pass before the timed
	// claims (the projector's default BatchSize).
	WarmupLimit int      `json:"warmup_limit"`
	Shapes      []string `json:"shapes"`
	Layouts     []string `json:"layouts"`
}

// The shapes of the held-back backlog.
const (
	// shapeOne is one poison aggregate: one dead event and every held event
	// behind it.
	shapeOne = "one"
	// shapeMany is many poisoned aggregates: PerAggregate events behind
	// each dead one, their events interleaved as concurrent writers left
	// them.
	shapeMany = "many"
)

var claimHeldShapes = []string{shapeOne, shapeMany}

// The layouts of outbox_events, and the statistics the planner has of it:
// a layout is analyzed (VACUUM ANALYZE) after each fill, an unanalyzed one
// has its statistics removed instead (forgetStatsSQL), as a table that
// autovacuum never reached.
const (
	layoutPlain                 = "plain"                  // outbox.Migrate
	layoutPartitioned           = "partitioned"            // outbox.MigrateWith, daily partitions
	layoutPlainUnanalyzed       = "plain-unanalyzed"       // plain, no statistics
	layoutPartitionedUnanalyzed = "partitioned-unanalyzed" // partitioned, no statistics
)

var claimHeldLayouts = []string{layoutPlain, layoutPartitioned, layoutPlainUnanalyzed, layoutPartitionedUnanalyzed}

// claimHeldDefaultLayouts are the layouts measured unless
// -claimheld-layouts names others: the unanalyzed ones are asked for by
// name (with 100,000 events behind 10,000 dead ones, the first claim of a
// never-analyzed table, plain or partitioned, still exceeds the claim's
// statement timeout, which ends the scenario).
var claimHeldDefaultLayouts = []string{layoutPlain, layoutPartitioned}

// partitioned reports whether layout is one of the partitioned table.
func partitioned(layout string) bool {
	return layout == layoutPartitioned || layout == layoutPartitionedUnanalyzed
}

// analyzed reports whether layout's table is analyzed after each fill.
func analyzed(layout string) bool {
	return layout == layoutPlain || layout == layoutPartitioned
}

func defaultClaimHeldConfig() claimHeldConfig {
	return claimHeldConfig{
		Held: []int{0, 10000, 100000}, Ready: 1000, PerAggregate: 10, Limits: []int{10, 500}, Claims: 50,
		Budget: 3 * time.Second, WarmupLimit: 500, Shapes: claimHeldShapes, Layouts: claimHeldDefaultLayouts,
	}
}

func (c claimHeldConfig) validate() error {
	var errs []error
	if len(c.Held) == 0 {
		errs = append(errs, errors.New("-claimheld-held: none"))
	}
	for _, h := range c.Held {
		if h < 0 {
			errs = append(errs, fmt.Errorf("-claimheld-held: %d, must not be negative", h))
		}
	}
	if len(c.Limits) == 0 {
		errs = append(errs, errors.New("-claimheld-limits: none"))
	}
	for _, l := range c.Limits {
		if l < 1 {
			errs = append(errs, fmt.Errorf("-claimheld-limits: %d, must be at least 1", l))
		}
	}
	if len(c.Limits) > 0 && c.Ready < slices.Max(c.Limits) {
		errs = append(errs, fmt.Errorf("-claimheld-ready: %d, must be at least the largest limit (%d)", c.Ready, slices.Max(c.Limits)))
	}
	if c.PerAggregate < 1 {
		errs = append(errs, fmt.Errorf("-claimheld-per-aggregate: %d, must be at least 1", c.PerAggregate))
	}
	if c.Claims < 1 {
		errs = append(errs, fmt.Errorf("-claimheld-claims: %d, must be at least 1", c.Claims))
	}
	if c.Budget <= 0 {
		errs = append(errs, fmt.Errorf("-claimheld-budget: %v, must be positive", c.Budget))
	}
	if c.WarmupLimit < 1 {
		errs = append(errs, fmt.Errorf("claimheld warm-up limit: %d, must be at least 1", c.WarmupLimit))
	}
	errs = append(errs, oneOf("-claimheld-shapes", c.Shapes, claimHeldShapes), oneOf("-claimheld-layouts", c.Layouts, claimHeldLayouts))
	return errors.Join(errs...)
}

// oneOf checks that got is not empty and holds only words of want.
func oneOf(flag string, got, want []string) error {
	if len(got) == 0 {
		return fmt.Errorf("%s: none", flag)
	}
	var errs []error
	for _, g := range got {
		if !slices.Contains(want, g) {
			errs = append(errs, fmt.Errorf("%s: %q, want one of %s", flag, g, strings.Join(want, ", ")))
		}
	}
	return errors.Join(errs...)
}

// claimHeldMinClaims are the fewest claims a measurement times, however
// long they take.
const claimHeldMinClaims = 5

// deadHeads is how many dead events hold back held events in shape.
func deadHeads(shape string, held, perAggregate int) int {
	switch {
	case held == 0:
		return 0
	case shape == shapeOne:
		return 1
	default:
		return (held + perAggregate - 1) / perAggregate
	}
}

// claimHeldPoint is the claim cost at one layout, shape, number of held
// events and limit, in one run.
type claimHeldPoint struct {
	Layout    string `json:"layout"`
	Shape     string `json:"shape"`
	Held      int    `json:"held_rows"`
	DeadHeads int    `json:"dead_rows"`
	Limit     int    `json:"limit"`
	// ColdMS is the first claim on the freshly filled table, the one that
	// meets every held row first.
	ColdMS float64 `json:"cold_claim_ms"`
	// WarmupClaims and WarmupMS are the Drain-like pass after it: claims
	// of WarmupLimit rows until one comes back empty.
	WarmupClaims int       `json:"warmup_claims"`
	WarmupMS     float64   `json:"warmup_ms"`
	Claim        latencies `json:"claim"`
	Release      latencies `json:"release"`
	Plan         string    `json:"plan"`
	PlanStats    planStats `json:"plan_stats"`
	// Load is the machine's 1-minute load average after the measurement.
	Load float64 `json:"load_1m"`
}

// runClaimHeld measures every point of cfg once, layout by layout, each in
// its own schema.
func runClaimHeld(ctx context.Context, e *env, cfg claimHeldConfig, say func(string)) ([]claimHeldPoint, error) {
	var out []claimHeldPoint
	for _, layout := range cfg.Layouts {
		ps, err := runClaimHeldLayout(ctx, e, cfg, layout, say)
		if err != nil {
			return nil, fmt.Errorf("%s table: %w", layout, err)
		}
		out = append(out, ps...)
	}
	return out, nil
}

func runClaimHeldLayout(ctx context.Context, e *env, cfg claimHeldConfig, layout string, say func(string)) ([]claimHeldPoint, error) {
	s, err := e.newSchema(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := s.drop(); err != nil {
			e.log.Warn("cleanup", "err", err)
		}
	}()
	// One connection: claims, releases and the EXPLAIN run one after
	// another, and every claim reuses the one prepared statement.
	db, err := s.gorm(1)
	if err != nil {
		return nil, err
	}
	defer closeGorm(db)
	var opts *partition.MigrateOpts
	if partitioned(layout) {
		opts = &partition.MigrateOpts{Partitioning: partition.Daily}
	}
	if err := outbox.MigrateWith(ctx, db, opts); err != nil {
		return nil, err
	}
	store, err := outbox.NewStore(db, nil)
	if err != nil {
		return nil, err
	}
	// Prepare the claim statement on the connection, so the cold claim
	// measures the table rather than a parse.
	if _, err := claimReady(ctx, store, cfg.WarmupLimit); err != nil {
		return nil, err
	}
	var out []claimHeldPoint
	for _, shape := range cfg.Shapes {
		for _, held := range cfg.Held {
			for _, limit := range cfg.Limits {
				p := claimHeldPoint{Layout: layout, Shape: shape, Held: held, Limit: limit,
					DeadHeads: deadHeads(shape, held, cfg.PerAggregate)}
				if err := measureHeld(ctx, db, store, cfg, &p); err != nil {
					return nil, fmt.Errorf("%s, %d held, limit %d: %w", shape, held, limit, err)
				}
				say(fmt.Sprintf("%-11s %-4s %7d held behind %5d dead, limit %3d: cold %7.2f ms, p50 %7.2f ms, p99 %7.2f ms; plan: %s; load %.1f",
					layout, shape, held, p.DeadHeads, limit, p.ColdMS, p.Claim.P50, p.Claim.P99, p.PlanStats, p.Load))
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// measureHeld fills the table for p, then times the first claim, a
// Drain-like pass of claims until none is left (releasing everything
// afterwards), and cfg.Claims claims of p.Limit rows (fewer, at least
// claimHeldMinClaims, once cfg.Budget is spent), each followed by a
// release so every claim sees the same table; last, it explains one more.
func measureHeld(ctx context.Context, db *gorm.DB, store *outbox.Store, cfg claimHeldConfig, p *claimHeldPoint) error {
	if err := fillHeld(ctx, db, p.Held, p.DeadHeads, cfg.Ready, analyzed(p.Layout)); err != nil {
		return err
	}
	t0 := time.Now()
	first, err := claimReady(ctx, store, p.Limit)
	p.ColdMS = ms(time.Since(t0))
	if err != nil {
		return err
	}
	if len(first) != p.Limit {
		return fmt.Errorf("cold claim took %d rows, want %d", len(first), p.Limit)
	}
	taken := first
	t0 = time.Now()
	for {
		ids, err := claimReady(ctx, store, cfg.WarmupLimit)
		if err != nil {
			return err
		}
		p.WarmupClaims++
		if len(ids) == 0 {
			break
		}
		taken = append(taken, ids...)
	}
	p.WarmupMS = ms(time.Since(t0))
	if len(taken) != cfg.Ready {
		return fmt.Errorf("the warm-up pass claimed %d rows, want the %d ready ones", len(taken), cfg.Ready)
	}
	for chunk := range slices.Chunk(taken, cfg.WarmupLimit) {
		if _, err := store.Release(ctx, claimWorker, chunk); err != nil {
			return err
		}
	}
	var claimD, releaseD []time.Duration
	start := time.Now()
	for i := 0; i < cfg.Claims && (i < claimHeldMinClaims || time.Since(start) < cfg.Budget); i++ {
		t0 := time.Now()
		ids, err := claimReady(ctx, store, p.Limit)
		t1 := time.Now()
		if err != nil {
			return err
		}
		if len(ids) != p.Limit {
			return fmt.Errorf("claim %d took %d rows, want %d", i, len(ids), p.Limit)
		}
		if _, err := store.Release(ctx, claimWorker, ids); err != nil {
			return err
		}
		claimD, releaseD = append(claimD, t1.Sub(t0)), append(releaseD, time.Since(t1))
	}
	p.Claim, p.Release = summarize(claimD), summarize(releaseD)
	if p.Plan, err = explainClaim(ctx, db, p.Limit); err != nil {
		return fmt.Errorf("explain: %w", err)
	}
	p.PlanStats = parsePlanStats(p.Plan)
	if l := loadAverage(); len(l) > 0 {
		p.Load = l[0]
	}
	return nil
}

// claimReady claims up to limit rows and returns their ids, failing if
// one of them is held back (its aggregate has a dead event).
func claimReady(ctx context.Context, store *outbox.Store, limit int) ([]string, error) {
	rows, err := store.Claim(ctx, outbox.ClaimOpts{Worker: claimWorker, Limit: limit, Lease: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(rows))
	for i, r := range rows {
		if !strings.HasPrefix(r.AggregateID, readyPrefix) {
			return nil, fmt.Errorf("claimed %s, version %d of %s, which a dead event holds back", r.ID, r.AggregateVersion, r.AggregateID)
		}
		ids[i] = r.ID
	}
	return ids, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// The aggregate ids of the claimheld rows: poison-NNNNNNN for the dead
// events and those held behind them, ready-NNNNNNN for the others.
const (
	poisonPrefix = "poison-"
	readyPrefix  = "ready-"
)

// fillHeldSQL inserts, with created_at now (so a partitioned table holds
// them in today's partition):
//
//   - the dead events, version 1 of poison aggregates 0..@dead-1, ids
//     00…, available an hour ago;
//   - the held events, round-robin over those aggregates (@aggs: @dead,
//     or 1 when there are none) from version 2,
//     ids 01…, available from an hour ago on, one microsecond apart;
//   - the ready events, version 1 of aggregates ready-…, ids 02…, available
//     a minute ago.
//
// So in the claim's (available_at, id) order every held event comes before
// every ready one, as a backlog that piled up behind an old failure does;
// a release moves the ready rows further back still.
const fillHeldSQL = `INSERT INTO outbox_events (id, tenant_id, topic, aggregate_type, aggregate_id,
    aggregate_version, schema_version, payload, metadata, occurred_at, created_at, status, attempts,
    available_at, last_error, failed_at)
SELECT id, 'default', 'account.deposited', 'account', agg, version, 1,
       jsonb_build_object('account_id', agg, 'amount', g, 'currency', 'EUR',
           'reference', upper(substr(md5(id), 1, 26)), 'memo', CAST(@memo AS text)),
       '{}', at, now(), status, attempts, at, err, fail
FROM (
    SELECT g, '00' || lpad(g::text, 24, '0') AS id, 'poison-' || lpad(g::text, 7, '0') AS agg, 1 AS version,
           now() - interval '1 hour' - interval '1 second' AS at, 'dead' AS status, 5 AS attempts,
           'bench: a poison event' AS err, now() - interval '1 hour' AS fail
    FROM generate_series(0, @dead - 1) AS g
    UNION ALL
    SELECT g, '01' || lpad(g::text, 24, '0'), 'poison-' || lpad((g % @aggs)::text, 7, '0'), g / @aggs + 2,
           now() - interval '1 hour' + g * interval '1 microsecond', 'new', 0, NULL, NULL
    FROM generate_series(0, @held - 1) AS g
    UNION ALL
    SELECT g, '02' || lpad(g::text, 24, '0'), 'ready-' || lpad(g::text, 7, '0'), 1,
           now() - interval '1 minute' + g * interval '1 microsecond', 'new', 0, NULL, NULL
    FROM generate_series(0, @ready - 1) AS g
) AS r`

// forgetStatsSQL removes what the planner knows of the outbox's tables in
// the current schema: their column statistics, and their size and row
// count as the last VACUUM or ANALYZE recorded them (reltuples -1: never
// vacuumed nor analyzed), so that it plans as for a table autovacuum never
// reached. It writes the catalogs, which needs a superuser.
const forgetStatsSQL = `DO $$
BEGIN
    DELETE FROM pg_statistic AS s USING pg_class AS c
    WHERE s.starelid = c.oid AND c.relnamespace = current_schema()::regnamespace AND c.relname LIKE 'outbox\_%';
    UPDATE pg_class SET reltuples = -1, relpages = 0, relallvisible = 0
    WHERE relnamespace = current_schema()::regnamespace AND relname LIKE 'outbox\_%' AND relkind IN ('r', 'p');
END $$`

// fillHeld empties outbox_events and fills it for one measurement (with
// the NOTIFY trigger off, since nobody listens), then analyzes it (or, not
// analyze, removes its statistics) and checkpoints so the measurement does
// not pay for the writes.
func fillHeld(ctx context.Context, db *gorm.DB, held, aggs, ready int, analyze bool) error {
	want := int64(aggs + held + ready)
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for _, q := range []string{emptyOutboxSQL, "ALTER TABLE outbox_events DISABLE TRIGGER outbox_events_notify"} {
			if err := tx.Exec(q).Error; err != nil {
				return err
			}
		}
		res := tx.Exec(fillHeldSQL, map[string]any{"memo": memo, "dead": aggs, "aggs": max(aggs, 1), "held": held, "ready": ready})
		if res.Error != nil {
			return fmt.Errorf("insert rows: %w", res.Error)
		}
		if res.RowsAffected != want {
			return fmt.Errorf("inserted %d rows, want %d", res.RowsAffected, want)
		}
		return tx.Exec("ALTER TABLE outbox_events ENABLE TRIGGER outbox_events_notify").Error
	})
	if err != nil {
		return err
	}
	stats := "VACUUM ANALYZE outbox_events"
	if !analyze {
		stats = forgetStatsSQL
	}
	for _, q := range []string{stats, "CHECKPOINT"} {
		if err := db.WithContext(ctx).Exec(q).Error; err != nil {
			return fmt.Errorf("%.40s: %w", q, err)
		}
	}
	return nil
}

// planStats are the figures of an EXPLAIN (ANALYZE, BUFFERS) that say how
// much a statement walked, whatever its plan.
type planStats struct {
	// IndexRowsRemoved is the rows the plan's index scans read and dropped
	// ("Rows Removed by Filter", a per-loop average, times the node's
	// loops), summed over them: for the claim, the rows it walked past.
	IndexRowsRemoved int `json:"index_rows_removed"`
	// SharedHit and SharedRead are the buffers of the whole statement (its
	// top node), not counting planning.
	SharedHit  int     `json:"shared_hit"`
	SharedRead int     `json:"shared_read"`
	ExecMS     float64 `json:"execution_ms"`
}

// Buffers is every shared buffer the statement touched.
func (s planStats) Buffers() int { return s.SharedHit + s.SharedRead }

func (s planStats) String() string {
	return fmt.Sprintf("%s rows walked past, %s buffers, %.1f ms", thousands(float64(s.IndexRowsRemoved)),
		thousands(float64(s.Buffers())), s.ExecMS)
}

var (
	loopsRE     = regexp.MustCompile(`\(actual time=\S+ rows=\d+ loops=(\d+)\)`)
	indexScanRE = regexp.MustCompile(`\bIndex (?:Only )?Scan\b`)
	removedRE   = regexp.MustCompile(`^\s*Rows Removed by Filter: (\d+)`)
	buffersRE   = regexp.MustCompile(`^\s*Buffers: shared\b(.*)`)
	hitRE       = regexp.MustCompile(`\bhit=(\d+)`)
	readRE      = regexp.MustCompile(`\bread=(\d+)`)
	execRE      = regexp.MustCompile(`^Execution Time: ([\d.]+) ms`)
)

// parsePlanStats reads planStats from the text of EXPLAIN (ANALYZE,
// BUFFERS); what it does not find stays zero.
func parsePlanStats(plan string) planStats {
	var (
		s         planStats
		loops     = 1  // of the node the lines are about
		index     bool // whether that node is an index scan
		gotBuffer bool
	)
	for _, line := range strings.Split(plan, "\n") {
		if m := loopsRE.FindStringSubmatch(line); m != nil {
			loops, _ = strconv.Atoi(m[1])
			index = indexScanRE.MatchString(line)
		}
		if m := removedRE.FindStringSubmatch(line); m != nil && index {
			n, _ := strconv.Atoi(m[1])
			s.IndexRowsRemoved += n * loops
		}
		if m := buffersRE.FindStringSubmatch(line); m != nil && !gotBuffer {
			gotBuffer = true
			if h := hitRE.FindStringSubmatch(m[1]); h != nil {
				s.SharedHit, _ = strconv.Atoi(h[1])
			}
			if r := readRE.FindStringSubmatch(m[1]); r != nil {
				s.SharedRead, _ = strconv.Atoi(r[1])
			}
		}
		if m := execRE.FindStringSubmatch(line); m != nil {
			s.ExecMS, _ = strconv.ParseFloat(m[1], 64)
		}
	}
	return s
}

// intsText is xs comma-separated.
func intsText(xs []int) string {
	l := intList(xs)
	return l.String()
}
