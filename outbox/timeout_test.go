package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// runningClaims counts the claim statements the server is running.
func runningClaims(t *testing.T, db *gorm.DB) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state = 'active' AND query LIKE 'WITH cand AS%'`).Scan(&n).Error)
	return n
}

// TestClaimEndsOnTheServer starts a claim through a TCP proxy, lets it
// wait behind a lock on the outbox, and then stalls the proxy: the
// projector is gone as far as the server can tell (killed, or cut off by
// the network), and no cancel request can reach the server. The claim
// must end on the server all the same, within its own timeout, while the
// lock is still held: a claim left running there keeps its row locks and
// the oldest snapshot for as long as it runs, which is what stalled the
// relay in a fault campaign (killed projectors' claims ran for minutes).
func TestClaimEndsOnTheServer(t *testing.T) {
	t.Parallel()
	db, dsn := testenv.Postgres(t)
	e := setup(t, db, nil)
	e.add(context.Background(), t, "order.placed", map[string]int{"n": 1}, nil)

	via, proxy := testenv.Proxied(t, dsn)
	far, err := gorm.Open(postgres.Open(via), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { sqlDB, _ := far.DB(); _ = sqlDB.Close() })
	store, err := outbox.NewStore(far, nil)
	require.NoError(t, err)

	lock := begin(t, db)
	require.NoError(t, lock.Exec("LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE").Error)
	const lease = 2 * time.Second // so a one-second claim timeout
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := store.Claim(ctx, outbox.ClaimOpts{Worker: "w", Limit: 10, Lease: lease})
		done <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "the claim waits behind the lock", func() bool {
		return runningClaims(t, db) == 1
	})
	proxy.Stall()
	cancel() // the client gives up; nothing it sends reaches the server

	stalled := time.Now()
	testenv.WaitFor(t, 4*time.Second, "the server ends the claim while the lock is held", func() bool {
		return runningClaims(t, db) == 0
	})
	t.Logf("the server ended the claim %v after the stall", time.Since(stalled).Round(10*time.Millisecond))
	assert.Error(t, <-done, "the claim that was cut off")
	require.NoError(t, lock.Rollback().Error)

	got, err := e.store.Claim(context.Background(), outbox.ClaimOpts{Worker: "w", Limit: 10, Lease: lease})
	require.NoError(t, err)
	assert.Len(t, got, 1, "the row is claimable once the lock is gone")
}
