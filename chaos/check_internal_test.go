package chaos

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
)

// fakeLedger builds a ledger from commits and applications.
func fakeLedger(commits []commitRow, applied ...appliedRow) *ledger {
	l := &ledger{commits: map[string]commitRow{}, byAgg: map[string][]commitRow{}, applied: map[string][]appliedRow{}}
	for _, c := range commits {
		l.commits[c.EventID] = c
		k := c.AggregateType + "/" + c.AggregateID
		l.byAgg[k] = append(l.byAgg[k], c)
	}
	for _, a := range applied {
		l.applied[a.Grp] = append(l.applied[a.Grp], a)
	}
	return l
}

func ev(agg string, v int64, poison bool) commitRow {
	return commitRow{EventID: agg + "-" + string(rune('0'+v)), Topic: "t.x", AggregateType: "x", AggregateID: agg, Version: v, Poison: poison}
}

func app(c commitRow) appliedRow {
	return appliedRow{Grp: "g.run", MessageID: c.EventID, Topic: c.Topic, AggregateType: c.AggregateType, AggregateID: c.AggregateID, Version: c.Version}
}

func kinds(vs []Violation) []ViolationKind {
	var out []ViolationKind
	for _, v := range vs {
		out = append(out, v.Kind)
	}
	slices.Sort(out)
	return out
}

// TestCheckerFindsEachViolation: the checker passes a run that kept every
// guarantee and names each way a run can break one.
func TestCheckerFindsEachViolation(t *testing.T) {
	a1, a2, a3 := ev("a", 1, false), ev("a", 2, false), ev("a", 3, false)
	p1, p2, p3 := ev("p", 1, false), ev("p", 2, true), ev("p", 3, false)
	all := []commitRow{a1, a2, a3, p1, p2, p3}
	ordered := func(dead ...commitRow) *groupView {
		g := &groupView{name: "g", run: "g.run", topics: []string{"t.x"}, ordered: true}
		for _, d := range dead {
			g.dead = append(g.dead, consumer.DeadLetter{MessageID: d.EventID, AggregateID: d.AggregateID, AggregateVersion: d.Version})
		}
		return g
	}
	held := func(g *groupView) *groupView {
		g.held = []inbox.Hold{{AggregateType: "x", AggregateID: "p", Version: 2, MessageID: p2.EventID}}
		g.parked = []inbox.Parked{{AggregateType: "x", AggregateID: "p", Version: 3, MessageID: p3.EventID}}
		return g
	}

	t.Run("a good run", func(t *testing.T) {
		slow := app(a2)
		slow.At = a2.At.Add(30 * time.Second)
		g := held(ordered(p2))
		g.maxLag = time.Minute
		counts, complete, vs := check(fakeLedger(all, app(a1), slow, app(a3), app(p1)), g, true)
		assert.True(t, complete)
		assert.Empty(t, vs)
		assert.Equal(t, GroupCounts{Expected: 4, Applied: 4, Dead: 1, Poison: 1, Held: 1,
			LagP50: 0, LagP99: 30 * time.Second, LagMax: 30 * time.Second}, counts)
	})
	cases := []struct {
		name    string
		l       *ledger
		g       *groupView
		want    []ViolationKind
		partial bool // the run is not complete
	}{
		{"lost", fakeLedger(all, app(a1), app(a2), app(p1)), held(ordered(p2)), []ViolationKind{Lost}, true},
		{"skipped", fakeLedger(all, app(a1), app(a3), app(p1)), held(ordered(p2)), []ViolationKind{Skipped}, true},
		{"duplicate", fakeLedger(all, app(a1), app(a2), app(a2), app(a3), app(p1)), held(ordered(p2)), []ViolationKind{Duplicate}, false},
		{"out of order", fakeLedger(all, app(a2), app(a1), app(a3), app(p1)), held(ordered(p2)), []ViolationKind{OutOfOrder}, false},
		{"past a hold", fakeLedger(all, app(a1), app(a2), app(a3), app(p1), app(p3)), ordered(p2), []ViolationKind{PastHold}, false},
		{"healthy dead letter", fakeLedger(all, app(a1), app(a3), app(p1)), held(ordered(p2, a2)), []ViolationKind{HealthyDeadLetter}, true},
		{"poison applied", fakeLedger(all, app(a1), app(a2), app(a3), app(p1), app(p2)), held(ordered()), []ViolationKind{PoisonApplied}, false},
		{"poison never dead-lettered", fakeLedger(all, app(a1), app(a2), app(a3), app(p1)), held(ordered()), []ViolationKind{Lost}, true},
		{"phantom", fakeLedger(all, app(a1), app(a2), app(a3), app(p1), app(ev("z", 1, false))), held(ordered(p2)), []ViolationKind{Phantom}, false},
		{"left held", fakeLedger(all, app(a1), app(a2), app(p1)), func() *groupView {
			g := held(ordered(p2))
			g.held = append(g.held, inbox.Hold{AggregateType: "x", AggregateID: "a", Version: 3})
			return g
		}(), []ViolationKind{LeftHeld, Lost}, true},
	}
	late := app(a3)
	late.At = a3.At.Add(2 * time.Minute)
	cases = append(cases, struct {
		name    string
		l       *ledger
		g       *groupView
		want    []ViolationKind
		partial bool
	}{"stalled", fakeLedger(all, app(a1), app(a2), late, app(p1)), func() *groupView {
		g := held(ordered(p2))
		g.maxLag = time.Minute
		return g
	}(), []ViolationKind{Stalled}, false})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, complete, vs := check(c.l, c.g, true)
			assert.Equal(t, c.want, kinds(vs), "%v", vs)
			assert.Equal(t, !c.partial, complete)
			_, _, none := check(c.l, c.g, false)
			assert.Empty(t, none, "only the final check reports violations")
		})
	}

	t.Run("unpartitioned groups have no order and no hold", func(t *testing.T) {
		g := ordered(p2)
		g.ordered = false
		_, complete, vs := check(fakeLedger(all, app(a2), app(a1), app(a3), app(p1), app(p3)), g, true)
		assert.True(t, complete)
		assert.Empty(t, vs)
	})
}

