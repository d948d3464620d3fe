package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is everything one invocation measured; it is written as
// results.json.
type Report struct {
	Started   time.Time `json:"started"`
	Finished  time.Time `json:"finished"`
	Command   string    `json:"arguments"`
	Scenarios []string  `json:"scenarios"`
	Runs      int       `json:"runs"`
	Machine   Machine   `json:"machine"`
	// LoadStart and LoadEnd are the machine's 1, 5 and 15 minute load
	// averages when the run started and ended.
	LoadStart []float64        `json:"load_average_start,omitempty"`
	LoadEnd   []float64        `json:"load_average_end,omitempty"`
	Drain     *DrainReport     `json:"drain,omitempty"`
	Steady    *SteadyReport    `json:"steady,omitempty"`
	Commit    *CommitReport    `json:"commit,omitempty"`
	Consume   *ConsumeReport   `json:"consume,omitempty"`
	Claim     *ClaimReport     `json:"claim,omitempty"`
	ClaimHeld *ClaimHeldReport `json:"claim_held,omitempty"`
	Scheduled *ScheduledReport `json:"scheduled,omitempty"`
	Targets   []Target         `json:"targets"`
}

// Target is one of DESIGN.md's performance targets and whether this run
// met it.
type Target struct {
	Name string  `json:"name"`
	Want string  `json:"want"`
	Got  float64 `json:"got"`
	Met  bool    `json:"met"`
}

// DrainReport is the drain scenario over all runs.
type DrainReport struct {
	Events          int            `json:"events"`
	PeerEvents      int            `json:"peer_events"`
	PayloadBytes    float64        `json:"payload_bytes_avg"`
	SetupSeconds    []float64      `json:"setup_seconds"`
	BatchSize       int            `json:"projector_batch_size"`
	Concurrency     int            `json:"projector_concurrency"`
	ChannelPoolSize int            `json:"amqp_channel_pool_size"`
	Variants        []DrainVariant `json:"variants"`
}

// DrainVariant is one relay over all runs. Ratios compare median rates.
type DrainVariant struct {
	Key           string     `json:"key"`
	Label         string     `json:"label"`
	Family        string     `json:"family"`
	Runs          []drainRun `json:"runs"`
	MedianRate    float64    `json:"median_rows_per_second"`
	MedianSeconds float64    `json:"median_seconds"`
	MedianClaim   float64    `json:"median_claim_seconds,omitempty"`
	MedianSettle  float64    `json:"median_settle_seconds,omitempty"`
	VsPeer        float64    `json:"vs_peer,omitempty"`
	// VsBare compares with the bare loop as specified ("bare"), the
	// reference of DESIGN.md's target; VsBareIndexed with the bare loop
	// whose SELECT uses the partial index ("bare-indexed").
	VsBare        float64 `json:"vs_bare,omitempty"`
	VsBareIndexed float64 `json:"vs_bare_indexed,omitempty"`
}

func summarizeDrain(vs []variant, runs map[string][]drainRun, events int, payload float64, setups []float64) *DrainReport {
	d := &DrainReport{
		Events: events, PeerEvents: min(events, peerMaxEvents), PayloadBytes: payload, SetupSeconds: setups,
		BatchSize: 500, Concurrency: 64, ChannelPoolSize: 64,
	}
	var peer, bare, bareIndexed float64
	for _, v := range vs {
		rs := runs[v.Key]
		var rates, secs, claims, settles []float64
		for _, r := range rs {
			rates, secs = append(rates, r.Rate), append(secs, r.Seconds)
			claims, settles = append(claims, r.ClaimSeconds), append(settles, r.SettleSeconds)
		}
		dv := DrainVariant{Key: v.Key, Label: v.Label, Family: v.Family, Runs: rs,
			MedianRate: median(rates), MedianSeconds: median(secs), MedianClaim: median(claims), MedianSettle: median(settles)}
		switch v.Key {
		case "watermill-forwarder":
			peer = dv.MedianRate
		case "bare":
			bare = dv.MedianRate
		case "bare-indexed":
			bareIndexed = dv.MedianRate
		}
		d.Variants = append(d.Variants, dv)
	}
	for i := range d.Variants {
		if d.Variants[i].Family == "peer" {
			continue
		}
		d.Variants[i].VsPeer = ratio(d.Variants[i].MedianRate, peer)
		if d.Variants[i].Family != "bare" {
			d.Variants[i].VsBare = ratio(d.Variants[i].MedianRate, bare)
			d.Variants[i].VsBareIndexed = ratio(d.Variants[i].MedianRate, bareIndexed)
		}
	}
	return d
}

