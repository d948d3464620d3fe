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
