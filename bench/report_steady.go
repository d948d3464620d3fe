package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// SteadyReport is the steady scenario over all runs.
type SteadyReport struct {
	Rates           []float64      `json:"rates"`
	Seconds         float64        `json:"seconds_per_measurement"`
	WarmupSeconds   float64        `json:"warmup_seconds"`
	Writers         int            `json:"writers"`
	Accounts        int            `json:"accounts"`
	IdleSeconds     float64        `json:"idle_seconds"`
	PeerPolls       []string       `json:"peer_polls"`
	PeerMaxRate     float64        `json:"peer_max_rate"`
	ProjectorConfig string         `json:"projector_config"`
	Runs            []steadyResult `json:"runs"`
	Idle            []IdleRow      `json:"idle_medians"`
	Rows            []SteadyRow    `json:"medians"`
}

// IdleRow is the median over runs of a relay's idle CPU.
type IdleRow struct {
	Key            string  `json:"key"`
	Label          string  `json:"label"`
	ProcessPercent float64 `json:"process_percent_of_core"`
	BackendPercent float64 `json:"backend_percent_of_core"`
	Queries        float64 `json:"queries,omitempty"`
	// Runs are each run's process + backend percent.
	Runs []float64 `json:"runs_total_percent"`
}

// Total is the process and its backends together (the backends count
// zero when they could not be measured).
func (r IdleRow) Total() float64 { return r.ProcessPercent + max(r.BackendPercent, 0) }

// SteadyRow is the median over runs of each run's figures for one relay at
// one rate.
type SteadyRow struct {
	Key       string  `json:"key"`
	Label     string  `json:"label"`
	Family    string  `json:"family"`
	Rate      float64 `json:"offered_per_second"`
	Achieved  float64 `json:"achieved_per_second"`
	P50       float64 `json:"p50_ms"`
	P95       float64 `json:"p95_ms"`
	P99       float64 `json:"p99_ms"`
	Max       float64 `json:"max_ms"`
	CommitP50 float64 `json:"commit_p50_ms"`
	LagP99    float64 `json:"schedule_lag_p99_ms"`
	// Lost is the most events any run committed that its consumer did not
	// receive within 30 s.
	Lost int `json:"lost_max"`
	// PeerOverBentoP50 and PeerOverBentoP99 divide this peer's latency by
	// bento's at the same rate (peer rows only).
	PeerOverBentoP50 float64 `json:"peer_over_bento_p50,omitempty"`
	PeerOverBentoP99 float64 `json:"peer_over_bento_p99,omitempty"`
	// RunsP99 are each run's p99.
	RunsP99 []float64 `json:"runs_p99_ms"`
}

