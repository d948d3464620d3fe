package idempotency_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/internal/testenv"
)

var epoch = time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)

// clock is a settable time source.
type clock struct{ now atomic.Int64 }

func newClock(t time.Time) *clock {
	c := &clock{}
	c.set(t)
	return c
}
func (c *clock) set(t time.Time)     { c.now.Store(t.UnixNano()) }
func (c *clock) Now() time.Time      { return time.Unix(0, c.now.Load()).UTC() }
func (c *clock) add(d time.Duration) { c.now.Add(int64(d)) }

// NewID makes clock an aggregate.Clock.
func (c *clock) NewID(t time.Time) string { return aggregate.NewIDAt(t) }

// TestExpiredKeyIsTreatedAsNew checks that a key is remembered for TTL and
// is new again from the moment it expires, even before Purge removes it.
func TestExpiredKeyIsTreatedAsNew(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		clk := newClock(epoch)
		e := setup(t, b, db, &idempotency.Config{TTL: time.Hour, Clock: clk})

		first := e.post("k", "{}")
		require.Equal(t, http.StatusCreated, first.Code)
		clk.add(time.Hour - time.Millisecond)
		requireReplay(t, first, e.post("k", "{}"))

		clk.set(epoch.Add(time.Hour)) // expires_at <= now: expired
		again := e.post("k", "{}")
		require.Equal(t, http.StatusCreated, again.Code)
		assert.Empty(t, again.Header().Get(idempotency.HeaderReplayed))
		assert.Equal(t, "/things/2", again.Header().Get("Location"))
		assert.Equal(t, int64(2), e.app.calls.Load())

		// An expired key may also be reused for a different request.
		clk.set(epoch.Add(3 * time.Hour))
		require.Equal(t, http.StatusCreated, e.post("k", `{"different":true}`).Code)

		rows := e.keys(t)
		require.Len(t, rows, 1)
		assert.True(t, rows[0].CreatedAt.Equal(epoch.Add(3*time.Hour)), rows[0].CreatedAt)
		assert.True(t, rows[0].ExpiresAt.Equal(epoch.Add(4*time.Hour)), rows[0].ExpiresAt)
		assert.Equal(t, int64(3), e.app.calls.Load())
	})
}

// TestPurgeDeletesExpiredKeysOnly checks that Purge deletes the keys expired
// at the given time, in batches, and nothing else.
func TestPurgeDeletesExpiredKeysOnly(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		clk := newClock(epoch)
		e := setup(t, b, db, &idempotency.Config{TTL: time.Hour, Clock: clk})
		for _, k := range []struct {
			key string
			at  time.Duration
		}{{"a", 0}, {"b", 10 * time.Minute}, {"c", 20 * time.Minute}, {"d", 70 * time.Minute}} {
			clk.set(epoch.Add(k.at))
			require.Equal(t, http.StatusCreated, e.post(k.key, "{}").Code)
		}

		at := func(d time.Duration) *idempotency.PurgeOpts {
			return &idempotency.PurgeOpts{Clock: testenv.NewClock(epoch.Add(d))}
		}
		n, err := idempotency.CountExpired(ctx, db, 0, at(70*time.Minute))
		require.NoError(t, err)
		assert.Equal(t, int64(2), n, "the dry run counts a and b")
		n, err = idempotency.CountExpired(ctx, db, 10*time.Minute, at(70*time.Minute))
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "a expired 10 minutes before, b just now")
		one := at(70 * time.Minute)
		one.BatchSize = 1
		n, err = idempotency.Purge(ctx, db, 0, one) // a and b (at expiry); c, d live
		require.NoError(t, err)
		assert.Equal(t, int64(2), n)
		var left []string
		for _, r := range e.keys(t) {
			left = append(left, r.Key)
		}
		assert.Equal(t, []string{"c", "d"}, left)

		n, err = idempotency.Purge(ctx, db, 0, at(70*time.Minute))
		require.NoError(t, err)
		assert.Zero(t, n)
		n, err = idempotency.Purge(ctx, db, time.Hour, at(24*time.Hour))
		require.NoError(t, err)
		assert.Equal(t, int64(2), n)
		assert.Empty(t, e.keys(t))

		_, err = idempotency.Purge(ctx, db, -time.Second, nil)
		assert.ErrorIs(t, err, idempotency.ErrInvalidArgument)
		_, err = idempotency.CountExpired(ctx, db, -time.Second, nil)
		assert.ErrorIs(t, err, idempotency.ErrInvalidArgument)
	})
}
