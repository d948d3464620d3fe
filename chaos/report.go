package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Report is what a campaign ran and what its checker found.
type Report struct {
	Stack Stack
	// Seed replays the schedule (Config.Seed).
	Seed     uint64
	Duration time.Duration
	// Schedule is the faults drawn from the seed, in order; Faults counts
	// them by kind.
	Schedule []Event
	Faults   map[Fault]int
	// Timeline is what happened, as it happened: each fault as it struck,
	// the healing and the settling.
	Timeline []string
	// Commands is how many commands the writers ran, CommandErrors how
	// many of them failed (conflicts past the retries, a long
	// transaction's lock); Commits how many events the commit ledger
	// holds (the handlers' chained events included).
	Commands, CommandErrors, Commits int
	// Groups counts, per group (by the System's name), what the checker
	// saw.
	Groups map[string]GroupCounts
	// Starts counts the processes started, restarts included.
	Starts int
	// Complete reports whether everything committed was applied (or
	// dead-lettered, for poison) within Settle of the faults healing, and
	// Quiet how long that took (Settle when it never was).
	Complete bool
	Quiet    time.Duration
	// Violations are the broken guarantees; none in a good run.
	Violations []Violation
}

// String sums the report up on a few lines: the run, the counts, the
// schedule's faults by kind and the violations by kind.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s seed %d: %d commands (%d failed), %d events committed, %d process starts, ",
		r.Stack, r.Seed, r.Commands, r.CommandErrors, r.Commits, r.Starts)
	if r.Complete {
		fmt.Fprintf(&b, "everything applied %.1fs after the faults healed\n", r.Quiet.Seconds())
	} else {
		fmt.Fprintf(&b, "NOT everything applied %.0fs after the faults healed\n", r.Quiet.Seconds())
	}
	var faults []string
	for _, f := range sortedFaults(r.Faults) {
		faults = append(faults, fmt.Sprintf("%s %d", f, r.Faults[f]))
	}
	fmt.Fprintf(&b, "  faults: %d (%s)\n", len(r.Schedule), strings.Join(faults, ", "))
	names := make([]string, 0, len(r.Groups))
	for n := range r.Groups {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		g := r.Groups[n]
		fmt.Fprintf(&b, "  group %s: %d expected, %d applied, %d dead letters (%d poison), %d held behind poison; commit to apply p50 %v, p99 %v, max %v\n",
			n, g.Expected, g.Applied, g.Dead, g.Poison, g.Held, g.LagP50.Round(time.Millisecond), g.LagP99.Round(time.Millisecond), g.LagMax.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "  %s", summary(r.Violations))
	return b.String()
}

// TimelineString is the timeline, one event a line.
func (r *Report) TimelineString() string { return strings.Join(r.Timeline, "\n") }
