package dberr_test

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"

	"github.com/bentoevents/bento/internal/dberr"
)

func TestIsTransient(t *testing.T) {
	transient := []error{
		fmt.Errorf("dial: %w", syscall.ECONNREFUSED),
		fmt.Errorf("read: %w", syscall.ECONNRESET),
		driver.ErrBadConn,
		&pgconn.PgError{Code: "40001"}, // serialization failure
		&pgconn.PgError{Code: "40P01"}, // deadlock
		&pgconn.PgError{Code: "55P03"}, // lock not available
		&pgconn.PgError{Code: "57014"}, // statement timeout
		&pgconn.PgError{Code: "25P03"}, // idle in transaction too long: the transaction was ended
		&pgconn.PgError{Code: "25P04"}, // transaction timeout
		&pgconn.PgError{Code: "57P01"}, // admin shutdown
		&pgconn.PgError{Code: "08006"}, // connection failure
		errors.New("database is locked (5) (SQLITE_BUSY)"),
	}
	for _, err := range transient {
		assert.True(t, dberr.IsTransient(fmt.Errorf("handler: %w", err)), "%v", err)
	}
	permanent := []error{
		nil,
		errors.New("stock service says no"),
		&pgconn.PgError{Code: "23505"}, // unique violation
		&pgconn.PgError{Code: "42P01"}, // undefined table
	}
	for _, err := range permanent {
		assert.False(t, dberr.IsTransient(err), "%v", err)
	}
}

// TestContentionOrUnreachable: a condition of a server that answers is
// contention, never unreachable; a dropped connection is unreachable; a
// bare network error says nothing about where it came from, so it is
// neither (it may be a handler's own HTTP call).
func TestContentionOrUnreachable(t *testing.T) {
	for _, c := range []struct {
		err                     error
		contention, unreachable bool
	}{
		{&pgconn.PgError{Code: "25P03"}, true, false}, // a frozen instance's transaction, ended by the server
		{&pgconn.PgError{Code: "40P01"}, true, false},
		{&pgconn.PgError{Code: "08006"}, false, true},
		{&pgconn.PgError{Code: "57P01"}, false, true},
		{driver.ErrBadConn, false, true},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), false, false},
		{&pgconn.PgError{Code: "23505"}, false, false},
	} {
		err := fmt.Errorf("apply: %w", c.err)
		assert.Equal(t, c.contention, dberr.IsContention(err), "IsContention(%v)", c.err)
		assert.Equal(t, c.unreachable, dberr.IsUnreachable(err), "IsUnreachable(%v)", c.err)
	}
}
