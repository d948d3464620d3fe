package bentotest

import (
	"time"

	"github.com/bentoevents/bento/internal/fakeclock"
)

// Clock is a fake clock with deterministic ids: an aggregate.Clock whose
// time moves only when told and whose ULIDs depend only on the time and how
// many ids came before, so a test produces the same ids every run. It is
// safe for concurrent use.
type Clock struct {
	c fakeclock.Clock
}

// DefaultStart is where New's clock starts: 2026-01-01T00:00:00Z.
var DefaultStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// NewClock returns a clock that reads start.
func NewClock(start time.Time) *Clock {
	c := &Clock{}
	c.c.Set(start)
	return c
}

// Now returns the fake time.
func (c *Clock) Now() time.Time { return c.c.Now() }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.c.Advance(d) }

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) { c.c.Set(t) }

// NewID returns the next id: a ULID with t's millisecond and a sequence
// number as its entropy, always greater than the previous id.
func (c *Clock) NewID(t time.Time) string { return c.c.NewID(t) }
