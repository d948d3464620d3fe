package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// opsFixture writes, at epoch + 0..4 s, rows of two tenants and two topics,
// and takes them to sent, failed and dead:
//
//	default order.paid:   a (sent at epoch+1m), b (dead at epoch+1m)
//	default order.placed: c (failed at epoch+2m), d (new)
//	acme    order.paid:   e (new)
func opsFixture(t *testing.T, e *env) map[string]*outbox.Message {
	t.Helper()
	ctx := context.Background()
	rows := map[string]*outbox.Message{}
	for _, r := range []struct{ name, tenant, topic string }{
		{"a", "default", "order.paid"}, {"b", "default", "order.paid"},
		{"c", "default", "order.placed"}, {"d", "default", "order.placed"},
		{"e", "acme", "order.paid"},
	} {
		rows[r.name] = e.add(ctx, t, r.topic, orderPaid{OrderID: r.name}, &outbox.AddOpts{Tenant: r.tenant})
		e.stamper.Advance(time.Second)
	}
	e.stamper.Set(epoch.Add(time.Minute))
	claimed := e.claim(t, "w", 3) // a, b, c: oldest first
	require.Len(t, claimed, 3)
	_, err := e.store.MarkSent(ctx, "w", []string{rows["a"].ID})
	require.NoError(t, err)
	_, err = e.store.MarkFailed(ctx, "w", outbox.Failure{ID: rows["b"].ID, Err: errors.New("poison"), Dead: true})
	require.NoError(t, err)
	e.stamper.Set(epoch.Add(2*time.Minute + 30*time.Second))
	_, err = e.store.MarkFailed(ctx, "w", outbox.Failure{ID: rows["c"].ID, Err: errors.New("down"), RetryAfter: time.Hour - 150*time.Second})
	require.NoError(t, err)
	return rows
}

func TestBreakdownGroupsByTenantTopicStatus(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		opsFixture(t, e)
		got, err := e.store.Breakdown(context.Background(), nil)
		require.NoError(t, err)
		sec := func(n int) time.Time { return epoch.Add(time.Duration(n) * time.Second) }
		want := []outbox.Group{
			{Tenant: "acme", Topic: "order.paid", Status: outbox.StatusNew, Count: 1, Oldest: sec(4)},
			// a, sent, is not counted.
			{Tenant: "default", Topic: "order.paid", Status: outbox.StatusDead, Count: 1, Oldest: sec(1)},
			{Tenant: "default", Topic: "order.placed", Status: outbox.StatusNew, Count: 1, Oldest: sec(3)},
			{Tenant: "default", Topic: "order.placed", Status: outbox.StatusFailed, Count: 1, Oldest: sec(2)},
		}
		require.Len(t, got, len(want), "%+v", got)
		for i := range want {
			assert.Equal(t, want[i].Tenant, got[i].Tenant, i)
			assert.Equal(t, want[i].Topic, got[i].Topic, i)
			assert.Equal(t, want[i].Status, got[i].Status, i)
			assert.Equal(t, want[i].Count, got[i].Count, i)
			assert.True(t, want[i].Oldest.Equal(got[i].Oldest), "%d: oldest %v, want %v", i, got[i].Oldest, want[i].Oldest)
		}

		acme, err := e.store.Breakdown(context.Background(), &outbox.StatsOpts{Tenant: "acme"})
		require.NoError(t, err)
		require.Len(t, acme, 1)
		assert.Equal(t, "acme", acme[0].Tenant)
	})
}