// CommitReport is the commit scenario over all runs.
type CommitReport struct {
	SecondsPerMeasurement float64          `json:"seconds_per_measurement"`
	Runs                  [][]commitResult `json:"runs"`
	Rows                  []CommitRow      `json:"medians"`
}

// CommitRow compares the modes at one concurrency (median commits/s).
type CommitRow struct {
	Goroutines int     `json:"goroutines"`
	GORM       float64 `json:"gorm_commits_per_second"`
	UOW        float64 `json:"uow_commits_per_second"`
	Ratio      float64 `json:"uow_over_gorm"`
}

func summarizeCommit(runs [][]commitResult, d time.Duration) *CommitReport {
	c := &CommitReport{SecondsPerMeasurement: d.Seconds(), Runs: runs}
	for _, g := range commitGoroutines {
		rates := map[string][]float64{}
		for _, run := range runs {
			for _, r := range run {
				if r.Goroutines == g {
					rates[r.Mode] = append(rates[r.Mode], r.Rate)
				}
			}
		}
		row := CommitRow{Goroutines: g, GORM: median(rates["gorm"]), UOW: median(rates["uow"])}
		row.Ratio = ratio(row.UOW, row.GORM)
		c.Rows = append(c.Rows, row)
	}
	return c
}

// ClaimReport is the claim scenario over all runs.
type ClaimReport struct {
	Config claimConfig    `json:"config"`
	Runs   [][]claimPoint `json:"runs"`
	Rows   []ClaimRow     `json:"medians"`
	// Ratio is the median claim p50 beside the most sent rows over the one
	// beside the fewest.
	Ratio float64 `json:"ratio_large_over_small"`
}

// ClaimRow is the median over runs of each run's claim percentiles.
type ClaimRow struct {
	SentRows   int      `json:"sent_rows"`
	P50        float64  `json:"claim_p50_ms"`
	P95        float64  `json:"claim_p95_ms"`
	P99        float64  `json:"claim_p99_ms"`
	ReleaseP50 float64  `json:"release_p50_ms"`
	Indexes    []string `json:"indexes"`
	Plan       string   `json:"plan"`
}

func summarizeClaim(runs [][]claimPoint, cfg claimConfig) *ClaimReport {
	c := &ClaimReport{Config: cfg, Runs: runs}
	if len(runs) == 0 {
		return c
	}
	for i := range runs[0] {
		var p50, p95, p99, rel []float64
		for _, run := range runs {
			p := run[i]
			p50, p95, p99, rel = append(p50, p.Claim.P50), append(p95, p.Claim.P95), append(p99, p.Claim.P99), append(rel, p.Release.P50)
		}
		last := runs[len(runs)-1][i]
		c.Rows = append(c.Rows, ClaimRow{SentRows: last.SentRows, P50: median(p50), P95: median(p95), P99: median(p99),
			ReleaseP50: median(rel), Indexes: last.Indexes, Plan: last.Plan})
	}
	c.Ratio = ratio(c.Rows[len(c.Rows)-1].P50, c.Rows[0].P50)
	return c
}

