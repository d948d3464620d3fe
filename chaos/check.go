package chaos

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
)

// ViolationKind names what a violation broke.
type ViolationKind string

// The checker's violations.
const (
	// Lost: a committed event the group should have applied was neither
	// applied nor dead-lettered by the end of Settle.
	Lost ViolationKind = "lost"
	// Skipped: like Lost, but a later event of the same aggregate was
	// applied: the group went past it without a dead letter.
	Skipped ViolationKind = "skipped"
	// Duplicate: an event's effect was applied more than once.
	Duplicate ViolationKind = "duplicate"
	// OutOfOrder: in a partitioned group, an aggregate's event was applied
	// after one of a higher version.
	OutOfOrder ViolationKind = "out-of-order"
	// PastHold: in a partitioned group, an event was applied after an
	// earlier event of its aggregate was dead-lettered (hold-back broken).
	PastHold ViolationKind = "past-hold"
	// HealthyDeadLetter: a dead letter of an event that is not poison.
	HealthyDeadLetter ViolationKind = "healthy-dead-letter"
	// PoisonApplied: a poison event applied.
	PoisonApplied ViolationKind = "poison-applied"
	// Phantom: an application or a dead letter of an event that was
	// never committed.
	Phantom ViolationKind = "phantom"
	// LeftHeld: an aggregate held back or parked without a dead letter of
	// it to answer for it.
	LeftHeld ViolationKind = "left-held"
	// Stalled: an event applied longer than Config.MaxLag after it was
	// committed, faults or not: the system stood still meanwhile.
	Stalled ViolationKind = "stalled"
)

// Violation is one broken guarantee the checker found.
type Violation struct {
	Kind  ViolationKind
	Group string
	// EventID, AggregateID and Version identify the event (EventID may be
	// empty for LeftHeld).
	EventID     string
	AggregateID string
	Version     int64
	Detail      string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: group %s, %s v%d (%s) %s", v.Kind, v.Group, v.AggregateID, v.Version, v.EventID, v.Detail)
}

// GroupCounts is what the checker counted for one group.
type GroupCounts struct {
	// Expected is how many committed events the group should apply
	// (bar poison and the events held back behind it).
	Expected int
	// Applied is how many applications the ledger holds.
	Applied int
	// Dead is how many dead letters the group holds; Poison how many of
	// them are poison.
	Dead, Poison int
	// Held is how many events wait held back behind a poison dead letter.
	Held int
	// LagP50, LagP99 and LagMax are the times from an event's commit to
	// its first application, over the events applied.
	LagP50, LagP99, LagMax time.Duration
}

// ledger is what the checker reads.
type ledger struct {
	commits map[string]commitRow // by event id
	byAgg   map[string][]commitRow
	applied map[string][]appliedRow // by group, in ledger order
}

func readLedger(ctx context.Context, db *gorm.DB) (*ledger, error) {
	var commits []commitRow
	if err := db.WithContext(ctx).Order("id").Find(&commits).Error; err != nil {
		return nil, fmt.Errorf("chaos: read the commit ledger: %w", err)
	}
	var applied []appliedRow
	if err := db.WithContext(ctx).Order("id").Find(&applied).Error; err != nil {
		return nil, fmt.Errorf("chaos: read the applied ledger: %w", err)
	}
	l := &ledger{commits: map[string]commitRow{}, byAgg: map[string][]commitRow{}, applied: map[string][]appliedRow{}}
	for _, c := range commits {
		l.commits[c.EventID] = c
		k := c.AggregateType + "/" + c.AggregateID
		l.byAgg[k] = append(l.byAgg[k], c)
	}
	for _, list := range l.byAgg {
		slices.SortFunc(list, func(a, b commitRow) int { return int(a.Version - b.Version) })
	}
	for _, a := range applied {
		l.applied[a.Grp] = append(l.applied[a.Grp], a)
	}
	return l, nil
}

// groupView is one group as the checker sees it.
type groupView struct {
	name       string // the System's name
	run        string // its name in the run
	topics     []string
	ordered    bool
	maxLag     time.Duration // 0: no bound
	dead       []consumer.DeadLetter
	held       []inbox.Hold
	parked     []inbox.Parked
	inspectErr error
}

