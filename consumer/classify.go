package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/dberr"
)

// ErrTransient marks a handler failure that passes with time without
// anything changing in the message or the code (a provider answering
// "busy", a rate limit): see Transient.
var ErrTransient = errors.New("consumer: transient failure")

// Transient wraps err, a failure of the handler's own that passes with
// time, so that the consumer retries its message in place, with backoff,
// without counting the attempts toward MaxRetries, for up to OutageWindow;
// past it the failures count like any other. It never opens the group's
// breaker: that is for the group's own database. A handler's network
// errors and deadlines are not transient unless it says so.
func Transient(err error) error { return fmt.Errorf("%w: %w", ErrTransient, err) }

// IsTransient reports whether err was marked with Transient.
func IsTransient(err error) bool { return errors.Is(err, ErrTransient) }

// class is what a failed attempt says about its message and the group's
// database, judged by the failure's origin.
type class int

const (
	// failed: the message failed (its handler returned an error, timed
	// out, or panicked, the handler's own network errors and deadlines
	// included): it counts toward MaxRetries.
	failed class = iota
	// passing: the group's database answered with a condition that passes
	// (a serialization failure, a deadlock, a lock or statement timeout, a
	// busy SQLite), or the handler marked the failure Transient: retried in
	// place within OutageWindow, not counted, the breaker left closed.
	passing
	// outage: the group's database cannot be reached: retried in place
	// within OutageWindow, and the breaker opens.
	outage
)

// probeTimeout bounds the query that tells whether the group's database
// answers.
const probeTimeout = 2 * time.Second

// classify judges a failed attempt's err. A connection-level failure that
// did not say it came from the database (a network error or a deadline of
// no known origin, as a handler's HTTP call returns) is checked with one
// query on the group's database: only when that fails too is it an outage.
func (c *Consumer) classify(ctx context.Context, err error) class {
	switch {
	case IsTransient(err):
		return passing
	case errors.Is(err, ErrHandlerTimeout), errors.Is(err, inbox.ErrGap), errors.Is(err, inbox.ErrHeld):
		return failed
	case dberr.IsContention(err):
		return passing
	case dberr.IsUnreachable(err):
		return outage
	case dberr.IsTransient(err) && !c.databaseAnswers(ctx):
		return outage
	}
	return failed
}

// databaseAnswers reports whether the group's database answers a query
// within probeTimeout.
func (c *Consumer) databaseAnswers(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return c.db.WithContext(pctx).Exec("SELECT 1").Error == nil
}
