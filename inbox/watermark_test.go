package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/uow"
)

// versionMsg is message id of version v of the cart aggregate id.
func versionMsg(id, aggregateID string, v int64) *message.Message {
	m := newMsg(id)
	m.Metadata.Set(messaging.MetaAggregateType, "cart")
	m.Metadata.Set(messaging.MetaAggregateID, aggregateID)
	m.Metadata.Set(messaging.MetaAggregateVersion, strconv.FormatInt(v, 10))
	return m
}

// Applied is the row the ordered handler writes: its serial id is the
// order of application.
type Applied struct {
	Seq         uint `gorm:"primaryKey;autoIncrement"`
	AggregateID string
	Version     int64
}

func writeApplied(msg *message.Message) ([]*message.Message, error) {
	v, err := strconv.ParseInt(msg.Metadata.Get(messaging.MetaAggregateVersion), 10, 64)
	if err != nil {
		return nil, err
	}
	return nil, uow.DB(msg.Context(), nil).Create(&Applied{AggregateID: msg.Metadata.Get(messaging.MetaAggregateID), Version: v}).Error
}

func withVersions(t testing.TB, db *gorm.DB, consumer string, v inbox.Versions) *inbox.Inbox {
	t.Helper()
	require.NoError(t, db.AutoMigrate(&Applied{}))
	in, err := inbox.New(db, &inbox.Config{Consumer: consumer, Versions: v})
	require.NoError(t, err)
	return in
}

// TestWatermarkDedupOutlivesRetention purges every message-id record, then
// delivers the old messages again: with a watermark they are skipped, while
// without one (the message-id dedup alone) they would be applied twice.
func TestWatermarkDedupOutlivesRetention(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "billing")
		ctx := context.Background()
		for _, v := range []inbox.Versions{inbox.VersionsIncreasing, inbox.VersionsContiguous, inbox.VersionsIgnored} {
			t.Run(v.String(), func(t *testing.T) {
				consumer := "billing-" + v.String()
				in := withVersions(t, e.db, consumer, v)
				h := in.Middleware(writeApplied)
				cart := "cart-" + v.String()
				for n := int64(1); n <= 3; n++ {
					_, err := h(versionMsg(fmt.Sprintf("%s-m%d", cart, n), cart, n))
					require.NoError(t, err)
				}
				_, err := inbox.Purge(ctx, e.db, 0, &inbox.PurgeOpts{Consumer: consumer})
				require.NoError(t, err)
				ok, err := in.Processed(ctx, cart+"-m1")
				require.NoError(t, err)
				require.False(t, ok, "the message-id record is gone")

				for n := int64(1); n <= 3; n++ {
					_, err := h(versionMsg(fmt.Sprintf("%s-m%d", cart, n), cart, n))
					require.NoError(t, err, "a late duplicate is acknowledged")
				}
				_, err = h(versionMsg(cart+"-m4", cart, 4))
				require.NoError(t, err)
				applied := e.count(t, &Applied{}, "aggregate_id = ?", cart)
				mark, err := in.Watermark(ctx, "acme", "cart", cart)
				require.NoError(t, err)
				if v == inbox.VersionsIgnored {
					assert.EqualValues(t, 7, applied, "without a watermark, purged records mean duplicates applied again")
					assert.Zero(t, mark)
					return
				}
				assert.EqualValues(t, 4, applied, "each version applied once")
				assert.EqualValues(t, 4, mark)
			})
		}
	})
}

