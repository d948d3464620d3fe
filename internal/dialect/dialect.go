// Package dialect tells which SQL database a *gorm.DB talks to and holds what
// differs between the databases bento supports.
package dialect

import (
	"errors"
	"fmt"
	"strings"

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

// Tuples returns n parenthesised groups of width placeholders, separated by
// commas: "(?, ?), (?, ?)" for Tuples(2, 2). Multi-row VALUES lists and
// row-value IN lists are built with it on both databases.
func Tuples(n, width int) string {
	if n <= 0 || width <= 0 {
		return ""
	}
	row := "(" + strings.Repeat("?, ", width-1) + "?)"
	var b strings.Builder
	b.Grow(n * (len(row) + 2))
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(row)
	}
	return b.String()
}
