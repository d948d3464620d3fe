// Package dberr classifies database errors the same way on every driver bento
// supports.
package dberr

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

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

// ErrClosed is the one error bento returns (wrapped) for a database handle
// that has been closed; outbox, uow, inbox and idempotency export it as
// their ErrClosed.
var ErrClosed = errors.New("bento: database is closed")

// Wrap wraps err with op ("inbox: read"), adding ErrClosed when err says the
// *sql.DB has been closed.
func Wrap(op string, err error) error {
	if IsClosed(err) {
		return fmt.Errorf("%s: %w: %w", op, ErrClosed, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

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

// transientStates are the PostgreSQL SQLSTATEs of failures that pass:
// class 08 (connection exception) is matched by prefix; the rest are
// serialization failure, deadlock, lock not available, query cancelled
// (statement or lock timeout), the server shutting down or starting, and
// too many connections.
var transientStates = map[string]bool{
	"40001": true, "40P01": true, "55P03": true, "57014": true,
	"57P01": true, "57P02": true, "57P03": true, "53300": true,
}

// IsTransient reports whether err is a failure that retrying later can get
// past without anything changing in the message or the code: the database
// unreachable or restarting, a lost connection, a serialization failure or
// deadlock, a lock or statement timeout, SQLite's busy database. A closed
// *sql.DB is not transient: the process is shutting down.
func IsTransient(err error) bool {
	if err == nil || IsClosed(err) {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return transientStates[pg.Code] || strings.HasPrefix(pg.Code, "08")
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var connect *pgconn.ConnectError
	if errors.As(err, &connect) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "SQLITE_BUSY") || strings.Contains(msg, "database is locked") ||
		strings.Contains(msg, "conn closed") || strings.Contains(msg, "unexpected EOF")
}
