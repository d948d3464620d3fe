package bentotest

import (
	"fmt"
	"strings"
	"sync"
)

// TB is the part of testing.TB the kit uses. *testing.T and *testing.B
// satisfy it, as does [Recorder].
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Recorder is a TB that records failures instead of failing a test: for
// examples, and for checking that an assertion fails when it should. Fatalf
// records and then panics with ErrFatal; run code that may call it through
// [Recorder.Run]. Call [Recorder.Close] to run its cleanups.
type Recorder struct {
	mu       sync.Mutex
	failures []string
	cleanups []func()
}

// ErrFatal is the value Recorder.Fatalf panics with.
var ErrFatal = fmt.Errorf("bentotest: fatal failure recorded")

// Helper does nothing.
func (r *Recorder) Helper() {}

// Errorf records a failure.
func (r *Recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

// Fatalf records a failure and panics with ErrFatal.
func (r *Recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic(ErrFatal)
}

// Cleanup registers f to run at Close.
func (r *Recorder) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// Run calls f, absorbing the panic of a Fatalf.
func (r *Recorder) Run(f func(t TB)) {
	defer func() {
		if p := recover(); p != nil && p != ErrFatal {
			panic(p)
		}
	}()
	f(r)
}

// Failed reports whether a failure was recorded.
func (r *Recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.failures) > 0
}

// Failures returns the recorded failure messages.
func (r *Recorder) Failures() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.failures...)
}

// String returns the failures, one per line.
func (r *Recorder) String() string { return strings.Join(r.Failures(), "\n") }

// Close runs the cleanups, last registered first.
func (r *Recorder) Close() {
	r.mu.Lock()
	cs := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}