// check compares the ledgers with what each group should have done. With
// final false it only reports whether the run is complete (every event
// that should be applied is, every poison is dead-lettered); with final
// true it also returns every violation.
func check(l *ledger, g *groupView, final bool) (GroupCounts, bool, []Violation) {
	var out []Violation
	var counts GroupCounts
	add := func(kind ViolationKind, c commitRow, id string, detail string) {
		if final {
			out = append(out, Violation{Kind: kind, Group: g.name, EventID: id, AggregateID: c.AggregateID, Version: c.Version, Detail: detail})
		}
	}
	deadBy := map[string]consumer.DeadLetter{}
	for _, d := range g.dead {
		deadBy[d.MessageID] = d
		c, ok := l.commits[d.MessageID]
		switch {
		case !ok:
			add(Phantom, commitRow{AggregateID: d.AggregateID, Version: d.AggregateVersion}, d.MessageID, "dead-lettered, never committed")
		case !c.Poison:
			add(HealthyDeadLetter, c, d.MessageID, fmt.Sprintf("cause %q: %s", d.Cause, d.Error))
		default:
			counts.Poison++
		}
	}
	counts.Dead = len(g.dead)
	appliedN := map[string]int{}
	lastVersion := map[string]int64{}
	for _, a := range l.applied[g.run] {
		appliedN[a.MessageID]++
		c, ok := l.commits[a.MessageID]
		if !ok {
			add(Phantom, commitRow{AggregateID: a.AggregateID, Version: a.Version}, a.MessageID, "applied, never committed")
			continue
		}
		if appliedN[a.MessageID] == 2 {
			add(Duplicate, c, a.MessageID, "applied more than once")
		}
		k := c.AggregateType + "/" + c.AggregateID
		if g.ordered && appliedN[a.MessageID] == 1 {
			if last, seen := lastVersion[k]; seen && c.Version < last {
				add(OutOfOrder, c, a.MessageID, fmt.Sprintf("applied after v%d", last))
			}
			lastVersion[k] = max(lastVersion[k], c.Version)
		}
		if c.Poison {
			add(PoisonApplied, c, a.MessageID, "")
		}
	}
	counts.Applied = len(l.applied[g.run])
	var lags []time.Duration
	first := map[string]bool{}
	for _, a := range l.applied[g.run] {
		c, ok := l.commits[a.MessageID]
		if !ok || first[a.MessageID] {
			continue
		}
		first[a.MessageID] = true
		lag := a.At.Sub(c.At)
		lags = append(lags, lag)
		if g.maxLag > 0 && lag > g.maxLag {
			add(Stalled, c, a.MessageID, fmt.Sprintf("applied %v after its commit", lag.Round(time.Second)))
		}
	}
	if len(lags) > 0 {
		slices.Sort(lags)
		counts.LagP50, counts.LagP99, counts.LagMax = lags[len(lags)/2], lags[len(lags)*99/100], lags[len(lags)-1]
	}
	complete := true
	heldAggs := map[string]bool{}
	for k, list := range l.byAgg {
		blocked := false      // an earlier event of the aggregate is poison (partitioned groups hold it back)
		var lastApplied int64 // the highest version of the aggregate the group applied
		for _, c := range list {
			if appliedN[c.EventID] > 0 && slices.Contains(g.topics, c.Topic) {
				lastApplied = max(lastApplied, c.Version)
			}
		}
		for _, c := range list {
			if !slices.Contains(g.topics, c.Topic) {
				continue
			}
			switch {
			case blocked:
				counts.Held++
				heldAggs[k] = true
				if appliedN[c.EventID] > 0 {
					add(PastHold, c, c.EventID, "applied after its aggregate's poison was dead-lettered")
				}
			case c.Poison:
				if _, ok := deadBy[c.EventID]; !ok && appliedN[c.EventID] == 0 {
					complete = false
					add(Lost, c, c.EventID, "poison, not dead-lettered")
				}
				if g.ordered {
					blocked = true
					heldAggs[k] = true
				}
			default:
				counts.Expected++
				if appliedN[c.EventID] > 0 {
					continue
				}
				complete = false
				if _, ok := deadBy[c.EventID]; ok {
					continue // reported as a healthy dead letter
				}
				if c.Version < lastApplied {
					add(Skipped, c, c.EventID, "a later event of the aggregate was applied")
				} else {
					add(Lost, c, c.EventID, "never applied")
				}
			}
		}
	}
	if final {
		if g.inspectErr != nil {
			out = append(out, Violation{Kind: LeftHeld, Group: g.name, Detail: "inspect: " + g.inspectErr.Error()})
		}
		for _, h := range g.held {
			if !heldAggs[h.AggregateType+"/"+h.AggregateID] {
				out = append(out, Violation{Kind: LeftHeld, Group: g.name, AggregateID: h.AggregateID, Version: h.Version, EventID: h.MessageID, Detail: "held, no poison of it"})
			}
		}
		for _, p := range g.parked {
			if !heldAggs[p.AggregateType+"/"+p.AggregateID] {
				out = append(out, Violation{Kind: LeftHeld, Group: g.name, AggregateID: p.AggregateID, Version: p.Version, EventID: p.MessageID, Detail: "parked (" + p.Reason + "), no poison of it"})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Kind < out[j].Kind })
	return counts, complete, out
}

// summary is a one-line count of violations by kind.
func summary(vs []Violation) string {
	if len(vs) == 0 {
		return "no violations"
	}
	n := map[ViolationKind]int{}
	for _, v := range vs {
		n[v.Kind]++
	}
	var parts []string
	for k, c := range n {
		parts = append(parts, fmt.Sprintf("%s %d", k, c))
	}
	slices.Sort(parts)
	return fmt.Sprintf("%d violations: %s", len(vs), strings.Join(parts, ", "))
}
