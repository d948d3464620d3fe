// Package dialect tells which SQL database a *gorm.DB talks to and holds what
// differs between the databases bento supports.
package dialect

import (
	"errors"
	"fmt"

	"gorm.io/gorm"
)

// Dialect is a database bento supports.
type Dialect int

const (
	// Postgres is PostgreSQL, the production database.
	Postgres Dialect = iota + 1
	// SQLite is the embedded default.
	SQLite
)

// ErrUnsupported is returned for a database bento does not support.
var ErrUnsupported = errors.New("unsupported database")

// Of returns the dialect of db.
func Of(db *gorm.DB) (Dialect, error) {
	if db == nil || db.Dialector == nil {
		return 0, fmt.Errorf("%w: nil *gorm.DB", ErrUnsupported)
	}
	switch name := db.Dialector.Name(); name {
	case "postgres":
		return Postgres, nil
	case "sqlite":
		return SQLite, nil
	default:
		return 0, fmt.Errorf("%w: %q (bento supports postgres and sqlite)", ErrUnsupported, name)
	}
}

// String returns the dialect's name, which is also its migrations folder.
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case SQLite:
		return "sqlite"
	default:
		return fmt.Sprintf("dialect(%d)", int(d))
	}
}
