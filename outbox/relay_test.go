package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

const lease = 30 * time.Second

func ids(ms []*outbox.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// addAgg adds version v of aggregate agg.
func (e *env) addAgg(t *testing.T, agg string, v int64) *outbox.Message {
	t.Helper()
	return e.add(context.Background(), t, "order.changed", orderPaid{OrderID: agg, Amount: v},
		&outbox.AddOpts{AggregateType: "order", AggregateID: agg, AggregateVersion: v})
}

func (e *env) claim(t *testing.T, worker string, limit int) []*outbox.Message {
	t.Helper()
	ms, err := e.store.Claim(context.Background(), outbox.ClaimOpts{Worker: worker, Limit: limit, Lease: lease})
	require.NoError(t, err)
	return ms
}

func TestClaimLeasesDueRows(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		var added []string
		for i := 0; i < 5; i++ {
			added = append(added, e.add(ctx, t, "order.paid", orderPaid{OrderID: fmt.Sprint(i)}, nil).ID)
		}
		first := e.claim(t, "w1", 3)
		require.Len(t, first, 3)
		assert.Equal(t, added[:3], ids(first), "oldest first")
		for i, m := range first {
			assert.Equal(t, outbox.StatusPublishing, m.Status)
			require.NotNil(t, m.LockedBy)
			assert.Equal(t, "w1", *m.LockedBy)
			require.NotNil(t, m.LockedUntil)
			assertTime(t, epoch.Add(lease), *m.LockedUntil, "locked_until")
			assertTime(t, epoch.Add(lease), m.AvailableAt, "available_at")
			assert.Equal(t, 0, m.Attempts)
			assert.JSONEq(t, fmt.Sprintf(`{"order_id":"%d","amount":0}`, i), string(m.Payload))
		}
		second := e.claim(t, "w2", 10)
		assert.Equal(t, added[3:], ids(second), "a second worker gets only the rest")
		assert.Empty(t, e.claim(t, "w3", 10))

		n, err := e.store.MarkSent(ctx, "w1", ids(first))
		require.NoError(t, err)
		assert.Equal(t, int64(3), n)
		assert.Equal(t, int64(3), countRows(t, db, "status = ? AND published_at IS NOT NULL AND locked_by IS NULL", "sent"))

		_, err = e.store.Claim(ctx, outbox.ClaimOpts{Worker: "", Limit: 1, Lease: lease})
		require.ErrorIs(t, err, outbox.ErrInvalidClaim)
		_, err = e.store.Claim(ctx, outbox.ClaimOpts{Worker: "w", Limit: 0, Lease: lease})
		require.ErrorIs(t, err, outbox.ErrInvalidClaim)
		_, err = e.store.Claim(ctx, outbox.ClaimOpts{Worker: "w", Limit: 1, Lease: -time.Second})
		require.ErrorIs(t, err, outbox.ErrInvalidClaim)
	})
}

