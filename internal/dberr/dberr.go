// Package dberr classifies database errors the same way on every driver bento
// supports.
package dberr

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
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
// *sql.DB has been closed. The result says that err came from a statement
// of bento's own on its database (see IsUnreachable).
func Wrap(op string, err error) error {
	if IsClosed(err) {
		return &opError{op: op, errs: []error{ErrClosed, err}}
	}
	return &opError{op: op, errs: []error{err}}
}

// opError is an error of one of bento's own database operations.
type opError struct {
	op   string
	errs []error
}

func (e *opError) Error() string {
	s := e.op
	for _, err := range e.errs {
		s += ": " + err.Error()
	}
	return s
}

func (e *opError) Unwrap() []error { return e.errs }

// unreachableStates are the PostgreSQL SQLSTATEs that say the server
// cannot serve the connection: besides class 08 (connection exception),
// the server shutting down or starting, and too many connections.
var unreachableStates = map[string]bool{"57P01": true, "57P02": true, "57P03": true, "53300": true}

// contentionStates are the PostgreSQL SQLSTATEs of conditions that pass
// while the server answers: serialization failure, deadlock, lock not
// available, query cancelled (statement or lock timeout), and a
// transaction the server ended for idling in it or running too long
// (idle_in_transaction_session_timeout, transaction_timeout: what bento
// sets for a partitioned consumer's instance that froze mid-transaction).
var contentionStates = map[string]bool{"40001": true, "40P01": true, "55P03": true, "57014": true, "25P03": true, "25P04": true}

// IsContention reports whether err is a transient condition of a database
// that answers: a serialization failure, a deadlock, a lock or statement
// timeout, SQLite's busy database.
func IsContention(err error) bool {
	if err == nil || IsClosed(err) {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return contentionStates[pg.Code]
	}
	msg := err.Error()
	return strings.Contains(msg, "SQLITE_BUSY") || strings.Contains(msg, "database is locked")
}

// IsUnreachable reports whether err says, beyond doubt, that a database
// could not be reached: the server refused or dropped the connection (a
// PostgreSQL connection error, a failed connect, a bad or closed
// connection), or a transient failure of a statement bento made itself
// (see Wrap). A bare network error or deadline says nothing about where
// it came from (a handler's HTTP call returns those too): IsTransient
// includes it, IsUnreachable does not.
func IsUnreachable(err error) bool {
	if err == nil || IsClosed(err) {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return unreachableStates[pg.Code] || strings.HasPrefix(pg.Code, "08")
	}
	var connect *pgconn.ConnectError
	if errors.As(err, &connect) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		return true
	}
	var own *opError
	return errors.As(err, &own) && IsTransient(err) && !IsContention(err)
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
		return contentionStates[pg.Code] || unreachableStates[pg.Code] || strings.HasPrefix(pg.Code, "08")
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
