// Package fakeclock is a fake clock with deterministic ids: the
// implementation under bentotest.Clock, for users' tests, and
// testenv.Clock, for bento's own. It sits below both, so that the
// machinery of bento's tests does not import the public test kit.
package fakeclock

import (
	"encoding/binary"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// Clock is an aggregate.Clock whose time moves only when told and whose
// ULIDs depend only on the time and how many ids came before. The zero
// value reads the zero time. It is safe for concurrent use.
type Clock struct {
	mu   sync.Mutex
	now  time.Time
	seq  uint64
	last ulid.ULID
}

// New returns a clock that reads start, in UTC.
func New(start time.Time) *Clock { return &Clock{now: start.UTC()} }

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

// Set moves the clock to t, in UTC.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t.UTC()
}

// NewID returns the next id: a ULID with t's millisecond (or the previous
// id's, when t is earlier) and a sequence number as its entropy, so that
// it is always greater than the previous id.
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
