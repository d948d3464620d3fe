package embedded

import (
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/embeddb"
)

// MaxOpenConns is how many connections OpenSQLite allows its pool. SQLite
// has one writer at a time; a few connections let reads run beside it.
const MaxOpenConns = embeddb.MaxOpenConns

// DSN returns the driver DSN (for github.com/glebarez/sqlite) of the SQLite
// file at path: WAL journal, a 10 s busy timeout, foreign keys on,
// synchronous NORMAL, and transactions that take the write lock when they
// begin (BEGIN IMMEDIATE), so concurrent units of work queue instead of
// failing with SQLITE_BUSY when they upgrade from reading to writing.
func DSN(path string) string { return embeddb.DSN(path) }

// OpenSQLite opens (creating if needed) the SQLite database file at path
// with [DSN] and at most [MaxOpenConns] connections, which its pool keeps
// open while idle. A nil cfg uses a silent GORM logger.
func OpenSQLite(path string, cfg *gorm.Config) (*gorm.DB, error) {
	return embeddb.Open(path, cfg)
}
