package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

// appliedVersions returns the versions of aggregate applied, in the order
// they were applied.
func appliedVersions(t *testing.T, db *gorm.DB, aggregate string) []int64 {
	t.Helper()
	var vs []int64
	require.NoError(t, db.Model(&Applied{}).Where("aggregate_id = ?", aggregate).Order("seq").Pluck("version", &vs).Error)
	return vs
}

// cartBatch returns versions from..to of cart as one batch, with ids
// "<cart>-m<version>".
func cartBatch(cart string, from, to int64) []*message.Message {
	var out []*message.Message
	for v := from; v <= to; v++ {
		out = append(out, versionMsg(fmt.Sprintf("%s-m%d", cart, v), cart, v))
	}
	return out
}

// TestApplyBatchAppliesEachOnceInOrder: a batch of two aggregates'
// versions is applied in one transaction, in order, each once; the same
// batch again is all duplicates; a batch that overlaps it applies only the
// new ones, each once even when it comes twice in the batch; the watermark
// has moved to the last version of each.
func TestApplyBatchAppliesEachOnceInOrder(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "batch")
		ctx := context.Background()
		in := withVersions(t, e.db, "batch", inbox.VersionsContiguous)
		batch := append(cartBatch("c1", 1, 5), cartBatch("c2", 1, 3)...)
		n, err := in.ApplyBatch(ctx, batch, writeApplied)
		require.NoError(t, err)
		assert.Equal(t, len(batch), n)
		assert.Equal(t, []int64{1, 2, 3, 4, 5}, appliedVersions(t, e.db, "c1"))
		assert.Equal(t, []int64{1, 2, 3}, appliedVersions(t, e.db, "c2"))

		n, err = in.ApplyBatch(ctx, cartBatch("c1", 1, 5), writeApplied)
		require.NoError(t, err)
		assert.Equal(t, 5, n, "duplicates are settled")
		again := cartBatch("c1", 4, 8)
		again = append(again, again[3].Copy(), again[4].Copy()) // redelivered within the batch
		n, err = in.ApplyBatch(ctx, again, writeApplied)
		require.NoError(t, err)
		assert.Equal(t, 7, n)
		assert.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 8}, appliedVersions(t, e.db, "c1"))
		for cart, want := range map[string]int64{"c1": 8, "c2": 3} {
			mark, err := in.Watermark(ctx, "acme", "cart", cart)
			require.NoError(t, err)
			assert.Equal(t, want, mark, cart)
		}
	})
}

// TestApplyBatchCommitsWhatPrecedesAFailure: the handler fails on one
// message in the middle of a batch; the messages before it are committed
// exactly once, it and those after it are not applied, and ApplyBatch says
// where it stopped; delivering the rest again applies them in order.
func TestApplyBatchCommitsWhatPrecedesAFailure(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "batch")
		ctx := context.Background()
		in := withVersions(t, e.db, "batch", inbox.VersionsIncreasing)
		boom := errors.New("boom")
		var calls atomic.Int32
		failing := true
		h := func(msg *message.Message) ([]*message.Message, error) {
			calls.Add(1)
			if failing && msg.UUID == "c1-m4" {
				return nil, boom
			}
			return writeApplied(msg)
		}
		batch := cartBatch("c1", 1, 6)
		n, err := in.ApplyBatch(ctx, batch, h)
		require.ErrorIs(t, err, boom)
		assert.Equal(t, 3, n, "settled before the failure")
		assert.Equal(t, []int64{1, 2, 3}, appliedVersions(t, e.db, "c1"))
		assert.EqualValues(t, 7, calls.Load(), "4 handlers, then the 3 before the failure again")
		for i, m := range batch {
			ok, err := in.Processed(ctx, m.UUID)
			require.NoError(t, err)
			assert.Equal(t, i < 3, ok, "inbox record of %s", m.UUID)
		}

		failing = false
		n, err = in.ApplyBatch(ctx, batch[n:], h)
		require.NoError(t, err)
		assert.Equal(t, 3, n)
		assert.Equal(t, []int64{1, 2, 3, 4, 5, 6}, appliedVersions(t, e.db, "c1"))
	})
}