// TestScheduleIsASeedsFunction: a seed gives the same schedule each time,
// another seed another one, with only the faults asked for, targets among
// the processes named, inside the campaign's duration.
func TestScheduleIsASeedsFunction(t *testing.T) {
	faults := PostgresRabbitMQ.Faults()
	procs := []string{"projector-1", "g-1"}
	a := schedule(42, faults, 5*time.Minute, 3*time.Second, procs, []string{"g"}, true)
	b := schedule(42, faults, 5*time.Minute, 3*time.Second, procs, []string{"g"}, true)
	c := schedule(43, faults, 5*time.Minute, 3*time.Second, procs, []string{"g"}, true)
	require.NotEmpty(t, a)
	assert.Equal(t, a, b)
	assert.NotEqual(t, a, c)
	seen := map[Fault]bool{}
	for _, e := range a {
		seen[e.Fault] = true
		assert.Less(t, e.At, 5*time.Minute)
		switch {
		case e.Fault == Churn:
			assert.Equal(t, "g", e.Target)
		case e.Fault.processFault():
			assert.Contains(t, procs, e.Target)
		default:
			assert.Empty(t, e.Target)
		}
	}
	assert.Len(t, seen, len(faults), "five minutes draw every kind")
	only := schedule(42, []Fault{Kill}, time.Minute, time.Second, procs, nil, true)
	for _, e := range only {
		assert.Equal(t, Kill, e.Fault)
	}
}

// TestConfigErrors: a config that cannot run names each bad field.
func TestConfigErrors(t *testing.T) {
	c := (&Config{Stack: SQLiteDatabaseBus, Faults: []Fault{BrokerCut}, Rate: -1}).withDefaults()
	err := c.validate(&System{Groups: []Group{{Name: "g"}}})
	require.ErrorIs(t, err, ErrInvalidConfig)
	for _, want := range []string{"broker-cut", "Rate", "System.Command", "topic", "Register"} {
		assert.Contains(t, err.Error(), want)
	}
	c = (&Config{Stack: PostgresRabbitMQ, PostgresDSN: "host=x", AMQPURL: "amqp://h:5672/"}).withDefaults()
	assert.ErrorIs(t, c.validate(&System{}), ErrInvalidConfig)
}
