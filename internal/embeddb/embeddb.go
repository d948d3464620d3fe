// Package embeddb opens the embedded default database: a pure-Go SQLite file
// configured for bento's access pattern. Package embedded exports it; the
// implementation lives here so that internal test helpers can use it
// without importing a public package.
package embeddb

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/glebarez/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// DSN returns the driver DSN for the SQLite file at path: WAL journal, a busy
// timeout, foreign keys on, and transactions that take the write lock when
// they begin (BEGIN IMMEDIATE), so concurrent units of work queue instead of
// failing with SQLITE_BUSY when they upgrade from reading to writing.
func DSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate")
	return path + "?" + unescapeParens(q.Encode())
}

// MaxOpenConns is how many connections Open allows its pool. SQLite has one
// writer at a time; a few connections let reads run beside it.
const MaxOpenConns = 4

// Open opens (creating if needed) the SQLite database file at path with
// DSN and at most MaxOpenConns connections, all of which the pool keeps
// open while idle: a connection closed and opened again costs its pragmas
// and a new WAL reader, and the SQLite driver's interrupt of a cancelled
// query reads its connection unlocked, racing the pool closing that
// connection. A nil cfg uses a silent GORM logger.
func Open(path string, cfg *gorm.Config) (*gorm.DB, error) {
	if cfg == nil {
		cfg = &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)}
	}
	db, err := gorm.Open(sqlite.Open(DSN(path)), cfg)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	sqlDB.SetMaxOpenConns(MaxOpenConns)
	sqlDB.SetMaxIdleConns(MaxOpenConns)
	return db, nil
}

func unescapeParens(s string) string {
	return strings.NewReplacer("%28", "(", "%29", ")").Replace(s)
}
