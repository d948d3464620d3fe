package main

import (
	"math"
	"testing"
	"time"
)

func TestParseSeq(t *testing.T) {
	t.Parallel()
	a := &Account{}
	a.ID = "acc-1"
	payload := []byte(`{"account_id":"acc-1","amount":1,"reference":"seq-1234","memo":"x"}`)
	if n, err := parseSeq(payload); err != nil || n != 1234 {
		t.Errorf("parseSeq = %d, %v; want 1234", n, err)
	}
	for _, bad := range []string{`{"reference":"abc"}`, `{"reference":"seq-"}`, `{"reference":"seq--1"}`, `not json`} {
		if _, err := parseSeq([]byte(bad)); err == nil {
			t.Errorf("parseSeq(%s) = nil error", bad)
		}
	}
	if seqRef(7) != "seq-7" {
		t.Errorf("seqRef(7) = %q", seqRef(7))
	}
}

func TestTrackerReceiveCountsOnce(t *testing.T) {
	t.Parallel()
	tr := newTracker(3)
	tr.receive(1, 10)
	tr.receive(1, 20)
	tr.receive(5, 30)
	tr.receive(-1, 30)
	if tr.received.Load() != 1 || tr.dup.Load() != 1 || tr.unknowns.Load() != 2 {
		t.Errorf("received %d, dup %d, unknown %d; want 1, 1, 2", tr.received.Load(), tr.dup.Load(), tr.unknowns.Load())
	}
	if tr.recv[1].Load() != 10 {
		t.Errorf("a duplicate overwrote the first receipt: %d", tr.recv[1].Load())
	}
}

func TestSummarizeTracker(t *testing.T) {
	t.Parallel()
	// 100 events/s, the schedule starting 1 s after t0; 20 ms of warm-up
	// (events 0 and 1), then a 100 ms window (events 2..11). Event i
	// starts 1 ms after due, commits 2 ms after due and is received i ms
	// after its commit returned; event 11 never arrives, event 10 arrives
	// 1 ms before its commit returned.
	const rate = 100.0
	start := time.Second
	tr := newTracker(12)
	ms := int64(time.Millisecond)
	for i := range 12 {
		due := int64(start) + int64(i)*10*ms
		tr.started[i].Store(due + ms)
		tr.commit[i].Store(due + 2*ms)
		switch i {
		case 11:
		case 10:
			tr.recv[i].Store(due + ms)
		default:
			tr.recv[i].Store(due + 2*ms + int64(i)*ms)
		}
	}
	r := summarizeTracker(tr, rate, start, start+20*time.Millisecond, start+120*time.Millisecond)
	if r.Scheduled != 10 || r.Committed != 10 || r.Received != 9 || r.Negative != 1 {
		t.Errorf("scheduled %d, committed %d, received %d, negative %d; want 10, 10, 9, 1",
			r.Scheduled, r.Committed, r.Received, r.Negative)
	}
	// Latencies: 2..9 ms and -1 ms.
	if r.Latency.Count != 9 || r.Latency.P50 != 5 || r.Latency.Max != 9 {
		t.Errorf("latency %+v, want 9 samples, p50 5 ms, max 9 ms", r.Latency)
	}
	if r.Commit.P50 != 1 || r.Lag.P99 != 1 {
		t.Errorf("commit p50 %v ms, lag p99 %v ms; want 1 and 1", r.Commit.P50, r.Lag.P99)
	}
	// 10 events in the 100 ms window (the last commit returned inside it).
	if math.Abs(r.Achieved-100) > 1e-9 {
		t.Errorf("achieved %v/s, want 100", r.Achieved)
	}
}

func TestSummarizeTrackerSlowWriters(t *testing.T) {
	t.Parallel()
	// 1,000/s offered for 100 ms after 20 ms of warm-up, but the writers
	// commit only one every 2 ms and stop at the end of the schedule:
	// events 0..59 started, 10..59 in the window, 500/s achieved.
	tr := newTracker(120)
	for i := range 60 {
		tr.started[i].Store(int64(i) * int64(2*time.Millisecond))
		tr.commit[i].Store(int64(i+1) * int64(2*time.Millisecond))
	}
	r := summarizeTracker(tr, 1000, 0, 20*time.Millisecond, 120*time.Millisecond)
	if r.Scheduled != 100 || r.Committed != 50 {
		t.Errorf("scheduled %d, committed %d; want 100, 50", r.Scheduled, r.Committed)
	}
	if math.Abs(r.Achieved-500) > 1e-9 {
		t.Errorf("achieved %v/s, want 500", r.Achieved)
	}
	if r.Lag.Max != 59 {
		t.Errorf("lag max %v ms, want 59 (event 59 due at 59 ms, started at 118 ms)", r.Lag.Max)
	}
	if r.Received != 0 || r.Latency.Count != 0 {
		t.Errorf("received %d with %d latencies, want none", r.Received, r.Latency.Count)
	}
}

func TestDeal(t *testing.T) {
	t.Parallel()
	hands := deal([]int{0, 1, 2, 3, 4, 5, 6}, 3)
	if len(hands) != 3 || len(hands[0]) != 3 || len(hands[2]) != 2 || hands[1][1] != 4 {
		t.Errorf("deal = %v, want [[0 3 6] [1 4] [2 5]]", hands)
	}
}
