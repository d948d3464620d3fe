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
