package embeddb

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPoolKeepsItsConnections: after MaxOpenConns queries ran at once, the
// pool closed none of the connections they used. A closed connection is
// opened again on the next burst, and the driver's interrupt of a
// cancelled query races the close (seen by the race detector).
func TestPoolKeepsItsConnections(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "bento.db"), nil)
	require.NoError(t, err)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })

	for round := 0; round < 3; round++ {
		var hold, done sync.WaitGroup
		hold.Add(MaxOpenConns)
		conns := make(chan struct{})
		for i := 0; i < MaxOpenConns; i++ {
			done.Add(1)
			go func() {
				defer done.Done()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				conn, err := sqlDB.Conn(ctx)
				if !assertNoError(t, err) {
					hold.Done()
					return
				}
				defer conn.Close()
				var n int
				assertNoError(t, conn.QueryRowContext(ctx, `SELECT 1`).Scan(&n))
				hold.Done()
				<-conns // every connection is taken at once
			}()
		}
		hold.Wait()
		close(conns)
		done.Wait()
	}
	st := sqlDB.Stats()
	require.Equal(t, MaxOpenConns, st.OpenConnections, "connections open")
	require.Zero(t, st.MaxIdleClosed, "connections the pool closed for want of idle room")
}

// assertNoError reports err from a goroutine and whether it was nil.
func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}