// TestClaimKeepsAggregateOrder walks one aggregate through sent, failed,
// dead and requeued events and checks that a later event is never claimable
// while an earlier one is unsent, while other aggregates flow.
func TestClaimKeepsAggregateOrder(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		x1, x2, x3 := e.addAgg(t, "x", 1), e.addAgg(t, "x", 2), e.addAgg(t, "x", 3)
		y1 := e.addAgg(t, "y", 1)

		got := e.claim(t, "w", 10)
		assert.ElementsMatch(t, []string{x1.ID, y1.ID}, ids(got), "only the head of each aggregate")
		_, err := e.store.MarkSent(ctx, "w", []string{x1.ID, y1.ID})
		require.NoError(t, err)

		got = e.claim(t, "w", 10)
		assert.Equal(t, []string{x2.ID}, ids(got))
		ok, err := e.store.MarkFailed(ctx, "w", outbox.Failure{ID: x2.ID, Err: errors.New("broker down"), RetryAfter: time.Minute})
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Empty(t, e.claim(t, "w", 10), "x3 waits behind the failed x2")

		e.stamper.Advance(time.Minute)
		got = e.claim(t, "w", 10)
		require.Equal(t, []string{x2.ID}, ids(got), "x2 is retried when due")
		assert.Equal(t, 1, got[0].Attempts)
		require.NotNil(t, got[0].LastError)
		assert.Equal(t, "broker down", *got[0].LastError)
		require.NotNil(t, got[0].FailedAt, "a failure records when it happened")
		assert.True(t, got[0].FailedAt.Equal(epoch), "failed_at %v, want %v", got[0].FailedAt, epoch)

		ok, err = e.store.MarkFailed(ctx, "w", outbox.Failure{ID: x2.ID, Err: errors.New("poison"), Dead: true})
		require.NoError(t, err)
		assert.True(t, ok)
		y2 := e.addAgg(t, "y", 2)
		assert.Equal(t, []string{y2.ID}, ids(e.claim(t, "w", 10)), "a dead x2 holds back x3 only")

		n, err := e.store.Requeue(ctx, outbox.Filter{AggregateID: "x"}, false)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		got = e.claim(t, "w", 10)
		require.Equal(t, []string{x2.ID}, ids(got), "requeued x2 comes back before x3")
		assert.Equal(t, 0, got[0].Attempts)
		_, err = e.store.MarkSent(ctx, "w", ids(got))
		require.NoError(t, err)
		assert.Equal(t, []string{x3.ID}, ids(e.claim(t, "w", 10)))
	})
}

// TestExpiredLeaseIsTakenOver plays a projector that crashed holding rows.
func TestExpiredLeaseIsTakenOver(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		m := e.addAgg(t, "x", 1)
		require.Len(t, e.claim(t, "crashed", 10), 1)
		assert.Empty(t, e.claim(t, "w2", 10), "not before the lease runs out")

		e.stamper.Advance(lease)
		got := e.claim(t, "w2", 10)
		require.Equal(t, []string{m.ID}, ids(got))
		assert.Equal(t, 1, got[0].Attempts, "a takeover counts as an attempt")
		require.NotNil(t, got[0].LastError)
		assert.Contains(t, *got[0].LastError, "lease of crashed expired")
		require.NotNil(t, got[0].FailedAt, "an expired lease counts as a failure")
		assert.True(t, got[0].FailedAt.Equal(epoch.Add(lease)), "failed_at %v", got[0].FailedAt)

		// The crashed worker comes back: its outcomes are fenced off.
		n, err := e.store.MarkSent(ctx, "crashed", []string{m.ID})
		require.NoError(t, err)
		assert.Equal(t, int64(0), n)
		ok, err := e.store.MarkFailed(ctx, "crashed", outbox.Failure{ID: m.ID, Err: errors.New("late"), Dead: true})
		require.NoError(t, err)
		assert.False(t, ok)
		n, err = e.store.MarkSent(ctx, "w2", []string{m.ID})
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
	})
}

func TestReleaseDeleteAndTenantFilter(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		a := e.add(ctx, t, "order.paid", orderPaid{}, &outbox.AddOpts{Tenant: "acme"})
		b := e.add(ctx, t, "order.paid", orderPaid{}, &outbox.AddOpts{Tenant: "globex"})

		got, err := e.store.Claim(ctx, outbox.ClaimOpts{Worker: "w", Limit: 10, Lease: lease, Tenant: "acme"})
		require.NoError(t, err)
		require.Equal(t, []string{a.ID}, ids(got))

		n, err := e.store.Release(ctx, "w", []string{a.ID})
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		assert.Equal(t, int64(2), countRows(t, db, "status = ? AND locked_by IS NULL", "new"))

		got = e.claim(t, "w", 10)
		require.ElementsMatch(t, []string{a.ID, b.ID}, ids(got))
		n, err = e.store.DeleteSent(ctx, "w", []string{a.ID})
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		assert.Equal(t, int64(1), countRows(t, db, ""))

		// Release of a row that had failed before keeps it failed.
		ok, err := e.store.MarkFailed(ctx, "w", outbox.Failure{ID: b.ID, Err: errors.New("x")})
		require.NoError(t, err)
		require.True(t, ok)
		require.Len(t, e.claim(t, "w", 10), 1)
		_, err = e.store.Release(ctx, "w", []string{b.ID})
		require.NoError(t, err)
		assert.Equal(t, int64(1), countRows(t, db, "status = ? AND attempts = 1", "failed"))
	})
}