func summarizeSteady(runs []steadyResult, cfg steadyConfig) *SteadyReport {
	r := &SteadyReport{
		Rates: cfg.Rates, Seconds: cfg.Duration.Seconds(), WarmupSeconds: cfg.Warmup.Seconds(), Writers: cfg.Writers, Accounts: cfg.Accounts,
		IdleSeconds: cfg.Idle.Seconds(), PeerMaxRate: cfg.PeerMaxRate, Runs: runs,
		ProjectorConfig: "projector.DefaultConfig() (batch 500, 16 in flight, 10 ms busy sleep, 2 s idle poll, LISTEN/NOTIFY, woken by the writers' uow.Config.AfterCommit as embedded.Open wires it), rabbitmq.ConfirmPublisher",
	}
	for _, p := range cfg.PeerPolls {
		r.PeerPolls = append(r.PeerPolls, p.String())
	}
	if len(runs) == 0 {
		return r
	}
	for i, first := range runs[0].Idle {
		var proc, back, q, tot []float64
		for _, run := range runs {
			if i >= len(run.Idle) {
				continue
			}
			x := run.Idle[i]
			proc, back, q = append(proc, x.ProcessPercent), append(back, x.BackendPercent), append(q, float64(x.Queries))
			tot = append(tot, x.ProcessPercent+max(x.BackendPercent, 0))
		}
		r.Idle = append(r.Idle, IdleRow{Key: first.Key, Label: first.Label, ProcessPercent: median(proc),
			BackendPercent: median(back), Queries: median(q), Runs: tot})
	}
	bento := map[float64]SteadyRow{}
	for i, first := range runs[0].Points {
		var ach, p50, p95, p99, mx, c50, lag []float64
		lost := 0
		for _, run := range runs {
			if i >= len(run.Points) {
				continue
			}
			p := run.Points[i]
			ach, p50, p95, p99 = append(ach, p.Achieved), append(p50, p.Latency.P50), append(p95, p.Latency.P95), append(p99, p.Latency.P99)
			mx, c50, lag = append(mx, p.Latency.Max), append(c50, p.Commit.P50), append(lag, p.Lag.P99)
			lost = max(lost, p.Committed-p.Received)
		}
		row := SteadyRow{Key: first.Key, Label: first.Label, Family: first.Family, Rate: first.Rate, Achieved: median(ach),
			P50: median(p50), P95: median(p95), P99: median(p99), Max: median(mx), CommitP50: median(c50), LagP99: median(lag),
			Lost: lost, RunsP99: p99}
		if row.Family == "bento" {
			bento[row.Rate] = row
		} else if b, ok := bento[row.Rate]; ok && row.Family == "peer" {
			row.PeerOverBentoP50, row.PeerOverBentoP99 = ratio(row.P50, b.P50), ratio(row.P99, b.P99)
		}
		r.Rows = append(r.Rows, row)
	}
	return r
}

// steadyTargets checks DESIGN.md's steady-state targets: at 1k/s p50
// under 3 ms and p99 under 15 ms, at 5k/s p99 under 50 ms, and the idle
// projector under 1% of a core (with its PostgreSQL backends).
func steadyTargets(s *SteadyReport) []Target {
	var ts []Target
	for _, row := range s.Rows {
		if row.Family == "dbbus" && row.Rate == 1000 {
			ts = append(ts,
				Target{Name: "steady 1k/s, database bus: p50 commit -> handler (ms)", Want: "< 5", Got: row.P50, Met: row.P50 < 5 && row.Lost == 0},
				Target{Name: "steady 1k/s, database bus: p99 commit -> handler (ms)", Want: "< 25", Got: row.P99, Met: row.P99 < 25 && row.Lost == 0})
		}
		if row.Family != "bento" {
			continue
		}
		switch row.Rate {
		case 1000:
			ts = append(ts,
				Target{Name: "steady 1k/s: bento p50 commit -> consumer (ms)", Want: "< 3", Got: row.P50, Met: row.P50 < 3 && row.Lost == 0},
				Target{Name: "steady 1k/s: bento p99 commit -> consumer (ms)", Want: "< 15", Got: row.P99, Met: row.P99 < 15 && row.Lost == 0})
		case 5000:
			ts = append(ts, Target{Name: "steady 5k/s: bento p99 commit -> consumer (ms)", Want: "< 50", Got: row.P99,
				Met: row.P99 < 50 && row.Lost == 0})
		}
	}
	for _, idle := range s.Idle {
		if idle.Key == "bento" {
			ts = append(ts, Target{Name: "idle projector, % of a core (process + its backends)", Want: "< 1", Got: idle.Total(),
				Met: idle.Total() < 1})
		}
	}
	return ts
}

