package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// scheduleOne writes one scheduled message in its own transaction.
func scheduleOne(t *testing.T, db *gorm.DB, st *outbox.Store, tenantID, topic, key string, due time.Time) *outbox.ScheduledMessage {
	t.Helper()
	tx := db.Begin()
	m, err := st.Schedule(t.Context(), tx, topic, map[string]any{"key": key}, outbox.At(due), &outbox.ScheduleOpts{Tenant: tenantID, Key: key})
	if err != nil {
		tx.Rollback()
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit().Error)
	return m
}

// TestScheduledListAndCancelThroughTheBinary lists and cancels scheduled
// messages on PostgreSQL and SQLite: the list is first due first under a
// line counting what waits, --tenant and --key narrow it, a cancel takes
// the key's waiting messages of its tenant only (the default tenant
// without --tenant), and a cancel that finds nothing waiting, or finds
// the key already released for delivery, says so and exits 1.
func TestScheduledListAndCancelThroughTheBinary(t *testing.T) {
	onBusDatabases(t, func(t *testing.T, db *gorm.DB, dsn string) {
		ctx := t.Context()
		require.NoError(t, outbox.Migrate(ctx, db))
		now := time.Now().UTC().Truncate(time.Second)
		clock := testenv.NewClock(now)
		st, err := outbox.NewStore(db, &outbox.Config{Clock: clock, Test: outbox.TestConfig{Clock: clock}})
		require.NoError(t, err)

		// The default tenant's reminder was released for delivery a minute
		// after it was scheduled: too late to cancel.
		scheduleOne(t, db, st, "default", "invoice.remind", "late-1", now.Add(time.Minute))
		clock.Set(now.Add(2 * time.Minute))
		r, err := st.ReleaseDue(ctx, outbox.ReleaseOpts{})
		require.NoError(t, err)
		require.Equal(t, 1, r.Released)
		clock.Set(now)
		acme1 := scheduleOne(t, db, st, "acme", "invoice.remind", "invoice-7", now.Add(time.Hour))
		acme2 := scheduleOne(t, db, st, "acme", "invoice.remind", "invoice-7", now.Add(90*time.Minute))
		globex := scheduleOne(t, db, st, "globex", "invoice.remind", "invoice-7", now.Add(30*time.Minute))
		cart := scheduleOne(t, db, st, "default", "cart.abandoned", "", now.Add(2*time.Hour))
		rfc := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }

		res := bento(t, dsn, "", "scheduled", "list")
		require.Equal(t, 0, res.code, res.stderr)
		lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
		require.Len(t, lines, 6, res.stdout)
		assert.Equal(t, "4 scheduled messages waiting, first due at "+rfc(globex.DueAt), lines[0])
		assert.Equal(t, []string{"ID", "TENANT", "TOPIC", "KEY", "DUE", "AT", "CREATED", "AT"}, strings.Fields(lines[1]))
		for i, m := range []*outbox.ScheduledMessage{globex, acme1, acme2, cart} {
			key := m.Key
			if key == "" {
				key = "-"
			}
			assert.Equal(t, []string{m.ID, m.TenantID, m.Topic, key, rfc(m.DueAt), rfc(now)}, strings.Fields(lines[2+i]), "row %d", i)
		}

		res = bento(t, dsn, "", "scheduled", "list", "--tenant", "acme")
		require.Equal(t, 0, res.code, res.stderr)
		assert.True(t, strings.HasPrefix(res.stdout, "2 scheduled messages waiting for tenant acme, first due at "+rfc(acme1.DueAt)+"\n"), res.stdout)
		assert.Contains(t, res.stdout, acme1.ID)
		assert.Contains(t, res.stdout, acme2.ID)
		assert.NotContains(t, res.stdout, globex.ID, "--tenant scopes the list")
		assert.NotContains(t, res.stdout, cart.ID)

		res = bento(t, dsn, "", "scheduled", "list", "--tenant", "acme", "--key", "invoice-7", "--limit", "1")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Contains(t, res.stdout, acme1.ID)
		assert.NotContains(t, res.stdout, acme2.ID)
		assert.Contains(t, res.stdout, "(first 1; raise --limit or narrow the filter for more)")

		res = bento(t, dsn, "", "scheduled", "list", "--tenant", "acme", "--key", "nope")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Equal(t, "2 scheduled messages waiting for tenant acme, first due at "+rfc(acme1.DueAt)+"\nnone with key nope\n", res.stdout)

		res = bento(t, dsn, "", "scheduled", "list", "--tenant", "initech")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Equal(t, "no scheduled messages waiting for tenant initech\n", res.stdout)

		waiting := func() []string {
			rows, err := st.ListScheduled(ctx, outbox.ScheduledFilter{})
			require.NoError(t, err)
			var ids []string
			for _, m := range rows {
				ids = append(ids, m.ID)
			}
			return ids
		}

		res = bento(t, dsn, "", "scheduled", "cancel", "--key", "invoice-7", "--tenant", "acme", "--dry-run")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Equal(t, "would cancel 2 scheduled messages with key invoice-7 of tenant acme (dry run: nothing changed)\n", res.stdout)
		assert.Len(t, waiting(), 4, "a dry run cancels nothing")

		res = bento(t, dsn, "n\n", "scheduled", "cancel", "--key", "invoice-7", "--tenant", "acme")
		assert.Equal(t, 1, res.code)
		assert.Contains(t, res.stderr, "cancel 2 scheduled messages with key invoice-7 of tenant acme? They are never delivered. [y/N]")
		assert.Contains(t, res.stderr, errDeclined.Error())
		assert.Len(t, waiting(), 4, "a declined cancel cancels nothing")

		res = bento(t, dsn, "", "scheduled", "cancel", "--key", "invoice-7", "--tenant", "acme", "--yes")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Equal(t, "cancelled 2 scheduled messages with key invoice-7 of tenant acme\n", res.stdout)
		assert.Equal(t, []string{globex.ID, cart.ID}, waiting(), "globex's message under the same key still waits")

		res = bento(t, dsn, "", "scheduled", "cancel", "--key", "invoice-7", "--tenant", "acme", "--yes")
		assert.Equal(t, 1, res.code)
		assert.Empty(t, res.stdout)
		assert.Equal(t, "bento scheduled cancel: nothing to cancel: no scheduled messages with key invoice-7 of tenant acme wait "+
			"(none was scheduled under the key, or it was cancelled already) ("+outbox.ErrNotScheduled.Error()+")\n", res.stderr)

		// Without --tenant the key is the default tenant's: globex's stays.
		res = bento(t, dsn, "", "scheduled", "cancel", "--key", "invoice-7", "--yes")
		assert.Equal(t, 1, res.code)
		assert.Contains(t, res.stderr, "nothing to cancel: no scheduled messages with key invoice-7 of tenant default wait")
		assert.Equal(t, []string{globex.ID, cart.ID}, waiting())

		res = bento(t, dsn, "", "scheduled", "cancel", "--key", "late-1", "--dry-run")
		assert.Equal(t, 1, res.code)
		assert.Empty(t, res.stdout)
		assert.Equal(t, "bento scheduled cancel: too late to cancel: every scheduled message with key late-1 of tenant default "+
			"was already released for delivery, and is or will be delivered ("+outbox.ErrCancelTooLate.Error()+")\n", res.stderr)

		for _, args := range [][]string{
			{"scheduled", "cancel", "--tenant", "acme"},
			{"scheduled", "cancel", "--key", "k", "--tenant", "bad tenant"},
			{"scheduled", "list", "--limit", "0"},
		} {
			res = bento(t, dsn, "", args...)
			assert.Equal(t, 2, res.code, "bento %s", strings.Join(args, " "))
		}
		assert.Equal(t, []string{globex.ID, cart.ID}, waiting(), "nothing else was cancelled")
	})
}
