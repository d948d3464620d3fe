package main

import (
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	t.Parallel()
	// A command name with a space and a parenthesis, utime 250, stime 50.
	stat := "4242 (postgres: x) y) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 50 0 0 20 0 1 0 100 1000 200"
	got, err := parseProcStat(stat)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3 * time.Second; got != want {
		t.Errorf("parseProcStat = %v, want %v", got, want)
	}
	for _, bad := range []string{"no parens here", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 u 5"} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q) = nil error", bad)
		}
	}
}

func TestProcessCPUAdvances(t *testing.T) {
	t.Parallel()
	a, err := processCPU()
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for start := time.Now(); time.Since(start) < 30*time.Millisecond; {
		x++ // burn CPU
	}
	b, err := processCPU()
	if err != nil {
		t.Fatal(err)
	}
	if b-a < 10*time.Millisecond {
		t.Errorf("30 ms of busy loop (%d turns) used %v of CPU", x, b-a)
	}
}

func TestCPUDelta(t *testing.T) {
	t.Parallel()
	before := map[int]time.Duration{1: time.Second, 2: 2 * time.Second}
	after := map[int]time.Duration{1: 1500 * time.Millisecond, 3: 100 * time.Millisecond} // 2 ended, 3 started
	if got, want := cpuDelta(before, after), 600*time.Millisecond; got != want {
		t.Errorf("cpuDelta = %v, want %v", got, want)
	}
}
