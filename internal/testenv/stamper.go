package testenv

import (
	"time"

	"github.com/bentoevents/bento/bentotest"
)

// Stamper is the fake clock with deterministic ids bento's own tests use:
// the public bentotest.Clock.
type Stamper = bentotest.Clock

// NewStamper returns a Stamper whose clock reads start.
func NewStamper(start time.Time) *Stamper { return bentotest.NewClock(start) }