// TestContiguousVersionsRefuseGaps delivers version 3 before version 2: it
// is refused with ErrGap and leaves nothing behind, then applies once its
// predecessor has been applied.
func TestContiguousVersionsRefuseGaps(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "billing")
		ctx := context.Background()
		in := withVersions(t, e.db, "billing", inbox.VersionsContiguous)
		h := in.Middleware(writeApplied)

		_, err := h(versionMsg("c2-m2", "c2", 2))
		require.ErrorIs(t, err, inbox.ErrGap, "an aggregate's first delivery must be version 1")

		_, err = h(versionMsg("c1-m1", "c1", 1))
		require.NoError(t, err)
		_, err = h(versionMsg("c1-m3", "c1", 3))
		require.ErrorIs(t, err, inbox.ErrGap)
		ok, err := in.Processed(ctx, "c1-m3")
		require.NoError(t, err)
		assert.False(t, ok, "a refused message is not recorded")
		mark, err := in.Watermark(ctx, "acme", "cart", "c1")
		require.NoError(t, err)
		assert.EqualValues(t, 1, mark)

		_, err = h(versionMsg("c1-m2", "c1", 2))
		require.NoError(t, err)
		_, err = h(versionMsg("c1-m3", "c1", 3))
		require.NoError(t, err, "redelivered after its predecessor, it applies")

		var got []int64
		require.NoError(t, e.db.Model(&Applied{}).Where("aggregate_id = ?", "c1").Order("seq").Pluck("version", &got).Error)
		assert.Equal(t, []int64{1, 2, 3}, got)

		// Increasing versions apply whatever lies between.
		inc := withVersions(t, e.db, "billing-increasing", inbox.VersionsIncreasing)
		_, err = inc.Middleware(writeApplied)(versionMsg("c3-m5", "c3", 5))
		require.NoError(t, err)
		_, err = inc.Middleware(writeApplied)(versionMsg("c3-m4", "c3", 4))
		require.NoError(t, err)
		assert.EqualValues(t, 1, e.count(t, &Applied{}, "aggregate_id = ?", "c3"), "version 4 after 5 is taken for a duplicate")
	})
}

// TestContiguousVersionsOrderRacingDeliveries delivers 3 aggregates x 15
// versions in a shuffled order from 6 goroutines at once, redelivering each
// message refused as a gap: every version is applied once, and each
// aggregate's versions in order.
func TestContiguousVersionsOrderRacingDeliveries(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "billing")
		in := withVersions(t, e.db, "billing", inbox.VersionsContiguous)
		h := in.Middleware(writeApplied)
		type delivery struct {
			agg string
			v   int64
		}
		var all []delivery
		for a := range 3 {
			for v := int64(1); v <= 15; v++ {
				all = append(all, delivery{fmt.Sprintf("r%d", a), v})
			}
		}
		rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		queue := make(chan delivery, len(all))
		for _, d := range all {
			queue <- d
		}
		var (
			wg      sync.WaitGroup
			pending sync.WaitGroup
			mu      sync.Mutex
			errs    []error
		)
		pending.Add(len(all))
		for range 6 {
			wg.Go(func() {
				for d := range queue {
					_, err := h(versionMsg(fmt.Sprintf("%s-m%d", d.agg, d.v), d.agg, d.v))
					switch {
					case errors.Is(err, inbox.ErrGap):
						queue <- d // redelivered later
					case err != nil:
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						pending.Done()
					default:
						pending.Done()
					}
				}
			})
		}
		pending.Wait()
		close(queue)
		wg.Wait()
		require.Empty(t, errs)
		for a := range 3 {
			var got []int64
			require.NoError(t, e.db.Model(&Applied{}).Where("aggregate_id = ?", fmt.Sprintf("r%d", a)).Order("seq").Pluck("version", &got).Error)
			want := make([]int64, 15)
			for i := range want {
				want[i] = int64(i + 1)
			}
			assert.Equal(t, want, got, "aggregate r%d: each version once, in order", a)
		}
	})
}

// TestBadVersionsAreRefused: a version that is not a positive integer
// cannot be ordered, and an unknown policy is a configuration error.
func TestBadVersionsAreRefused(t *testing.T) {
	db := testenv.SQLite(t)
	e := setup(t, db, "billing")
	in := withVersions(t, e.db, "billing", inbox.VersionsIncreasing)
	for _, v := range []string{"x", "0", "-1", "1.5"} {
		m := versionMsg("bad-"+v, "c1", 1)
		m.Metadata.Set(messaging.MetaAggregateVersion, v)
		_, err := in.Middleware(writeApplied)(m)
		assert.ErrorIs(t, err, inbox.ErrBadVersion, v)
	}
	assert.Zero(t, e.count(t, &Applied{}, ""))

	_, err := inbox.New(db, &inbox.Config{Consumer: "c", Versions: inbox.Versions(7)})
	assert.ErrorIs(t, err, inbox.ErrInvalidConfig)
}
