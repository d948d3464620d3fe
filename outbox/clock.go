package outbox

import (
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
)

// TestConfig holds settings meant for tests only.
type TestConfig struct {
	// Clock, when set, stands in for the database's clock in every time the
	// store writes or compares: leases, due times, backoff, published_at,
	// failed_at and retention cut-offs. It lets a test move time; never set
	// it in production, where the hosts' clocks drift apart. Defaults to
	// none: PostgreSQL's now(), or the host's clock for the embedded SQLite,
	// whose database is the application's own process.
	Clock interface{ Now() time.Time }
	// ScheduleClock, when set, stands in for the database's clock in the
	// due times of scheduled messages only: After's base, and the time
	// ReleaseDue releases up to. Package bentotest sets it to its fake
	// clock, so a test moves scheduled messages' time while events written
	// by stores on the system clock stay due. Defaults to Clock, then to
	// the database's clock.
	ScheduleClock interface{ Now() time.Time }
}

// dbClock yields the values a statement binds for "now" and for times
// relative to it. On PostgreSQL they are SQL expressions evaluated by the
// server, so leases and due times never depend on the clock of the host
// that writes them: a projector whose clock runs ahead cannot take a live
// lease, and a writer whose clock runs ahead cannot delay its own events.
type dbClock struct {
	sql  bool // PostgreSQL: the server's now()
	fake interface{ Now() time.Time }
}

func newDBClock(d dialect.Dialect, test TestConfig) dbClock {
	return dbClock{sql: d == dialect.Postgres && test.Clock == nil, fake: test.Clock}
}

// newScheduleClock is the clock of scheduled messages' due times: the
// ScheduleClock when set, else the store's dbClock.
func newScheduleClock(d dialect.Dialect, test TestConfig) dbClock {
	if test.ScheduleClock != nil {
		return dbClock{fake: test.ScheduleClock}
	}
	return newDBClock(d, test)
}

func (c dbClock) goNow() time.Time {
	if c.fake != nil {
		return c.fake.Now().UTC()
	}
	return time.Now().UTC()
}

// now is the database's current time.
func (c dbClock) now() any {
	if c.sql {
		return gorm.Expr(dbNowSQL)
	}
	return c.goNow()
}

// in is the database's current time plus d (minus for a negative d).
func (c dbClock) in(d time.Duration) any {
	if c.sql {
		return gorm.Expr(dbNowPlusSQL, d.Seconds())
	}
	return c.goNow().Add(d)
}
