package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Fault is a kind of fault the campaign's nemesis injects.
type Fault string

// The faults. A process fault strikes one process (a projector or a
// consumer instance), which its supervisor restarts when it dies; a link
// fault strikes the link of one process to the database or to the broker,
// through a TCP proxy of its own.
const (
	// Kill sends SIGKILL.
	Kill Fault = "kill"
	// Pause sends SIGSTOP, then SIGCONT after a while, sometimes longer
	// than the lease and take-over times: the process wakes up believing
	// it still owns what others took over.
	Pause Fault = "pause"
	// CrashLoop kills the process again shortly after each of several
	// restarts, as a process that dies during start-up is restarted by
	// its supervisor.
	CrashLoop Fault = "crash-loop"
	// Churn starts one more instance of a consumer group and stops it
	// (SIGTERM) a while later: the group's partitions move twice.
	Churn Fault = "churn"
	// DBCut closes the process's database connections and refuses new
	// ones for a while.
	DBCut Fault = "db-cut"
	// DBHang stops moving bytes on the database link without closing it
	// (bytes accepted, nothing answered) for a while.
	DBHang Fault = "db-hang"
	// DBSlow delays every exchange on the database link.
	DBSlow Fault = "db-slow"
	// BrokerCut, BrokerHang and BrokerSlow do the same to the RabbitMQ
	// link.
	BrokerCut  Fault = "broker-cut"
	BrokerHang Fault = "broker-hang"
	BrokerSlow Fault = "broker-slow"
	// LongTx runs one command in a transaction that stays open a while
	// before it commits: its events commit long after their ids and
	// occurred-at times were taken, behind events committed meanwhile.
	LongTx Fault = "long-tx"
	// ClockSkew shifts the writers' clock (which stamps event ids and
	// occurred-at times) by minutes, forward or back, for a while.
	ClockSkew Fault = "clock-skew"
	// Analyze runs ANALYZE on every table of the run's schema, so the
	// planner's statistics describe whatever pile-up there is then.
	Analyze Fault = "analyze"
)

// Faults returns the kinds of fault the stack has: every kind on
// PostgresRabbitMQ; no broker faults on PostgresDatabaseBus; on
// SQLiteDatabaseBus neither link faults nor Analyze.
func (s Stack) Faults() []Fault {
	out := []Fault{Kill, Pause, CrashLoop, Churn, LongTx, ClockSkew}
	if s.postgres() {
		out = append(out, DBCut, DBHang, DBSlow, Analyze)
	}
	if s == PostgresRabbitMQ {
		out = append(out, BrokerCut, BrokerHang, BrokerSlow)
	}
	return out
}

// processFault reports whether f strikes a process (or its links), and so
// needs a target.
func (f Fault) processFault() bool {
	switch f {
	case LongTx, ClockSkew, Analyze:
		return false
	}
	return true
}

// Event is one fault in a campaign's schedule.
type Event struct {
	// At is when it strikes, from the start of the campaign.
	At time.Duration
	// Fault is its kind.
	Fault Fault
	// Target is the process it strikes (a slot name, such as
	// "projector-1" or "orders-2"), or the group Churn adds an instance
	// to; empty for faults of the whole system.
	Target string
	// For is how long it lasts (a pause, a cut, a skew, an open
	// transaction, an added instance).
	For time.Duration
	// Times is how many times CrashLoop kills its target.
	Times int
	// Skew is ClockSkew's shift, or DBSlow's and BrokerSlow's delay.
	Skew time.Duration
}

func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%7.1fs %-11s", e.At.Seconds(), e.Fault)
	if e.Target != "" {
		fmt.Fprintf(&b, " %s", e.Target)
	}
	if e.For > 0 {
		fmt.Fprintf(&b, " for %.1fs", e.For.Seconds())
	}
	if e.Times > 0 {
		fmt.Fprintf(&b, " x%d", e.Times)
	}
	if e.Skew != 0 {
		fmt.Fprintf(&b, " (%v)", e.Skew)
	}
	return b.String()
}

// schedule draws the faults of a campaign from seed: their kinds among
// faults, their times, targets among processes (slot names) and groups,
// and their lengths. The same arguments give the same schedule.
func schedule(seed uint64, faults []Fault, duration, meanGap time.Duration, processes, groups []string, postgres bool) []Event {
	if len(faults) == 0 || duration <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(seed, 0x6e656d65736973)) // "nemesis"
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	var out []Event
	at := between(meanGap/2, meanGap)
	for at < duration-2*time.Second {
		e := Event{At: at, Fault: faults[rng.IntN(len(faults))]}
		if e.Fault.processFault() && e.Fault != Churn {
			e.Target = processes[rng.IntN(len(processes))]
		}
		switch e.Fault {
		case Kill:
		case Pause:
			e.For = between(time.Second, 20*time.Second)
		case CrashLoop:
			e.Times = 3 + rng.IntN(4)
		case Churn:
			e.Target = groups[rng.IntN(len(groups))]
			e.For = between(3*time.Second, 20*time.Second)
		case DBCut, BrokerCut, DBHang, BrokerHang:
			e.For = between(time.Second, 15*time.Second)
		case DBSlow, BrokerSlow:
			e.For = between(2*time.Second, 15*time.Second)
			e.Skew = between(5*time.Millisecond, 200*time.Millisecond)
		case LongTx:
			if postgres {
				e.For = between(time.Second, 20*time.Second)
			} else {
				e.For = between(200*time.Millisecond, 3*time.Second) // SQLite: every writer waits behind it
			}
		case ClockSkew:
			e.For = between(2*time.Second, 20*time.Second)
			e.Skew = between(time.Second, 10*time.Minute)
			if rng.IntN(2) == 0 {
				e.Skew = -e.Skew
			}
		case Analyze:
		}
		out = append(out, e)
		at += between(meanGap/4, meanGap*7/4)
	}
	return out
}

// countFaults counts a schedule's faults by kind.
func countFaults(events []Event) map[Fault]int {
	out := map[Fault]int{}
	for _, e := range events {
		out[e.Fault]++
	}
	return out
}

// sortedFaults returns the kinds of m in name order.
func sortedFaults(m map[Fault]int) []Fault {
	out := make([]Fault, 0, len(m))
	for f := range m {
		out = append(out, f)
	}
	slices.Sort(out)
	return out
}
