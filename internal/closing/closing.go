// Package closing guards a value against use after Close: the lock and
// closed flag that bento's buses, publishers and subscribers share.
package closing

import "sync"

// Guard is a read-write lock with a closed flag and a channel closed by
// Close. The zero value is open. A type that keeps more state under the
// same lock takes it with Lock (or RLock) and asks Closed.
type Guard struct {
	sync.RWMutex
	closed bool
	once   sync.Once
	done   chan struct{}
}

// Closed reports whether Close has run. Call it holding the lock.
func (g *Guard) Closed() bool { return g.closed }

// Done returns a channel that Close closes.
func (g *Guard) Done() <-chan struct{} { return g.doneChan() }

func (g *Guard) doneChan() chan struct{} {
	g.once.Do(func() { g.done = make(chan struct{}) })
	return g.done
}

// Use runs fn holding the read lock, so Use calls run side by side and
// Close waits for those in progress, and returns its error; once the guard
// is closed it returns errClosed without running fn.
func (g *Guard) Use(errClosed error, fn func() error) error {
	g.RLock()
	defer g.RUnlock()
	if g.closed {
		return errClosed
	}
	return fn()
}

// Close closes the guard, closes the Done channel and runs fn (when not
// nil) holding the write lock, after the Use calls in progress returned,
// and returns fn's error. Only the first Close does so; later ones return
// nil.
func (g *Guard) Close(fn func() error) error {
	g.Lock()
	defer g.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	close(g.doneChan())
	if fn == nil {
		return nil
	}
	return fn()
}
