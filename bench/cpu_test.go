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
	// Burn CPU until getrusage shows 20 ms more; on a busy machine that
	// takes longer than 20 ms of wall time, but not 5 s.
	deadline := time.Now().Add(5 * time.Second)
	x := 0
	for {
		for range 100000 {
			x++
		}
		b, err := processCPU()
		if err != nil {
			t.Fatal(err)
		}
		if b < a {
			t.Fatalf("process CPU went back from %v to %v", a, b)
		}
		if b-a >= 20*time.Millisecond {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s of busy loop (%d turns) used only %v of CPU", x, b-a)
		}
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
