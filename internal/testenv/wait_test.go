package testenv_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/bentoevents/bento/internal/testenv"
)

func TestPollReturnsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	calls := 0
	assert.True(t, testenv.Poll(10*time.Second, func() bool { calls++; return calls == 3 }))
	assert.Equal(t, 3, calls)
}

func TestPollGivesUpAtTheDeadline(t *testing.T) {
	t.Parallel()
	start := time.Now()
	calls := 0
	assert.False(t, testenv.Poll(50*time.Millisecond, func() bool { calls++; return false }))
	assert.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	assert.Greater(t, calls, 1, "called again after the first miss")
}

// fatalRecorder records a Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = format
}

func TestWaitForFailsTheTestOnTimeout(t *testing.T) {
	t.Parallel()
	r := &fatalRecorder{TB: t}
	testenv.WaitFor(r, 10*time.Millisecond, "nothing", func() bool { return false })
	assert.Contains(t, r.msg, "timed out")
	r = &fatalRecorder{TB: t}
	testenv.WaitFor(r, time.Second, "something", func() bool { return true })
	assert.Empty(t, r.msg)
}
