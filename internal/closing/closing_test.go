package closing_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/closing"
)

var (
	errClosed = errors.New("closing test: closed")
	errInner  = errors.New("closing test: inner")
)

func TestUseRunsUntilClosed(t *testing.T) {
	var g closing.Guard
	ran := 0
	require.NoError(t, g.Use(errClosed, func() error { ran++; return nil }))
	assert.ErrorIs(t, g.Use(errClosed, func() error { return errInner }), errInner, "fn's error is returned")
	require.NoError(t, g.Close(nil))
	assert.ErrorIs(t, g.Use(errClosed, func() error { ran++; return nil }), errClosed)
	assert.Equal(t, 1, ran, "not run after Close")
}

func TestCloseRunsOnce(t *testing.T) {
	var g closing.Guard
	calls := 0
	closeFn := func() error { calls++; return errInner }
	assert.ErrorIs(t, g.Close(closeFn), errInner)
	assert.NoError(t, g.Close(closeFn), "a second Close is a no-op")
	assert.Equal(t, 1, calls)
	g.RLock()
	assert.True(t, g.Closed())
	g.RUnlock()
	select {
	case <-g.Done():
	default:
		t.Fatal("Done is not closed after Close")
	}
}

// TestCloseWaitsForUse checks that Close does not run while a Use call is
// in progress.
func TestCloseWaitsForUse(t *testing.T) {
	var g closing.Guard
	inUse, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = g.Use(errClosed, func() error { close(inUse); <-release; return nil })
	}()
	<-inUse
	closed := make(chan struct{})
	go func() { _ = g.Close(nil); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while Use was running")
	case <-time.After(50 * time.Millisecond):
	}
	select {
	case <-g.Done():
		t.Fatal("Done closed while Use was running")
	default:
	}
	close(release)
	<-closed
}
