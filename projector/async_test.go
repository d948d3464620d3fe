package projector_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
)

// commitModes records, for each transaction on its pool that ran a
// statement of interest, the transaction's synchronous_commit at its
// commit (read with SHOW on the same transaction just before it commits),
// under the statements' kinds.
type commitModes struct {
	*sql.DB
	kind func(query string) string // "" for statements of no interest
	mu   sync.Mutex
	seen map[string][]string
}

// commitModesOf returns a GORM database on db's connections whose
// transactions commitModes records.
func commitModesOf(t *testing.T, db *gorm.DB, kind func(query string) string) (*gorm.DB, *commitModes) {
	t.Helper()
	sqlDB, err := db.DB()
	require.NoError(t, err)
	m := &commitModes{DB: sqlDB, kind: kind, seen: map[string][]string{}}
	wrapped, err := gorm.Open(postgres.New(postgres.Config{Conn: m}), &gorm.Config{Logger: db.Logger})
	require.NoError(t, err)
	return wrapped, m
}

// GetDBConn makes the wrapper's *gorm.DB report the pool it wraps, so that
// a projector and a bus on it know they share one database.
func (m *commitModes) GetDBConn() (*sql.DB, error) { return m.DB, nil }

// BeginTx implements gorm.ConnPoolBeginner.
func (m *commitModes) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	tx, err := m.DB.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &modeTx{Tx: tx, m: m}, nil
}

func (m *commitModes) modes() map[string][]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]string{}
	for k, v := range m.seen {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// modeTx is a transaction that notes the kinds of its statements.
type modeTx struct {
	*sql.Tx
	m     *commitModes
	kinds []string
}

func (tx *modeTx) note(query string) {
	if k := tx.m.kind(query); k != "" {
		tx.kinds = append(tx.kinds, k)
	}
}

func (tx *modeTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	tx.note(query)
	return tx.Tx.ExecContext(ctx, query, args...)
}

func (tx *modeTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	tx.note(query)
	return tx.Tx.QueryContext(ctx, query, args...)
}

func (tx *modeTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	tx.note(query)
	return tx.Tx.QueryRowContext(ctx, query, args...)
}

func (tx *modeTx) Commit() error {
	if len(tx.kinds) > 0 {
		var mode string
		if err := tx.Tx.QueryRow("SHOW synchronous_commit").Scan(&mode); err != nil {
			mode = "error: " + err.Error()
		}
		tx.m.mu.Lock()
		for _, k := range tx.kinds {
			tx.m.seen[k] = append(tx.m.seen[k], mode)
		}
		tx.m.mu.Unlock()
	}
	return tx.Tx.Commit()
}

// relayStatement names the projector's statements and the writers'.
func relayStatement(query string) string {
	switch {
	case strings.Contains(query, "WITH cand AS"):
		return "claim"
	case strings.HasPrefix(query, "UPDATE outbox_events") && strings.Contains(query, "status = 'sent'"):
		return "mark sent"
	case strings.HasPrefix(query, "INSERT INTO dbbus_deliveries"):
		return "publish to the bus"
	case strings.HasPrefix(query, "INSERT INTO outbox_events"):
		return "write events"
	}
	return ""
}

// TestRelayTransactionsCommitAsynchronously: on PostgreSQL the projector's
// own transactions (its claim, its mark of what a publisher accepted, and
// the transaction that publishes to a database bus and marks the rows
// sent) commit without waiting for the WAL flush: a crash of the server
// can only undo them, which publishes the rows again. The writers' units of
// work stay synchronous, and so does a caller's transaction around
// MarkSentTx.
func TestRelayTransactionsCommitAsynchronously(t *testing.T) {
	t.Parallel()
	for _, hop := range []bool{false, true} {
		name := "publisher"
		if hop {
			name = "database bus"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			plain, _ := testenv.Postgres(t)
			db, probe := commitModesOf(t, plain, relayStatement)
			e := setup(t, db)
			events := e.commit(t, counterIDs(3), 2)
			var p *projector.OutboxProjector
			var err error
			if hop {
				p, err = projector.New(e.store, newDBBus(t, db), fastConfig())
			} else {
				p, err = projector.New(e.store, &recorder{}, fastConfig())
			}
			require.NoError(t, err)
			for i := 0; i < 20 && e.count(t, "status = 'sent'") < int64(len(events)); i++ {
				_, err := p.Drain(context.Background())
				require.NoError(t, err)
			}
			require.Equal(t, int64(len(events)), e.count(t, "status = 'sent'"))

			got := probe.modes()
			want := []string{"claim", "mark sent"}
			if hop {
				want = append(want, "publish to the bus")
			}
			for _, k := range want {
				require.NotEmpty(t, got[k], "the projector's %s ran in a transaction", k)
				for _, mode := range got[k] {
					assert.Equal(t, "off", mode, "the projector's %s commits asynchronously", k)
				}
			}
			require.Len(t, got["write events"], 3, "one unit of work per counter")
			for _, mode := range got["write events"] {
				assert.Equal(t, "on", mode, "a unit of work commits synchronously")
			}

			// MarkSentTx in the caller's transaction leaves it as it was.
			more := e.commit(t, []string{"late"}, 1)
			claimed, err := e.store.Claim(context.Background(), outbox.ClaimOpts{Worker: "caller", Limit: 10, Lease: time.Minute})
			require.NoError(t, err)
			require.Len(t, claimed, 1)
			require.Equal(t, more[0], claimed[0].ID)
			require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
				n, err := e.store.MarkSentTx(context.Background(), tx, "caller", []string{claimed[0].ID})
				require.EqualValues(t, 1, n)
				return err
			}))
			got = probe.modes()
			last := got["mark sent"][len(got["mark sent"])-1]
			assert.Equal(t, "on", last, "MarkSentTx leaves the caller's transaction synchronous")
		})
	}
}
