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