func TestActivityCountsPerMinute(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		opsFixture(t, e)
		e.stamper.Set(epoch.Add(3*time.Minute + 10*time.Second))
		got, err := e.store.Activity(context.Background(), 4, nil)
		require.NoError(t, err)
		require.Len(t, got, 4)
		for i, m := range got {
			assert.True(t, m.Start.Equal(epoch.Add(time.Duration(i)*time.Minute)), "minute %d starts %v", i, m.Start)
		}
		assert.Equal(t, []int64{0, 1, 0, 0}, []int64{got[0].Published, got[1].Published, got[2].Published, got[3].Published})
		// b died at epoch+1m, c failed at epoch+2m30s.
		assert.Equal(t, []int64{0, 1, 1, 0}, []int64{got[0].Failed, got[1].Failed, got[2].Failed, got[3].Failed})

		// A window that starts after the events sees none of them.
		e.stamper.Set(epoch.Add(10 * time.Minute))
		got, err = e.store.Activity(context.Background(), 2, nil)
		require.NoError(t, err)
		for _, m := range got {
			assert.Zero(t, m.Published+m.Failed, "minute %v", m.Start)
		}

		_, err = e.store.Activity(context.Background(), 0, nil)
		assert.ErrorIs(t, err, outbox.ErrInvalidArgument)

		// Recent: in the last 2 minutes before epoch+3m10s only c failed.
		e.stamper.Set(epoch.Add(3*time.Minute + 10*time.Second))
		rec, err := e.store.Recent(context.Background(), 2*time.Minute, nil)
		require.NoError(t, err)
		assert.Equal(t, []outbox.Throughput{{Tenant: "default", Failed: 1}}, rec)
		rec, err = e.store.Recent(context.Background(), 3*time.Minute, nil)
		require.NoError(t, err)
		assert.Equal(t, []outbox.Throughput{{Tenant: "default", Published: 1, Failed: 2}}, rec)
		rec, err = e.store.Recent(context.Background(), 3*time.Minute, &outbox.StatsOpts{Tenant: "acme"})
		require.NoError(t, err)
		assert.Empty(t, rec)
	})
}

func TestDiscardDeletesOnlyMatchingDeadRows(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		rows := opsFixture(t, e)

		_, err := e.store.Discard(ctx, outbox.Filter{}, false)
		assert.ErrorIs(t, err, outbox.ErrNoFilter)

		n, err := e.store.CountDead(ctx, outbox.Filter{Topic: "order.placed"})
		require.NoError(t, err)
		assert.Zero(t, n)
		n, err = e.store.Discard(ctx, outbox.Filter{Topic: "order.placed"}, false)
		require.NoError(t, err)
		assert.Zero(t, n, "order.placed has a failed row but no dead one")

		n, err = e.store.CountDead(ctx, outbox.Filter{})
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		n, err = e.store.Discard(ctx, outbox.Filter{Topic: "order.paid"}, false)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		assert.Zero(t, countRows(t, db, "id = ?", rows["b"].ID))
		assert.Equal(t, int64(4), countRows(t, db, ""), "only the dead row is gone")
	})
}

func TestDiscardAllDeletesEveryDeadRow(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		rows := opsFixture(t, e)

		dead, err := e.store.ListDead(ctx, outbox.Filter{}, 0)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		assert.Equal(t, rows["b"].ID, dead[0].ID)

		// An empty filter with all: a statement without a bind parameter.
		n, err := e.store.Discard(ctx, outbox.Filter{}, true)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		n, err = e.store.CountDead(ctx, outbox.Filter{})
		require.NoError(t, err)
		assert.Zero(t, n)
		assert.Equal(t, int64(4), countRows(t, db, ""), "only the dead row is gone")
	})
}

func TestCountSentMatchesPurge(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		opsFixture(t, e) // a sent at epoch+1m
		e.stamper.Set(epoch.Add(time.Hour))
		for _, c := range []struct {
			age  time.Duration
			want int64
		}{{2 * time.Hour, 0}, {58 * time.Minute, 1}} {
			n, err := e.store.CountSent(ctx, c.age, nil)
			require.NoError(t, err)
			assert.Equal(t, c.want, n, "older than %v", c.age)
		}
		n, err := e.store.CountSent(ctx, time.Minute, &outbox.PurgeOpts{Tenant: "acme"})
		require.NoError(t, err)
		assert.Zero(t, n, "acme has no sent row")
		purged, err := e.store.PurgeSent(ctx, 58*time.Minute, nil)
		require.NoError(t, err)
		assert.Equal(t, int64(1), purged)
		_, err = e.store.CountSent(ctx, -time.Second, nil)
		assert.ErrorIs(t, err, outbox.ErrInvalidArgument)
		_, err = e.store.PurgeSent(ctx, -time.Second, nil)
		assert.ErrorIs(t, err, outbox.ErrInvalidArgument)
	})
}

func TestStatusPendingAndIndex(t *testing.T) {
	t.Parallel()
	var pending []outbox.Status
	for i, s := range outbox.Statuses {
		assert.Equal(t, i, s.Index(), s)
		if s.Pending() {
			pending = append(pending, s)
		}
	}
	assert.Equal(t, []outbox.Status{outbox.StatusNew, outbox.StatusPublishing, outbox.StatusFailed}, pending)
	assert.Equal(t, -1, outbox.Status("lost").Index())
	assert.False(t, outbox.Status("lost").Pending())
}
