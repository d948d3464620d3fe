package aggregate

import (
	"crypto/rand"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// Clock is bento's one source of time and of the time-ordered ids made from
// it: the unit of work stamps each event with an id and an occurred-at time
// from it when it writes the event, and the stores and background jobs read
// the time from it. Tests give one a fake clock. Implementations must be
// safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewID returns a new, unique, 26-character ULID string for an event
	// written at t.
	NewID(t time.Time) string
}

// SystemClock is the default [Clock]: the system clock and [NewIDAt].
type SystemClock struct{}

// Now returns time.Now() in UTC.
func (SystemClock) Now() time.Time { return time.Now().UTC() }

// NewID returns [NewIDAt](t).
func (SystemClock) NewID(t time.Time) string { return NewIDAt(t) }

var monotonic = &Monotonic{}

// NewID returns a new ULID string for the current time. Ids returned by NewID
// and [NewIDAt] are strictly increasing within a process, even when the clock
// steps backwards or many ids fall in one millisecond.
func NewID() string { return monotonic.NewID(time.Now()) }

// NewIDAt returns a new ULID string whose timestamp is t (or later, to stay
// strictly increasing within the process).
func NewIDAt(t time.Time) string { return monotonic.NewID(t) }

// Monotonic generates ULIDs that are strictly increasing for the life of the
// value: within one millisecond the random part is incremented, and a clock
// that goes backwards never produces an id below the last one. The zero value
// is ready to use and safe for concurrent use.
type Monotonic struct {
	mu   sync.Mutex
	last ulid.ULID
}

// NewID returns the next id for time t as a 26-character string.
func (m *Monotonic) NewID(t time.Time) string {
	ms := ulid.Timestamp(t)
	m.mu.Lock()
	defer m.mu.Unlock()
	var id ulid.ULID
	if ms > m.last.Time() {
		_ = id.SetTime(ms) // ms comes from a time.Time, always in range
		_, _ = rand.Read(id[6:])
		// Keep room to increment within the millisecond.
		id[6] &= 0x7f
	} else {
		id = m.last
		increment(&id)
	}
	m.last = id
	return id.String()
}

// increment adds one to id as a 128-bit big-endian number.
func increment(id *ulid.ULID) {
	for i := len(id) - 1; i >= 0; i-- {
		id[i]++
		if id[i] != 0 {
			return
		}
	}
}