func TestMarkFailedTruncatesError(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		m := e.add(context.Background(), t, "order.paid", orderPaid{}, nil)
		require.Len(t, e.claim(t, "w", 1), 1)
		long := strings.Repeat("é", 5000)
		ok, err := e.store.MarkFailed(context.Background(), "w", outbox.Failure{ID: m.ID, Err: errors.New(long)})
		require.NoError(t, err)
		require.True(t, ok)
		got, err := e.store.Get(context.Background(), m.ID)
		require.NoError(t, err)
		require.NotNil(t, got.LastError)
		assert.Equal(t, outbox.MaxLastErrorLen, len([]rune(*got.LastError)))
		assert.True(t, strings.HasSuffix(*got.LastError, "..."))
	})
}

func TestRequeueAndListDead(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		kill := func(topic, tenantID string) *outbox.Message {
			m := e.add(ctx, t, topic, orderPaid{}, &outbox.AddOpts{Tenant: tenantID})
			got, err := e.store.Claim(ctx, outbox.ClaimOpts{Worker: "w", Limit: 1, Lease: lease, Tenant: tenantID})
			require.NoError(t, err)
			require.Equal(t, []string{m.ID}, ids(got))
			ok, err := e.store.MarkFailed(ctx, "w", outbox.Failure{ID: m.ID, Err: errors.New("bad " + topic), Dead: true})
			require.NoError(t, err)
			require.True(t, ok)
			return m
		}
		paid, shipped, other := kill("order.paid", "acme"), kill("order.shipped", "acme"), kill("order.paid", "globex")
		alive := e.add(ctx, t, "order.paid", orderPaid{}, nil)

		dead, err := e.store.ListDead(ctx, outbox.Filter{}, 10)
		require.NoError(t, err)
		require.Len(t, dead, 3)
		assert.Equal(t, "bad order.paid", *dead[0].LastError)
		dead, err = e.store.ListDead(ctx, outbox.Filter{Tenant: "acme", Topic: "order.paid"}, 10)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		assert.Equal(t, paid.ID, dead[0].ID)

		_, err = e.store.Requeue(ctx, outbox.Filter{}, false)
		require.ErrorIs(t, err, outbox.ErrNoFilter)

		n, err := e.store.Requeue(ctx, outbox.Filter{Topic: "order.paid", Tenant: "acme"}, false)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		n, err = e.store.Requeue(ctx, outbox.Filter{IDs: []string{shipped.ID, alive.ID}}, false)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "only dead rows are requeued")
		assert.Equal(t, int64(1), countRows(t, db, "status = 'dead'"))
		n, err = e.store.Requeue(ctx, outbox.Filter{}, true)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		assert.Equal(t, int64(4), countRows(t, db, "status = 'new' AND attempts = 0"))
		_ = other
	})
}

func TestPurgeSent(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		send := func(n int) {
			var got []string
			for i := 0; i < n; i++ {
				got = append(got, e.add(ctx, t, "order.paid", orderPaid{}, &outbox.AddOpts{Tenant: "acme"}).ID)
			}
			require.Len(t, e.claim(t, "w", n), n)
			m, err := e.store.MarkSent(ctx, "w", got)
			require.NoError(t, err)
			require.Equal(t, int64(n), m)
		}
		send(5) // published at epoch
		e.stamper.Advance(2 * time.Hour)
		send(3) // published at epoch+2h
		e.add(ctx, t, "order.paid", orderPaid{}, nil)

		n, err := e.store.PurgeSent(ctx, time.Hour, &outbox.PurgeOpts{BatchSize: 2, Tenant: "globex"})
		require.NoError(t, err)
		assert.Equal(t, int64(0), n, "another tenant's rows are kept")
		n, err = e.store.PurgeSent(ctx, time.Hour, &outbox.PurgeOpts{BatchSize: 2})
		require.NoError(t, err)
		assert.Equal(t, int64(5), n)
		assert.Equal(t, int64(3), countRows(t, db, "status = 'sent'"))
		assert.Equal(t, int64(1), countRows(t, db, "status = 'new'"))
	})
}

