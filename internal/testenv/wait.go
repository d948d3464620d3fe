package testenv

import (
	"testing"
	"time"
)

// pollEvery is how long Poll waits between calls: short, since some tests
// wait for a state that lasts only a moment.
const pollEvery = 5 * time.Millisecond

// Poll calls cond every 5 ms until it returns true or within has passed,
// and reports whether it did. It calls cond once more at the deadline.
func Poll(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(pollEvery, left))
	}
	return true
}

// WaitFor polls cond as Poll does and fails the test, saying it waited for
// what, when cond does not hold within that time.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(within, cond) {
		t.Fatalf("timed out after %v waiting for %s", within, what)
	}
}
