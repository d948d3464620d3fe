package main

import (
	"context"
	"math"
	"time"
)

// pacer is an open-loop schedule: event i is due at i/rate after the
// start, whether or not the events before it are done, so slow commits
// never slow the offered load down (a closed loop would hide them).
type pacer struct {
	rate   float64 // events per second
	total  int     // events in the schedule
	issued int     // events handed out so far
}

// dueAt returns when event i is due, counted from the start.
func (p *pacer) dueAt(i int) time.Duration {
	return time.Duration(float64(i) / p.rate * float64(time.Second))
}

// next returns the sequence numbers [from, to) that have come due by
// elapsed and were not handed out before, and marks them handed out.
// Event 0 is due at once.
func (p *pacer) next(elapsed time.Duration) (from, to int) {
	due := int(math.Floor(elapsed.Seconds()*p.rate)) + 1
	due = min(max(due, 0), p.total)
	from = p.issued
	if due > from {
		p.issued = due
	}
	return from, p.issued
}

// done reports whether every event of the schedule was handed out.
func (p *pacer) done() bool { return p.issued >= p.total }

// job is one scheduled event: its sequence number and when it was due.
type job struct {
	seq int
	due time.Duration
}

// schedule hands the events of p to jobs as they come due, checking every
// tick, and closes jobs once all are handed out or ctx ends. jobs should
// hold p.total events so a writer backlog never delays the schedule.
func schedule(ctx context.Context, p *pacer, start time.Time, tick time.Duration, jobs chan<- job) {
	defer close(jobs)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		from, to := p.next(time.Since(start))
		for i := from; i < to; i++ {
			select {
			case jobs <- job{seq: i, due: p.dueAt(i)}:
			case <-ctx.Done():
				return
			}
		}
		if p.done() {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