// targets checks DESIGN.md's performance targets against the medians.
func (r *Report) targets() []Target {
	var ts []Target
	if r.Drain != nil {
		for _, v := range r.Drain.Variants {
			if v.Family != "bento" {
				continue
			}
			ts = append(ts,
				Target{Name: "drain " + v.Key + " vs Watermill forwarder", Want: ">= 10x", Got: v.VsPeer, Met: v.VsPeer >= 10},
				Target{Name: "drain " + v.Key + " vs bare loop", Want: ">= 0.80", Got: v.VsBare, Met: v.VsBare >= 0.8},
				Target{Name: "drain " + v.Key + " vs bare loop, indexed SELECT", Want: ">= 0.80", Got: v.VsBareIndexed,
					Met: v.VsBareIndexed >= 0.8})
		}
	}
	if r.Steady != nil {
		ts = append(ts, steadyTargets(r.Steady)...)
	}
	if r.Commit != nil {
		for _, row := range r.Commit.Rows {
			ts = append(ts, Target{Name: fmt.Sprintf("commit uow/gorm, %d goroutine(s)", row.Goroutines), Want: ">= 0.80",
				Got: row.Ratio, Met: row.Ratio >= 0.8})
		}
	}
	if r.Consume != nil {
		ts = append(ts, consumeTargets(r.Consume)...)
	}
	if r.Claim != nil {
		ts = append(ts, Target{Name: fmt.Sprintf("claim p50 beside %d vs %d sent rows", r.Claim.Config.SentLarge, r.Claim.Config.SentSmall),
			Want: "<= 1.5x", Got: r.Claim.Ratio, Met: r.Claim.Ratio <= 1.5})
	}
	if r.ClaimHeld != nil {
		ts = append(ts, claimHeldTargets(r.ClaimHeld)...)
	}
	if r.Scheduled != nil {
		ts = append(ts, scheduledTargets(r.Scheduled)...)
	}
	return ts
}

func printReport(w io.Writer, r *Report) {
	m := r.Machine
	fmt.Fprintf(w, "\nMachine: %s, %d cores, %s/%s, %s, PostgreSQL %s, %s\n", m.CPU, m.Cores, m.GOOS, m.GOARCH, m.Go, m.PostgreSQL, m.RabbitMQ)
	fmt.Fprintf(w, "Load average (1, 5, 15 min): %s at the start, %s at the end. Medians of %d run(s).\n",
		loadText(r.LoadStart), loadText(r.LoadEnd), r.Runs)
	if d := r.Drain; d != nil {
		fmt.Fprintf(w, "\nDrain: %s events of %.0f bytes (the forwarder: %s), PostgreSQL -> RabbitMQ with confirms\n",
			thousands(float64(d.Events)), d.PayloadBytes, thousands(float64(d.PeerEvents)))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "relay\tevents\tseconds\trows/s\tx peer\tof bare\tof bare-indexed\tin claim s\tin mark sent s\truns (rows/s)\t")
		for _, v := range d.Variants {
			var runs []string
			for _, r := range v.Runs {
				runs = append(runs, thousands(r.Rate))
			}
			events := 0
			if len(v.Runs) > 0 {
				events = v.Runs[0].Events
			}
			fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", v.Label, thousands(float64(events)), v.MedianSeconds,
				thousands(v.MedianRate), times(v.VsPeer), percent(v.VsBare), percent(v.VsBareIndexed),
				secondsOrDash(v.MedianClaim), secondsOrDash(v.MedianSettle),
				strings.Join(runs, " "))
		}
		tw.Flush()
	}
	if r.Steady != nil {
		printSteady(w, r.Steady)
	}
	if c := r.Commit; c != nil {
		fmt.Fprintf(w, "\nCommit: one aggregate update, with one event (uow) and without (gorm), %.0f s per measurement\n", c.SecondsPerMeasurement)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "goroutines\tgorm commits/s\tuow commits/s\tuow/gorm\t")
		for _, row := range c.Rows {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%.2f\t\n", row.Goroutines, thousands(row.GORM), thousands(row.UOW), row.Ratio)
		}
		tw.Flush()
	}
	if r.Consume != nil {
		printConsume(w, r.Consume)
	}
	if c := r.Claim; c != nil {
		fmt.Fprintf(w, "\nClaim: %d rows from %s pending, each claim followed by a release; %d claims per size\n",
			c.Config.Limit, thousands(float64(c.Config.Pending)), c.Config.Claims)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "sent rows\tclaim p50 ms\tp95 ms\tp99 ms\trelease p50 ms\tindexes used\t")
		for _, row := range c.Rows {
			fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t\n", thousands(float64(row.SentRows)), row.P50, row.P95, row.P99,
				row.ReleaseP50, strings.Join(row.Indexes, ", "))
		}
		tw.Flush()
		fmt.Fprintf(w, "claim p50 ratio %s/%s sent rows: %.2f\n", thousands(float64(c.Config.SentLarge)),
			thousands(float64(c.Config.SentSmall)), c.Ratio)
		if len(c.Rows) > 0 {
			fmt.Fprintf(w, "\nEXPLAIN ANALYZE of the claim beside %s sent rows:\n%s\n", thousands(float64(c.Rows[len(c.Rows)-1].SentRows)),
				c.Rows[len(c.Rows)-1].Plan)
		}
	}
	if r.ClaimHeld != nil {
		printClaimHeld(w, r.ClaimHeld)
	}
	if r.Scheduled != nil {
		printScheduled(w, r.Scheduled)
	}
	fmt.Fprintln(w, "\nTargets:")
	for _, t := range r.Targets {
		met := "MISSED"
		if t.Met {
			met = "met"
		}
		fmt.Fprintf(w, "  %-66s want %-7s got %9.3f  %s\n", t.Name, t.Want, t.Got, met)
	}
}