func printSteady(w io.Writer, s *SteadyReport) {
	fmt.Fprintf(w, "\nSteady state: one event per unit of work at a fixed rate (%d writers, open loop, %d accounts), %.0f s measured after %.0f s warm-up;\n"+
		"latency from Commit returning to the consumer's receipt. Projector: %s\n", s.Writers, s.Accounts, s.Seconds, s.WarmupSeconds, s.ProjectorConfig)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "relay\toffered/s\tachieved/s\tp50 ms\tp95 ms\tp99 ms\tmax ms\tcommit p50 ms\tlag p99 ms\tlost\tpeer/bento p50\tp99\truns p99 ms\t")
	for _, r := range s.Rows {
		var runs []string
		for _, x := range r.RunsP99 {
			runs = append(runs, fmt.Sprintf("%.1f", x))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.1f\t%.2f\t%.1f\t%d\t%s\t%s\t%s\t\n", r.Label, thousands(r.Rate), thousands(r.Achieved),
			r.P50, r.P95, r.P99, r.Max, r.CommitP50, r.LagP99, r.Lost, times(r.PeerOverBentoP50), times(r.PeerOverBentoP99),
			strings.Join(runs, " "))
	}
	tw.Flush()
	if len(s.Idle) > 0 {
		fmt.Fprintf(w, "\nIdle relay, nothing committed for %.0f s, CPU in %% of one core:\n", s.IdleSeconds)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "relay\tprocess\tits PostgreSQL backends\ttotal\tclaims\truns (total)\t")
		for _, r := range s.Idle {
			var runs []string
			for _, x := range r.Runs {
				runs = append(runs, fmt.Sprintf("%.2f", x))
			}
			claims := "-"
			if r.Queries > 0 {
				claims = fmt.Sprintf("%.0f", r.Queries)
			}
			fmt.Fprintf(tw, "%s\t%.2f\t%s\t%.2f\t%s\t%s\t\n", r.Label, r.ProcessPercent, backendPercent(r.BackendPercent), r.Total(),
				claims, strings.Join(runs, " "))
		}
		tw.Flush()
	}
}

func backendPercent(x float64) string {
	if x < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", x)
}

// steadySVG draws the steady medians: p50 and p99 per relay and rate, on
// a logarithmic axis (the peer's 1 s poll is hundreds of times slower).
func steadySVG(r *Report) string {
	s := r.Steady
	var bars []bar
	for _, row := range s.Rows {
		label := fmt.Sprintf("%s @ %s/s", shortRelay(row), thousands(row.Rate))
		note := ""
		if row.Achieved < 0.95*row.Rate {
			note = fmt.Sprintf("only %s/s achieved", thousands(row.Achieved))
		}
		family := row.Family
		if family == "dbbus" {
			family = "bento" // bento too, without a broker
		}
		bars = append(bars,
			bar{Label: label + " p50", Value: row.P50, Family: family + "-light"},
			bar{Label: label + " p99", Value: row.P99, Family: family, Note: note})
	}
	sub := fmt.Sprintf("one event per unit of work, %s · %s", runsText(r.Runs), machineText(r.Machine))
	return barChart(chartSpec{
		Title:    "Steady state, commit → consumer latency",
		Subtitle: sub,
		Axis:     "milliseconds, logarithmic (lower is better)",
		Format:   func(v float64) string { return msText(v) },
		Log:      true,
		Bars:     bars,
	})
}

// shortRelay is a relay's name in the chart.
func shortRelay(row SteadyRow) string {
	switch row.Family {
	case "bento":
		return "bento"
	case "dbbus":
		return "bento, database bus"
	}
	return "forwarder " + strings.TrimPrefix(strings.SplitN(row.Key, "@", 2)[0], "watermill-forwarder-") + " poll"
}

// msText formats milliseconds with two significant decimals below 10.
func msText(v float64) string {
	switch {
	case v < 10:
		return fmt.Sprintf("%.2f ms", v)
	case v < 100:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return thousands(v) + " ms"
	}
}

func runsText(n int) string {
	if n > 1 {
		return fmt.Sprintf("median of %d runs", n)
	}
	return "1 run"
}

func machineText(m Machine) string {
	return fmt.Sprintf("%s, %d cores · PostgreSQL %s · %s · %s", m.CPU, m.Cores, pgVersion(m), m.RabbitMQ, m.Go)
}

// pgVersion is the first word of the server version ("15.20").
func pgVersion(m Machine) string {
	if f := strings.Fields(m.PostgreSQL); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// durationsText lists durations as flag values do.
func durationsText(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, d.String())
	}
	return strings.Join(s, ",")
}
