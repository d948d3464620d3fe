package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

func TestStats(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()

		// One row a minute from epoch; the oldest row is sent, so the oldest
		// pending one is globex's failed row at epoch+1m.
		rows := []struct {
			tenant string
			status outbox.Status
		}{
			{"acme", outbox.StatusSent},       // +0m
			{"globex", outbox.StatusFailed},   // +1m
			{"acme", outbox.StatusDead},       // +2m
			{"acme", outbox.StatusPublishing}, // +3m
			{"globex", outbox.StatusNew},      // +4m
			{"acme", outbox.StatusNew},        // +5m
			{"globex", outbox.StatusSent},     // +6m
			{"acme", outbox.StatusNew},        // +7m
			{"globex", outbox.StatusDead},     // +8m
		}
		for i, r := range rows {
			if i > 0 {
				e.stamper.Advance(time.Minute)
			}
			m := e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-1"}, &outbox.AddOpts{Tenant: r.tenant})
			if r.status != outbox.StatusNew {
				require.NoError(t, db.Exec("UPDATE outbox_events SET status = ?, attempts = 1 WHERE id = ?",
					string(r.status), m.ID).Error)
			}
		}
		e.stamper.Advance(2 * time.Minute) // now is epoch+10m

		cases := []struct {
			name      string
			opts      *outbox.StatsOpts
			counts    map[outbox.Status]int64
			pending   int64
			oldestAt  time.Time
			oldestAge time.Duration
		}{
			{
				name:    "all tenants",
				opts:    nil,
				counts:  map[outbox.Status]int64{"new": 3, "publishing": 1, "failed": 1, "dead": 2},
				pending: 5, oldestAt: epoch.Add(time.Minute), oldestAge: 9 * time.Minute,
			},
			{
				name:    "empty opts",
				opts:    &outbox.StatsOpts{},
				counts:  map[outbox.Status]int64{"new": 3, "publishing": 1, "failed": 1, "dead": 2},
				pending: 5, oldestAt: epoch.Add(time.Minute), oldestAge: 9 * time.Minute,
			},
			{
				name:    "acme",
				opts:    &outbox.StatsOpts{Tenant: "acme"},
				counts:  map[outbox.Status]int64{"new": 2, "publishing": 1, "failed": 0, "dead": 1},
				pending: 3, oldestAt: epoch.Add(3 * time.Minute), oldestAge: 7 * time.Minute,
			},
			{
				name:    "globex",
				opts:    &outbox.StatsOpts{Tenant: "globex"},
				counts:  map[outbox.Status]int64{"new": 1, "publishing": 0, "failed": 1, "dead": 1},
				pending: 2, oldestAt: epoch.Add(time.Minute), oldestAge: 9 * time.Minute,
			},
			{
				name:   "tenant without rows",
				opts:   &outbox.StatsOpts{Tenant: "initech"},
				counts: map[outbox.Status]int64{"new": 0, "publishing": 0, "failed": 0, "dead": 0},
			},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				st, err := e.store.Stats(ctx, c.opts)
				require.NoError(t, err)
				assert.Equal(t, c.counts, st.Counts)
				assert.Equal(t, c.pending, st.Pending)
				assert.Equal(t, c.oldestAge, st.OldestPendingAge)
				if c.oldestAt.IsZero() {
					assert.True(t, st.OldestPendingAt.IsZero(), "OldestPendingAt %s", st.OldestPendingAt)
				} else {
					assertTime(t, c.oldestAt, st.OldestPendingAt, "OldestPendingAt")
				}
			})
		}

		// The age follows the store's clock.
		e.stamper.Advance(30 * time.Second)
		st, err := e.store.Stats(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, 9*time.Minute+30*time.Second, st.OldestPendingAge)

		// Relaying the oldest pending row moves the oldest to the next one.
		require.NoError(t, db.Exec("UPDATE outbox_events SET status = 'sent' WHERE tenant_id = 'globex' AND status = 'failed'").Error)
		st, err = e.store.Stats(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, int64(4), st.Pending)
		_, counted := st.Counts[outbox.StatusSent]
		assert.False(t, counted, "sent rows are not counted")
		assert.Equal(t, 7*time.Minute+30*time.Second, st.OldestPendingAge)
	})
}

func TestStatsEmpty(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		st, err := e.store.Stats(context.Background(), nil)
		require.NoError(t, err)
		require.Len(t, st.Counts, len(outbox.UnsentStatuses))
		for _, s := range outbox.UnsentStatuses {
			n, ok := st.Counts[s]
			assert.True(t, ok, "status %s present", s)
			assert.Equal(t, int64(0), n, "status %s", s)
		}
		assert.Equal(t, int64(0), st.Pending)
		assert.Equal(t, time.Duration(0), st.OldestPendingAge)
		assert.True(t, st.OldestPendingAt.IsZero())
	})
}

func TestStatsAgeNeverNegative(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-1"}, nil)

		// A store whose clock is behind the row's created_at.
		behind, err := outbox.NewStore(db, &outbox.Config{Clock: testenv.NewClock(epoch.Add(-time.Hour))})
		require.NoError(t, err)
		st, err := behind.Stats(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, int64(1), st.Pending)
		assertTime(t, epoch, st.OldestPendingAt, "OldestPendingAt")
		assert.Equal(t, time.Duration(0), st.OldestPendingAge)
	})
}