func times(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fx", x)
}

func secondsOrDash(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}

func percent(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*x)
}

// redraw prints the tables of the report in o.from and writes its charts
// beside it and into o.docs.
func redraw(o options) error {
	data, err := os.ReadFile(o.from)
	if err != nil {
		return err
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("%s: %w", o.from, err)
	}
	printReport(os.Stdout, &r)
	return writeFiles(chartFiles(&r, filepath.Dir(o.from), o.docs))
}

// charts draws the charts of the scenarios r holds, by name ("drain",
// "steady", "consume").
func charts(r *Report) map[string]string {
	out := map[string]string{}
	if r.Drain != nil {
		out["drain"] = drainSVG(r)
	}
	if r.Steady != nil && len(r.Steady.Rows) > 0 {
		out["steady"] = steadySVG(r)
	}
	if r.Consume != nil && len(r.Consume.Rows) > 0 {
		out["consume"] = consumeSVG(r)
	}
	return out
}

// chartFiles places each chart as <name>.svg in dir and as
// benchmarks-<name>.svg in docs (when not empty).
func chartFiles(r *Report, dir, docs string) map[string][]byte {
	files := map[string][]byte{}
	for name, svg := range charts(r) {
		files[filepath.Join(dir, name+".svg")] = []byte(svg)
		if docs != "" {
			files[filepath.Join(docs, "benchmarks-"+name+".svg")] = []byte(svg)
		}
	}
	return files
}

// resultsName is the JSON file a run writes: results.json for every
// scenario, results-<scenario>-….json for a selection, so a partial run
// does not replace the full one.
func resultsName(scenarios []string) string {
	if len(scenarios) == len(allScenarios) {
		return "results.json"
	}
	sorted := make([]string, 0, len(scenarios))
	for _, s := range knownScenarios() { // in the canonical order
		if slices.Contains(scenarios, s) {
			sorted = append(sorted, s)
		}
	}
	return "results-" + strings.Join(sorted, "-") + ".json"
}

// writeOutputs writes the results JSON and the charts into o.out, and the
// charts into o.docs, each through a temporary file renamed into place.
func writeOutputs(r *Report, o options) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	files := chartFiles(r, o.out, o.docs)
	files[filepath.Join(o.out, resultsName(r.Scenarios))] = append(js, '\n')
	return writeFiles(files)
}

func writeFiles(files map[string][]byte) error {
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, path := range paths {
		if err := writeFile(path, files[path]); err != nil {
			return err
		}
		progress("wrote %s", path)
	}
	return nil
}

func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// drainSVG draws the drain medians.
func drainSVG(r *Report) string {
	d := r.Drain
	var bars []bar
	for _, v := range d.Variants {
		note := ""
		switch {
		case v.Family == "bento":
			note = fmt.Sprintf("%s peer · %s of bare · %s of bare-indexed", times(v.VsPeer), percent(v.VsBare), percent(v.VsBareIndexed))
		case v.Family == "bare":
			note = times(v.VsPeer) + " peer"
		}
		bars = append(bars, bar{Label: v.Label, Value: v.MedianRate, Note: note, Family: v.Family})
	}
	m := r.Machine
	title := "Relay drain, PostgreSQL → RabbitMQ with publisher confirms"
	runs := "1 run"
	if r.Runs > 1 {
		runs = fmt.Sprintf("median of %d runs", r.Runs)
	}
	sub := fmt.Sprintf("%s events (forwarder: %s), %s · %s, %d cores · PostgreSQL %s · %s · %s",
		thousands(float64(d.Events)), thousands(float64(d.PeerEvents)), runs, m.CPU, m.Cores,
		pgVersion(m), m.RabbitMQ, m.Go)
	return drainChart(title, sub, bars)
}
