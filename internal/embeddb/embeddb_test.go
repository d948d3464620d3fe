package embeddb

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPoolKeepsItsConnections: after MaxOpenConns connections were in use
// at once, the pool closed none of them. A closed connection is opened
// again on the next burst, and the driver's interrupt of a cancelled
// query races the close (seen by the race detector).
func TestPoolKeepsItsConnections(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "bento.db"), nil)
	require.NoError(t, err)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })

	for range 3 {
		conns := make([]*sql.Conn, MaxOpenConns) // every connection taken at once
		for i := range conns {
			conns[i], err = sqlDB.Conn(t.Context())
			require.NoError(t, err)
			var n int
			require.NoError(t, conns[i].QueryRowContext(t.Context(), `SELECT 1`).Scan(&n))
		}
		for _, c := range conns {
			require.NoError(t, c.Close())
		}
	}
	st := sqlDB.Stats()
	require.Equal(t, MaxOpenConns, st.OpenConnections, "connections open")
	require.Zero(t, st.MaxIdleClosed, "connections the pool closed for want of idle room")
}
