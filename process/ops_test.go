package process_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/process"
)

// TestListAndAbandon: operators list running processes by their table and
// abandon one: its timeout is cancelled, it is completed, and later
// messages for it are dropped.
func TestListAndAbandon(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.deliver(t, OrderPlaced{OrderID: "a"})
	f.deliver(t, OrderPlaced{OrderID: "b"})

	got, err := process.List(ctx, f.env.DB, "payments", process.Filter{})
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, "payment", got[0].Process)
	assert.Equal(t, "default", got[0].TenantID)
	assert.Contains(t, got[0].Timeouts, "window")
	assert.Equal(t, []string{"window"}, got[0].Timeouts.Names())

	require.NoError(t, process.Abandon(ctx, f.env.DB, f.env.Outbox, "payments", "default", "a"))
	require.Len(t, f.env.Scheduled(t), 1, "a's window was cancelled")
	got, err = process.List(ctx, f.env.DB, "payments", process.Filter{})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "b", got[0].Key)
	got, err = process.List(ctx, f.env.DB, "payments", process.Filter{Key: "a", Completed: true})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.True(t, got[0].Completed)
	assert.Empty(t, got[0].Timeouts)

	f.env.Advance(t, time.Hour)
	assert.Equal(t, []string{`{"order_id":"b","reason":"payment_timeout"}`}, f.emitted(t, "order.cancelled"), "only b timed out")
	f.deliver(t, PaymentReceived{OrderID: "a"})
	assert.Zero(t, f.steps.Load(), "a message for the abandoned process is dropped")

	require.ErrorIs(t, process.Abandon(ctx, f.env.DB, f.env.Outbox, "payments", "default", "a"), process.ErrCompleted)
	require.ErrorIs(t, process.Abandon(ctx, f.env.DB, f.env.Outbox, "payments", "default", "zz"), process.ErrNotFound)
	_, err = process.List(ctx, f.env.DB, "payments; DROP TABLE x", process.Filter{})
	require.ErrorIs(t, err, process.ErrInvalidTable)
	require.NoError(t, process.ValidateTable("checkouts_v2"))
	for _, bad := range []string{"", "2fa", "bad-table", "x.y"} {
		require.ErrorIs(t, process.ValidateTable(bad), process.ErrInvalidTable, bad)
	}
	assert.Equal(t, []string{"a", "b"}, process.Timeouts{"b": "2", "a": "1"}.Names())
	assert.Empty(t, process.Timeouts(nil).Names())
}

// TestPurge: Purge deletes the processes completed more than the retention
// ago, and nothing else: not running processes, not those completed more
// recently, not another tenant's when a tenant is named. A dry run counts
// without deleting. Once a tombstone is purged, a late message for the
// process meets its Missing policy, as for a process never started.
func TestPurge(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c"} {
		f.deliver(t, OrderPlaced{OrderID: id})
	}
	f.deliver(t, PaymentReceived{OrderID: "a"})
	require.NoError(t, process.Abandon(ctx, f.env.DB, f.env.Outbox, "payments", "default", "b"))
	done, err := process.List(ctx, f.env.DB, "payments", process.Filter{Completed: true})
	require.NoError(t, err)
	require.Len(t, done, 3)
	var last time.Time
	for _, p := range done {
		if p.CompletedAt != nil && p.CompletedAt.After(last) {
			last = *p.CompletedAt
		}
	}
	require.False(t, last.IsZero(), "two processes completed")
	at := func(d time.Duration) func() time.Time { return func() time.Time { return last.Add(d) } }

	n, err := process.Purge(ctx, f.env.DB, "payments", time.Hour, &process.PurgeOpts{Now: at(30 * time.Minute)})
	require.NoError(t, err)
	assert.Zero(t, n, "completed within the retention")
	n, err = process.Purge(ctx, f.env.DB, "payments", time.Hour, &process.PurgeOpts{Now: at(2 * time.Hour), Tenant: "other"})
	require.NoError(t, err)
	assert.Zero(t, n, "another tenant's")
	n, err = process.Purge(ctx, f.env.DB, "payments", time.Hour, &process.PurgeOpts{Now: at(2 * time.Hour), DryRun: true})
	require.NoError(t, err)
	assert.Equal(t, int64(2), n, "a dry run counts a and b")
	n, err = process.Purge(ctx, f.env.DB, "payments", time.Hour, &process.PurgeOpts{Now: at(2 * time.Hour), Batch: 1})
	require.NoError(t, err)
	assert.Equal(t, int64(2), n, "a and b, one batch each")
	left, err := process.List(ctx, f.env.DB, "payments", process.Filter{Completed: true})
	require.NoError(t, err)
	require.Len(t, left, 1)
	assert.Equal(t, "c", left[0].Key, "the running process stays")

	f.deliver(t, PaymentReceived{OrderID: "a"})
	assert.Equal(t, int64(1), f.steps.Load(), "a late payment for the purged a is ignored (its Missing policy), not a step")

	_, err = process.Purge(ctx, f.env.DB, "payments", 0, nil)
	require.ErrorIs(t, err, process.ErrInvalidRetention)
	_, err = process.Purge(ctx, f.env.DB, "pay-ments", time.Hour, nil)
	require.ErrorIs(t, err, process.ErrInvalidTable)
}
