package bentotest

import (
	"encoding/binary"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// Clock is a fake clock with deterministic ids: an aggregate.Clock whose
// time moves only when told and whose ULIDs depend only on the time and how
// many ids came before, so a test produces the same ids every run. It is
// safe for concurrent use.
type Clock struct {
	mu   sync.Mutex
	now  time.Time
	seq  uint64
	last ulid.ULID
}

// DefaultStart is where New's clock starts: 2026-01-01T00:00:00Z.
var DefaultStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// NewClock returns a clock that reads start.
func NewClock(start time.Time) *Clock { return &Clock{now: start.UTC()} }

// Now returns the fake time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t.UTC()
}

// NewID returns the next id: a ULID with t's millisecond and a sequence
// number as its entropy, always greater than the previous id.
func (c *Clock) NewID(t time.Time) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	var id ulid.ULID
	ms := ulid.Timestamp(t)
	if ms < c.last.Time() {
		ms = c.last.Time()
	}
	_ = id.SetTime(ms)
	binary.BigEndian.PutUint64(id[8:], c.seq)
	c.last = id
	return id.String()
}