// TestApplyBatchStopsAtAGapAndAPanic: under contiguous versions a batch
// stops at a version whose predecessor is missing, with ErrGap, after
// committing the ones before; a panicking handler stops it the same way,
// returned as a recovered panic; a malformed message stops it too.
func TestApplyBatchStopsAtAGapAndAPanic(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "batch")
		ctx := context.Background()
		in := withVersions(t, e.db, "batch", inbox.VersionsContiguous)
		batch := append(cartBatch("c1", 1, 2), cartBatch("c1", 4, 5)...)
		n, err := in.ApplyBatch(ctx, batch, writeApplied)
		require.ErrorIs(t, err, inbox.ErrGap)
		assert.Equal(t, 2, n)
		assert.Equal(t, []int64{1, 2}, appliedVersions(t, e.db, "c1"))

		panicky := func(msg *message.Message) ([]*message.Message, error) {
			if msg.UUID == "c1-m4" {
				panic("handler bug")
			}
			return writeApplied(msg)
		}
		n, err = in.ApplyBatch(ctx, cartBatch("c1", 3, 5), panicky)
		var recovered middleware.RecoveredPanicError
		require.ErrorAs(t, err, &recovered)
		assert.Equal(t, "handler bug", recovered.V)
		assert.Equal(t, 1, n)
		assert.Equal(t, []int64{1, 2, 3}, appliedVersions(t, e.db, "c1"))

		bad := versionMsg("c1-bad", "c1", 5)
		bad.Metadata.Set(messaging.MetaAggregateVersion, "five")
		n, err = in.ApplyBatch(ctx, []*message.Message{versionMsg("c1-m4", "c1", 4), bad}, writeApplied)
		require.ErrorIs(t, err, inbox.ErrBadVersion)
		assert.Equal(t, 1, n)
		assert.Equal(t, []int64{1, 2, 3, 4}, appliedVersions(t, e.db, "c1"))
	})
}

// TestApplyBatchRunsAfterCommitHooksOnce: units of work the handlers run
// join the batch's transaction; their events commit once per message
// applied, with each message's causation id, and their after-commit hooks
// run after the commit, never for the rolled-back run that found the
// failure.
func TestApplyBatchRunsAfterCommitHooksOnce(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "batch")
		ctx := context.Background()
		require.NoError(t, e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			s := &Stock{}
			s.ID = "apple"
			return u.Add(s)
		}))
		var woken atomic.Int32
		hooked, err := uow.New(db, &uow.Config{AfterCommit: func(n int) { woken.Add(int32(n)) }})
		require.NoError(t, err)
		h := func(msg *message.Message) ([]*message.Message, error) {
			if msg.UUID == "m3" {
				return nil, errors.New("no")
			}
			return nil, hooked.Run(msg.Context(), func(ctx context.Context, u *uow.UnitOfWork) error {
				s, err := uow.Get[Stock](ctx, u, "apple")
				if err != nil {
					return err
				}
				s.Reserved++
				s.Record(StockReserved{SKU: "apple", OrderID: msg.UUID})
				return nil
			})
		}
		n, err := e.in.ApplyBatch(ctx, []*message.Message{newMsg("m1"), newMsg("m2"), newMsg("m3"), newMsg("m4")}, h)
		require.Error(t, err)
		assert.Equal(t, 2, n)
		assert.EqualValues(t, 2, woken.Load(), "one hook per message committed")
		assert.Equal(t, int64(1), e.count(t, &Stock{}, "reserved = 2"))
		var rows []outbox.Message
		require.NoError(t, db.Where("topic = 'stock.reserved'").Order("id").Find(&rows).Error)
		require.Len(t, rows, 2)
		causes := []string{rows[0].Metadata[messaging.MetaCausationID], rows[1].Metadata[messaging.MetaCausationID]}
		assert.ElementsMatch(t, []string{"m1", "m2"}, causes)
	})
}
