package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// skewed is a host clock off by a fixed amount.
type skewed struct{ by time.Duration }

func (s skewed) Now() time.Time           { return time.Now().Add(s.by) }
func (s skewed) NewID(t time.Time) string { return aggregate.SystemClock{}.NewID(t) }
func (s skewed) String() string           { return s.by.String() }
func storeOn(t *testing.T, db *gorm.DB, clock aggregate.Clock) *outbox.Store {
	t.Helper()
	st, err := outbox.NewStore(db, &outbox.Config{Clock: clock})
	require.NoError(t, err)
	return st
}

// TestSkewedClocksAgreeOnTime runs writers and projectors whose host
// clocks are ten minutes ahead of or behind the database's: leases, due
// times and backoff follow the database's clock, so none of them steals a
// live lease, delays an event or retries early.
func TestSkewedClocksAgreeOnTime(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		require.NoError(t, outbox.Migrate(ctx, db))
		right := storeOn(t, db, aggregate.SystemClock{})
		ahead := storeOn(t, db, skewed{10 * time.Minute})
		behind := storeOn(t, db, skewed{-10 * time.Minute})
		add := func(st *outbox.Store) *outbox.Message {
			var m *outbox.Message
			require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
				var err error
				m, err = st.Add(ctx, tx, "order.paid", orderPaid{}, nil)
				return err
			}))
			return m
		}
		claim := func(st *outbox.Store, worker string) []*outbox.Message {
			got, err := st.Claim(ctx, outbox.ClaimOpts{Worker: worker, Limit: 10, Lease: time.Minute})
			require.NoError(t, err)
			return got
		}

		// A writer whose clock runs ahead does not delay its event.
		early := add(ahead)
		got := claim(right, "right")
		require.Equal(t, []string{early.ID}, ids(got), "an event written by a host ahead is due at once")

		// A projector whose clock runs ahead does not take a live lease.
		assert.Empty(t, claim(ahead, "ahead"), "the lease of 1m is still live by the database's clock")

		// A projector whose clock runs behind backs off by the database's
		// clock: the retry is a minute away, not ten minutes in the past.
		_, err := right.Release(ctx, "right", ids(got))
		require.NoError(t, err)
		got = claim(behind, "behind")
		require.Equal(t, []string{early.ID}, ids(got), "a host behind sees the event due")
		ok, err := behind.MarkFailed(ctx, "behind", outbox.Failure{ID: early.ID, Err: errors.New("nack"), RetryAfter: time.Minute})
		require.NoError(t, err)
		require.True(t, ok)
		assert.Empty(t, claim(right, "right"), "the retry is not due before its minute")
		assert.Empty(t, claim(ahead, "ahead"), "not even for a host ahead")

		// And the lease a host behind takes lasts its full length.
		late := add(behind)
		require.Equal(t, []string{late.ID}, ids(claim(behind, "behind")))
		assert.Empty(t, claim(right, "right"), "the lease taken by a host behind is live")
		stored, err := right.Get(ctx, late.ID)
		require.NoError(t, err)
		require.NotNil(t, stored.LockedUntil)
		assert.WithinDuration(t, time.Now().Add(time.Minute), *stored.LockedUntil, 20*time.Second,
			"the lease ends a minute from the database's now")
	})
}
