package consumer

import (
	"context"
	"sync"
	"time"
)

// outcome is what an attempt says about the database.
type outcome int

const (
	// neutral: nothing (the attempt was cut short by its consumer).
	neutral outcome = iota
	// reachable: the attempt got answers (it succeeded, or failed for a
	// reason of its own).
	reachable
	// unreachable: the attempt failed transiently (see dberr.IsTransient).
	unreachable
)

// breaker is a consumer's circuit breaker. While the database is
// unreachable it lets one attempt at a time probe it, with backoff between
// probes; every other message of the group waits, holding its place,
// instead of hammering the database. The first attempt that reaches the
// database closes it and the waiting messages go on.
type breaker struct {
	initial, max time.Duration // the backoff between probes

	mu        sync.Mutex
	open      bool
	probing   bool
	since     time.Time
	delay     time.Duration
	nextProbe time.Time
	closed    chan struct{} // closed when the breaker closes
}

func newBreaker(initial, max time.Duration) *breaker {
	return &breaker{initial: initial, max: max, closed: make(chan struct{})}
}

// enter waits until the caller may make an attempt: at once while the
// breaker is closed; while it is open, once it is time for the next probe
// and the caller is the one to make it (probe is true), or the breaker
// closes. It fails only when ctx ends.
func (b *breaker) enter(ctx context.Context) (probe bool, err error) {
	for {
		b.mu.Lock()
		wait := time.Until(b.nextProbe)
		switch {
		case !b.open:
			b.mu.Unlock()
			return false, nil
		case !b.probing && wait <= 0:
			b.probing = true
			b.mu.Unlock()
			return true, nil
		case b.probing:
			wait = b.initial // the turn may come free: look again then
		}
		closed := b.closed
		b.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		case <-closed:
		case <-t.C:
		}
		t.Stop()
	}
}

// leave records an attempt's outcome (probe as enter returned it) and
// reports whether it opened the breaker (opened) or closed it after an
// outage of down.
func (b *breaker) leave(probe bool, o outcome) (opened bool, down time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	switch {
	case o == unreachable && !b.open:
		b.open, b.since, b.delay = true, time.Now(), b.initial
		b.nextProbe = b.since.Add(b.delay)
		b.closed = make(chan struct{})
		return true, 0
	case o == unreachable:
		b.delay = min(2*b.delay, b.max)
		b.nextProbe = time.Now().Add(b.delay)
	case o == reachable && b.open:
		b.open = false
		close(b.closed)
		return false, time.Since(b.since)
	}
	return false, 0
}

// isOpen reports whether the breaker is open.
func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}