// TestConcurrentClaimersNeverShareARow runs 4 claimers over 600 rows on
// PostgreSQL: every row is claimed exactly once.
func TestConcurrentClaimersNeverShareARow(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	e := setup(t, db, nil)
	ctx := context.Background()
	require.NoError(t, db.Exec(`INSERT INTO outbox_events (id, topic, payload, occurred_at, created_at, available_at)
		SELECT lpad(g::text, 26, '0'), 'order.paid', '{}', @t, @t, @t FROM generate_series(1, 600) g`,
		map[string]any{"t": epoch}).Error)

	var (
		mu      sync.Mutex
		claimed = map[string]string{}
		wg      sync.WaitGroup
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(worker string) {
			defer wg.Done()
			for {
				got, err := e.store.Claim(ctx, outbox.ClaimOpts{Worker: worker, Limit: 25, Lease: lease})
				if !assert.NoError(t, err) || len(got) == 0 {
					return
				}
				mu.Lock()
				for _, m := range got {
					if prev, dup := claimed[m.ID]; dup {
						t.Errorf("row %s claimed by %s and %s", m.ID, prev, worker)
					}
					claimed[m.ID] = worker
				}
				mu.Unlock()
				_, err = e.store.MarkSent(ctx, worker, ids(got))
				assert.NoError(t, err)
			}
		}(fmt.Sprintf("w%d", w))
	}
	wg.Wait()
	assert.Len(t, claimed, 600)
	assert.Equal(t, int64(600), countRows(t, db, "status = 'sent'"))
}

// TestClaimByteBudget checks that a claim stops before the row that would
// pass its byte budget, and that a row larger than the budget goes alone.
func TestClaimByteBudget(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		big := strings.Repeat("x", 1000)
		var added []*outbox.Message
		for range 5 {
			added = append(added, e.add(ctx, t, "order.paid", map[string]string{"note": big}, nil))
		}
		huge := e.add(ctx, t, "order.paid", map[string]string{"note": strings.Repeat("y", 5000)}, nil)
		size := int64(added[0].SizeBytes)
		require.Greater(t, size, int64(1000))

		claim := func(budget int64) []*outbox.Message {
			got, err := e.store.Claim(ctx, outbox.ClaimOpts{Worker: "w", Limit: 10, Lease: lease, MaxBytes: budget})
			require.NoError(t, err)
			return got
		}
		got := claim(2*size + size/2)
		assert.Equal(t, ids(added[:2]), ids(got), "two rows fit the budget, the third would pass it")
		got = claim(3 * size)
		assert.Equal(t, ids(added[2:5]), ids(got), "a budget met exactly takes the row")
		got = claim(size)
		assert.Equal(t, []string{huge.ID}, ids(got), "a row larger than the budget goes alone")

		_, err := e.store.Claim(ctx, outbox.ClaimOpts{Worker: "w", Limit: 1, Lease: lease, MaxBytes: -1})
		require.ErrorIs(t, err, outbox.ErrInvalidClaim)
	})
}

// TestClaimByteBudgetAcrossRounds checks that a claim that looks again
// (its first row has a later version waiting) does not pass over the row
// its byte budget left out to take a smaller one behind it: on PostgreSQL
// the next round starts at that row, not after the last row looked at.
func TestClaimByteBudgetAcrossRounds(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		first := e.addAgg(t, "a", 1)
		e.addAgg(t, "a", 2)
		e.add(ctx, t, "order.paid", map[string]string{"note": strings.Repeat("x", 2000)}, nil)
		e.add(ctx, t, "order.paid", map[string]string{"note": "small"}, nil)

		got, err := e.store.Claim(ctx, outbox.ClaimOpts{Worker: "w", Limit: 10, Lease: lease, MaxBytes: int64(first.SizeBytes) + 200})
		require.NoError(t, err)
		require.Len(t, got, 1, "claimed %v", ids(got))
		assert.Equal(t, first.ID, got[0].ID)
		assert.True(t, got[0].NextWaits, "the claim had a reason to look again")
	})
}
