package testenv

import (
	"time"

	"github.com/bentoevents/bento/internal/fakeclock"
)

// Stamper is the fake clock with deterministic ids bento's own tests use:
// the implementation under the public bentotest.Clock, so that ids and
// times match those of users' tests.
type Stamper = fakeclock.Clock

// NewStamper returns a Stamper whose clock reads start.
func NewStamper(start time.Time) *Stamper { return fakeclock.New(start) }
