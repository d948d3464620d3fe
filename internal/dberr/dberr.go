// Package dberr classifies database errors the same way on every driver bento
// supports.
package dberr

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// errDBClosed is database/sql's unexported "sql: database is closed" error,
// captured once from a closed *sql.DB so it can be matched with errors.Is.
var errDBClosed = func() error {
	db := sql.OpenDB(nopConnector{})
	_ = db.Close()
	return db.PingContext(context.Background())
}()

type nopConnector struct{}

func (nopConnector) Connect(context.Context) (driver.Conn, error) { return nil, driver.ErrBadConn }
func (nopConnector) Driver() driver.Driver                        { return nil }

// IsClosed reports whether err says the *sql.DB has been closed.
func IsClosed(err error) bool {
	return err != nil && errors.Is(err, errDBClosed)
}

// IsUniqueViolation reports whether err is a unique-constraint violation.
func IsUniqueViolation(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "23505"
	}
	// modernc SQLite: "constraint failed: UNIQUE constraint failed: ... (2067)"
	// or "(1555)" for a primary key.
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed")
}

// IsUniqueViolationOf reports whether err is a violation of the unique
// index or constraint name. SQLite names the columns instead of the index,
// so there err must name sqliteColumns ("table.col, table.col").
func IsUniqueViolationOf(err error, name, sqliteColumns string) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "23505" && pg.ConstraintName == name
	}
	return IsUniqueViolation(err) && strings.Contains(err.Error(), sqliteColumns)
}

// IsSerializationFailure reports whether err is a serialization failure or a
// deadlock, which a retry of the whole transaction can resolve.
func IsSerializationFailure(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "40001" || pg.Code == "40P01"
	}
	return false
}
