package main

import (
	"context"
	"testing"
	"time"
)

func TestPacerHandsOutEachEventOnceWhenDue(t *testing.T) {
	t.Parallel()
	p := &pacer{rate: 1000, total: 5000}
	for _, c := range []struct {
		at       time.Duration
		from, to int
	}{
		{0, 0, 1},                          // event 0 is due at once
		{0, 1, 1},                          // nothing new at the same instant
		{999 * time.Microsecond, 1, 1},     // event 1 is due at 1 ms
		{time.Millisecond, 1, 2},           // now it is
		{1500 * time.Millisecond, 2, 1501}, // a late tick catches up on everything due
		{time.Second, 1501, 1501},          // time going backwards hands out nothing
		{time.Hour, 1501, 5000},            // never more than the schedule holds
	} {
		from, to := p.next(c.at)
		if from != c.from || to != c.to {
			t.Errorf("next(%v) = [%d, %d), want [%d, %d)", c.at, from, to, c.from, c.to)
		}
	}
	if !p.done() {
		t.Error("done() = false after handing out every event")
	}
	if got := p.dueAt(2500); got != 2500*time.Millisecond {
		t.Errorf("dueAt(2500) = %v, want 2.5s", got)
	}
}

func TestScheduleIsOpenLoop(t *testing.T) {
	t.Parallel()
	// 2,000 events/s for 150 ms: 300 events, each handed out no earlier
	// than due and in order, although nobody reads jobs until the end.
	p := &pacer{rate: 2000, total: 300}
	jobs := make(chan job, p.total)
	start := time.Now()
	schedule(context.Background(), p, start, time.Millisecond, jobs)
	elapsed := time.Since(start)
	if elapsed < 149*time.Millisecond {
		t.Errorf("the schedule ended after %v, before its last event was due (149.5 ms)", elapsed)
	}
	n := 0
	for j := range jobs {
		if j.seq != n {
			t.Fatalf("job %d has seq %d", n, j.seq)
		}
		if want := time.Duration(n) * time.Second / 2000; j.due != want {
			t.Fatalf("job %d due %v, want %v", n, j.due, want)
		}
		n++
	}
	if n != 300 {
		t.Errorf("%d jobs, want 300", n)
	}
}
