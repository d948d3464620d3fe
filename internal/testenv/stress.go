package testenv

import "testing"

// Stress marks a stress or chaos test: thousands of events through several
// projectors and consumers. It skips under -short, and under the race
// detector, whose 5-10x slowdown turns these runs into timing tests;
// scripts/test.sh runs the suite a second time without -race so they always
// run in CI. The smaller concurrency tests run under -race.
func Stress(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("stress test: skipped with -short")
	}
	if RaceEnabled {
		t.Skip("stress test: skipped under -race; scripts/test.sh runs it in its non-race pass")
	}
}
