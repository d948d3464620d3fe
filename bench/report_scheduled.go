package main

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// ScheduledReport is the scheduled scenario over all runs.
type ScheduledReport struct {
	Config scheduledConfig   `json:"config"`
	Runs   []scheduledResult `json:"runs"`
	Rows   []ScheduledRow    `json:"medians"`
	// BentoOverPeer compares bento's median lag percentiles with the
	// bare poller's (below 1: bento is less late).
	BentoOverPeerP50 float64 `json:"bento_over_peer_p50,omitempty"`
	BentoOverPeerP95 float64 `json:"bento_over_peer_p95,omitempty"`
	BentoOverPeerP99 float64 `json:"bento_over_peer_p99,omitempty"`
	// Cancel is the median cancel rate achieved over the runs, and the
	// sums of what went wrong.
	CancelAchieved float64 `json:"cancel_achieved_per_second,omitempty"`
	// CancelPeerAchieved is the bare DELETE's median rate, and
	// CancelOverPeer bento's median over it (1: as fast).
	CancelPeerAchieved float64 `json:"cancel_peer_achieved_per_second,omitempty"`
	CancelOverPeer     float64 `json:"cancel_over_peer,omitempty"`
	CancelTooLate      int     `json:"cancel_too_late"`
	Lost               int     `json:"lost"`
	Duplicates         int     `json:"duplicate_deliveries"`
	CancelledDelivered int     `json:"cancelled_delivered"`
}

// ScheduledRow is the median over runs of one relay's lag percentiles.
type ScheduledRow struct {
	Key        string  `json:"key"`
	Label      string  `json:"label"`
	P50        float64 `json:"lag_p50_ms"`
	P95        float64 `json:"lag_p95_ms"`
	P99        float64 `json:"lag_p99_ms"`
	Max        float64 `json:"lag_max_ms"`
	Received   int     `json:"received_min"`
	Messages   int     `json:"messages"`
	Duplicates int     `json:"duplicate_deliveries"`
}

func summarizeScheduled(runs []scheduledResult, cfg scheduledConfig) *ScheduledReport {
	s := &ScheduledReport{Config: cfg, Runs: runs}
	if len(runs) == 0 {
		return s
	}
	for k, first := range runs[0].Relays {
		var p50, p95, p99, mx []float64
		row := ScheduledRow{Key: first.Key, Label: first.Label, Received: first.Received, Messages: first.Messages}
		for _, run := range runs {
			if k >= len(run.Relays) {
				continue
			}
			r := run.Relays[k]
			p50, p95, p99, mx = append(p50, r.Lag.P50), append(p95, r.Lag.P95), append(p99, r.Lag.P99), append(mx, r.Lag.Max)
			row.Received = min(row.Received, r.Received)
			row.Duplicates += r.Duplicates
		}
		row.P50, row.P95, row.P99, row.Max = median(p50), median(p95), median(p99), median(mx)
		s.Rows = append(s.Rows, row)
	}
	if len(s.Rows) > 1 {
		b, p := s.Rows[0], s.Rows[1]
		s.BentoOverPeerP50, s.BentoOverPeerP95, s.BentoOverPeerP99 = ratio(b.P50, p.P50), ratio(b.P95, p.P95), ratio(b.P99, p.P99)
	}
	var rates, peer []float64
	for _, run := range runs {
		if c := run.Cancel; c != nil {
			rates = append(rates, c.Achieved)
			if c.PeerAchieved > 0 {
				peer = append(peer, c.PeerAchieved)
			}
			s.CancelTooLate += c.TooLate
			s.Lost += c.Lost
			s.Duplicates += c.Duplicates
			s.CancelledDelivered += c.CancelledDelivered
		}
	}
	s.CancelAchieved, s.CancelPeerAchieved = median(rates), median(peer)
	s.CancelOverPeer = ratio(s.CancelAchieved, s.CancelPeerAchieved)
	return s
}

// scheduledTargets are the targets for scheduled messages.
func scheduledTargets(s *ScheduledReport) []Target {
	if len(s.Rows) == 0 {
		return nil
	}
	b := s.Rows[0]
	ts := []Target{
		{Name: "scheduled: lag from due time, p50", Want: "< 50 ms", Got: b.P50, Met: b.P50 < 50},
		{Name: "scheduled: lag from due time, p99", Want: "< 500 ms", Got: b.P99, Met: b.P99 < 500},
		{Name: "scheduled: messages delivered of scheduled", Want: "all", Got: float64(b.Received), Met: b.Received == b.Messages},
	}
	if s.Config.CancelMessages > 0 {
		ts = append(ts,
			Target{Name: "scheduled: cancels per second achieved", Want: fmt.Sprintf(">= %.0f", s.Config.CancelRate),
				Got: s.CancelAchieved, Met: s.CancelAchieved >= s.Config.CancelRate},
			Target{Name: "scheduled: lost or cancelled-but-delivered messages", Want: "0",
				Got: float64(s.Lost + s.CancelledDelivered), Met: s.Lost+s.CancelledDelivered == 0})
	}
	return ts
}

func printScheduled(w io.Writer, s *ScheduledReport) {
	c := s.Config
	fmt.Fprintf(w, "\nScheduled: %s messages due over %v (the first %v after scheduling starts), lag = consumer receipt - due_at\n",
		thousands(float64(c.Messages)), c.Spread, c.Lead)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "relay\tp50 ms\tp95 ms\tp99 ms\tmax ms\treceived\tduplicates\t")
	for _, r := range s.Rows {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%d/%d\t%d\t\n", r.Label, r.P50, r.P95, r.P99, r.Max, r.Received, r.Messages, r.Duplicates)
	}
	tw.Flush()
	if s.BentoOverPeerP50 > 0 {
		fmt.Fprintf(w, "bento / bare poller: p50 %.2f, p95 %.2f, p99 %.2f\n", s.BentoOverPeerP50, s.BentoOverPeerP95, s.BentoOverPeerP99)
	}
	if c.CancelMessages > 0 {
		fmt.Fprintf(w, "cancel: %d per transaction, %s/s offered, %s/s achieved (median); %d too late, %d lost, %d duplicates, %d cancelled but delivered (all runs)\n",
			c.cancelsPerTx(), thousands(c.CancelRate), thousands(s.CancelAchieved), s.CancelTooLate, s.Lost, s.Duplicates, s.CancelledDelivered)
		if s.CancelPeerAchieved > 0 {
			fmt.Fprintf(w, "cancel peer (bare DELETE by key, the same pacing): %s/s achieved (median); bento / peer %.2f\n",
				thousands(s.CancelPeerAchieved), s.CancelOverPeer)
		}
	}
}
