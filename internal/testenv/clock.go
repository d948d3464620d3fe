package testenv

import (
	"time"

	"github.com/bentoevents/bento/internal/fakeclock"
)

// Clock is the fake clock with deterministic ids bento's own tests use:
// the implementation under the public bentotest.Clock, so that ids and
// times match those of users' tests.
type Clock = fakeclock.Clock

// NewClock returns a Clock that reads start.
func NewClock(start time.Time) *Clock { return fakeclock.New(start) }
