package pglisten_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/pglisten"
	"github.com/bentoevents/bento/internal/testenv"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// recorder collects a Listener's callbacks.
type recorder struct {
	mu       sync.Mutex
	listens  []string
	payloads []string
}

func (r *recorder) listener(channel, app string) pglisten.Listener {
	return pglisten.Listener{
		Channel: channel, ApplicationName: app, Logger: discard,
		OnListen: func(schema string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.listens = append(r.listens, schema)
		},
		OnNotify: func(payload, _ string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.payloads = append(r.payloads, payload)
		},
	}
}

func (r *recorder) counts() (listens, payloads int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.listens), len(r.payloads)
}

// TestListenReconnects listens, notifies, then kills the listening
// connection: the listener must reconnect (calling OnListen again, with
// the connection's schema) and deliver the notifications sent after it.
func TestListenReconnects(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	var schema string
	require.NoError(t, db.Raw(`SELECT current_schema()`).Scan(&schema).Error)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	const app = "bento-pglisten-test"
	var r recorder
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.listener("bento_pglisten_test", app+"-"+schema).Run(ctx, sqlDB)
	}()
	listening := func() int {
		var pid int
		require.NoError(t, db.Raw(`SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE application_name = left(?, 63) AND query ILIKE 'listen%'`, app+"-"+schema).Scan(&pid).Error)
		return pid
	}
	testenv.WaitFor(t, 10*time.Second, "the listener to listen", func() bool { return listening() != 0 })
	notify := func(payload string) {
		require.NoError(t, db.Exec(`SELECT pg_notify('bento_pglisten_test', ?)`, payload).Error)
	}
	notify("one")
	testenv.WaitFor(t, 10*time.Second, "the first notification", func() bool { _, n := r.counts(); return n == 1 })

	old := listening()
	require.NoError(t, db.Exec(`SELECT pg_terminate_backend(?)`, old).Error)
	testenv.WaitFor(t, 10*time.Second, "a new listening connection", func() bool {
		pid := listening()
		return pid != 0 && pid != old
	})
	notify("two")
	testenv.WaitFor(t, 10*time.Second, "the notification after the reconnect", func() bool { _, n := r.counts(); return n == 2 })

	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	assert.Equal(t, []string{"one", "two"}, r.payloads)
	require.Len(t, r.listens, 2, "OnListen runs on the first connect and on the reconnect")
	assert.Equal(t, []string{schema, schema}, r.listens)
}

// TestNotPgxReturns runs the listener on SQLite: it must return at once
// without calling back, leaving its caller to poll.
func TestNotPgxReturns(t *testing.T) {
	t.Parallel()
	sqlDB, err := testenv.SQLite(t).DB()
	require.NoError(t, err)
	var r recorder
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.listener("bento_pglisten_test", "").Run(t.Context(), sqlDB)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run on a non-pgx driver did not return")
	}
	listens, payloads := r.counts()
	assert.Zero(t, listens)
	assert.Zero(t, payloads)
}
