package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// schedule writes one scheduled message in its own committed transaction.
func (e *env) schedule(ctx context.Context, t *testing.T, topic string, due outbox.Due, opts *outbox.ScheduleOpts) *outbox.ScheduledMessage {
	t.Helper()
	tx := begin(t, e.db)
	m, err := e.store.Schedule(ctx, tx, topic, orderPaid{OrderID: "o-1", Amount: 5}, due, opts)
	require.NoError(t, err)
	require.NoError(t, tx.Commit().Error)
	return m
}

// cancel cancels key in its own transaction, committed when it succeeds.
func (e *env) cancel(ctx context.Context, t *testing.T, key string) (int64, error) {
	t.Helper()
	tx := begin(t, e.db)
	n, err := e.store.Cancel(ctx, tx, key, nil)
	if err == nil {
		require.NoError(t, tx.Commit().Error)
	} else {
		require.NoError(t, tx.Rollback().Error)
	}
	return n, err
}

func (e *env) claimAll(ctx context.Context, t *testing.T) []*outbox.Message {
	t.Helper()
	got, err := e.store.Claim(ctx, outbox.ClaimOpts{Worker: "w", Limit: 100, Lease: time.Minute})
	require.NoError(t, err)
	return got
}

// TestScheduleReleasesWhenDue: a scheduled message is nowhere a claim can
// see it until the clock reaches its due time; then ReleaseDue moves it
// into the outbox with its own id, and the next claim takes it.
func TestScheduleReleasesWhenDue(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		e := setup(t, db, nil)
		at := e.schedule(ctx, t, "order.payment_due", outbox.At(epoch.Add(15*time.Minute)), &outbox.ScheduleOpts{Key: "pay:o-1"})
		in := e.schedule(ctx, t, "order.reminder", outbox.After(time.Hour), nil)
		assert.True(t, at.DueAt.Equal(epoch.Add(15*time.Minute)), "due at %v", at.DueAt)
		assert.True(t, in.DueAt.Equal(epoch.Add(time.Hour)), "due after an hour of the database's clock: %v", in.DueAt)

		r, err := e.store.ReleaseDue(ctx, outbox.ReleaseOpts{})
		require.NoError(t, err)
		assert.Equal(t, 0, r.Released)
		assert.True(t, r.Waiting)
		assert.InDelta(t, (15 * time.Minute).Seconds(), r.Next.Seconds(), 0.01)
		assert.Empty(t, e.claimAll(ctx, t), "nothing is due")
		backlog, err := e.store.ScheduledBacklog(ctx, "")
		require.NoError(t, err)
		assert.Equal(t, int64(2), backlog.Waiting)
		assert.True(t, backlog.FirstDue.Equal(at.DueAt))

		e.stamper.Advance(15*time.Minute - time.Millisecond)
		r, err = e.store.ReleaseDue(ctx, outbox.ReleaseOpts{})
		require.NoError(t, err)
		assert.Equal(t, 0, r.Released, "a millisecond early")

		e.stamper.Advance(time.Millisecond)
		r, err = e.store.ReleaseDue(ctx, outbox.ReleaseOpts{})
		require.NoError(t, err)
		assert.Equal(t, 1, r.Released)
		assert.InDelta(t, (45 * time.Minute).Seconds(), r.Next.Seconds(), 0.01, "the reminder is next")
		got := e.claimAll(ctx, t)
		require.Len(t, got, 1)
		assert.Equal(t, at.ID, got[0].ID, "relayed with the id it was scheduled with")
		assert.Equal(t, "order.payment_due", got[0].Topic)
		assert.Empty(t, got[0].AggregateID)
		assert.JSONEq(t, `{"order_id":"o-1","amount":5}`, string(got[0].Payload))
		due, err := time.Parse(time.RFC3339Nano, got[0].Metadata[messaging.MetaDueAt])
		require.NoError(t, err, "the due time travels in the metadata")
		assert.True(t, due.Equal(at.DueAt), "%v", due)
		require.Len(t, r.Late, 1)
		assert.InDelta(t, 0, r.Late[0].Seconds(), 0.001, "released on time")

		r, err = e.store.ReleaseDue(ctx, outbox.ReleaseOpts{})
		require.NoError(t, err)
		assert.Equal(t, 0, r.Released, "released once")
		_, err = e.cancel(ctx, t, "pay:o-1")
		assert.ErrorIs(t, err, outbox.ErrCancelTooLate)
	})
}

// TestScheduleIsAtomicWithTheTransaction: a message scheduled in a
// transaction that rolls back was never scheduled, and a cancel in a
// transaction that rolls back cancels nothing.
func TestScheduleIsAtomicWithTheTransaction(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		e := setup(t, db, nil)
		tx := begin(t, db)
		_, err := e.store.Schedule(ctx, tx, "order.payment_due", orderPaid{}, outbox.At(epoch), &outbox.ScheduleOpts{Key: "k"})
		require.NoError(t, err)
		require.NoError(t, tx.Rollback().Error)
		r, err := e.store.ReleaseDue(ctx, outbox.ReleaseOpts{})
		require.NoError(t, err)
		assert.Equal(t, outbox.Release{}, r, "nothing was scheduled")

		e.schedule(ctx, t, "order.payment_due", outbox.At(epoch.Add(time.Minute)), &outbox.ScheduleOpts{Key: "k"})
		tx = begin(t, db)
		n, err := e.store.Cancel(ctx, tx, "k", nil)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		require.NoError(t, tx.Rollback().Error)
		e.stamper.Advance(time.Minute)
		r, err = e.store.ReleaseDue(ctx, outbox.ReleaseOpts{})
		require.NoError(t, err)
		assert.Equal(t, 1, r.Released, "the rolled-back cancel cancelled nothing")
	})
}

// TestCancel: a cancel deletes every waiting message of its key and
// tenant, and says whether it came too late or found nothing.
func TestCancel(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		e := setup(t, db, nil)
		for range 2 {
			e.schedule(ctx, t, "payment.retry", outbox.After(time.Minute), &outbox.ScheduleOpts{Key: "retry:p-1"})
		}
		e.schedule(ctx, t, "payment.retry", outbox.After(time.Minute), &outbox.ScheduleOpts{Key: "retry:p-2"})
		e.schedule(ctx, t, "payment.retry", outbox.After(time.Minute), &outbox.ScheduleOpts{Key: "retry:p-1", Tenant: "acme"})

		n, err := e.cancel(ctx, t, "retry:p-1")
		require.NoError(t, err)
		assert.Equal(t, int64(2), n, "both of the key, in the default tenant only")
		_, err = e.cancel(ctx, t, "retry:p-1")
		assert.ErrorIs(t, err, outbox.ErrNotScheduled, "cancelled already")
		_, err = e.cancel(ctx, t, "never")
		assert.ErrorIs(t, err, outbox.ErrNotScheduled)
		_, err = e.cancel(ctx, t, "")
		assert.ErrorIs(t, err, outbox.ErrNotScheduled)

		e.stamper.Advance(time.Minute)
		r, err := e.store.ReleaseDue(ctx, outbox.ReleaseOpts{})
		require.NoError(t, err)
		assert.Equal(t, 2, r.Released, "p-2 and acme's p-1")
		assert.False(t, r.Waiting)
		_, err = e.cancel(ctx, t, "retry:p-2")
		assert.ErrorIs(t, err, outbox.ErrCancelTooLate)
		tx := begin(t, db)
		_, err = e.store.Cancel(ctx, tx, "retry:p-1", &outbox.CancelOpts{Tenant: "acme"})
		assert.ErrorIs(t, err, outbox.ErrCancelTooLate)
		require.NoError(t, tx.Rollback().Error)

		got := e.claimAll(ctx, t)
		require.Len(t, got, 2)
		tenants := []string{got[0].TenantID, got[1].TenantID}
		assert.ElementsMatch(t, []string{"default", "acme"}, tenants)
	})
}

// TestCancelRacesRelease: cancels race releases by several relays, one
// message each. Each cancel either deletes its message, which then never
// reaches the outbox, or reports ErrCancelTooLate, and then the message
// is in the outbox exactly once. On PostgreSQL the relays run
// concurrently; SQLite serializes writers, so there they interleave.
func TestCancelRacesRelease(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		e := setup(t, db, nil)
		const n = 300
		ids := map[string]string{}
		for i := range n {
			key := fmt.Sprintf("k-%d", i)
			ids[key] = e.schedule(ctx, t, "order.expire", outbox.At(epoch.Add(time.Millisecond)), &outbox.ScheduleOpts{Key: key}).ID
		}
		e.stamper.Advance(time.Second)

		var wg sync.WaitGroup
		stop := make(chan struct{})
		relays := 3
		for i := range relays {
			// Two release leased to themselves, as projectors do; one
			// releases for the next claim, as Drain does.
			opts := outbox.ReleaseOpts{Limit: 7}
			if i > 0 {
				opts.Worker, opts.Lease = fmt.Sprintf("relay-%d", i), time.Minute
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := e.store.ReleaseDue(ctx, opts); err != nil {
						t.Errorf("release: %v", err)
						return
					}
				}
			}()
		}
		cancelled, late := map[string]bool{}, map[string]bool{}
		var mu sync.Mutex
		var cw sync.WaitGroup
		keys := make(chan string, n)
		for key := range ids {
			keys <- key
		}
		close(keys)
		for range 4 {
			cw.Add(1)
			go func() {
				defer cw.Done()
				for key := range keys {
					tx := db.Begin()
					_, err := e.store.Cancel(ctx, tx, key, nil)
					switch {
					case err == nil:
						if cerr := tx.Commit().Error; cerr != nil {
							t.Errorf("commit cancel %s: %v", key, cerr)
							continue
						}
						mu.Lock()
						cancelled[key] = true
						mu.Unlock()
					case errors.Is(err, outbox.ErrCancelTooLate):
						tx.Rollback()
						mu.Lock()
						late[key] = true
						mu.Unlock()
					default:
						tx.Rollback()
						t.Errorf("cancel %s: %v", key, err)
					}
				}
			}()
		}
		cw.Wait()
		close(stop)
		wg.Wait()
		r, err := e.store.ReleaseDue(ctx, outbox.ReleaseOpts{})
		require.NoError(t, err)
		require.False(t, r.Waiting, "every message was cancelled or released")

		inOutbox := map[string]int{}
		var rows []outbox.Message
		require.NoError(t, db.Find(&rows).Error)
		for _, m := range rows {
			inOutbox[m.ID]++
		}
		for key, id := range ids {
			switch {
			case cancelled[key]:
				assert.Zero(t, inOutbox[id], "%s was cancelled but reached the outbox", key)
			case late[key]:
				assert.Equal(t, 1, inOutbox[id], "%s came too late, so its message is in the outbox once", key)
			default:
				t.Errorf("%s has no outcome", key)
			}
		}
		assert.Equal(t, n, len(cancelled)+len(late))
		t.Logf("%s: %d cancelled, %d too late", b.Name, len(cancelled), len(late))
	})
}

// TestScheduledMessagesIgnoreAggregateOrder: a released message belongs
// to no aggregate, so an aggregate whose head event is dead holds back its
// own later events and not the scheduled message, and a scheduled message
// waiting for next week holds back no event.
func TestScheduledMessagesIgnoreAggregateOrder(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		e := setup(t, db, nil)
		e.schedule(ctx, t, "order.later", outbox.After(7*24*time.Hour), nil)
		head := e.add(ctx, t, "order.placed", orderPaid{}, &outbox.AddOpts{AggregateType: "order", AggregateID: "o-1", AggregateVersion: 1})
		e.add(ctx, t, "order.paid", orderPaid{}, &outbox.AddOpts{AggregateType: "order", AggregateID: "o-1", AggregateVersion: 2})
		got := e.claimAll(ctx, t)
		require.Len(t, got, 1, "the aggregate's head, though a message waits")
		assert.Equal(t, head.ID, got[0].ID)
		dead, err := e.store.MarkFailed(ctx, "w", outbox.Failure{ID: head.ID, Err: errors.New("broken"), Dead: true})
		require.NoError(t, err)
		require.True(t, dead)

		due := e.schedule(ctx, t, "order.expire", outbox.After(0), nil)
		r, err := e.store.ReleaseDue(ctx, outbox.ReleaseOpts{})
		require.NoError(t, err)
		require.Equal(t, 1, r.Released)
		got = e.claimAll(ctx, t)
		require.Len(t, got, 1, "the scheduled message, not the event behind the dead one")
		assert.Equal(t, due.ID, got[0].ID)
	})
}

// TestSchedulePartitionKey: a scheduled message goes to the partition of
// the key it was written with, and an event of an aggregate keeps its
// aggregate's partition whatever its metadata says.
func TestSchedulePartitionKey(t *testing.T) {
	ctx := context.Background()
	e := setup(t, testenv.SQLite(t), nil)
	e.schedule(ctx, t, "order.expire", outbox.After(0), &outbox.ScheduleOpts{PartitionKey: "default|order|o-7"})
	e.add(ctx, t, "order.paid", orderPaid{}, &outbox.AddOpts{AggregateType: "order", AggregateID: "o-8", AggregateVersion: 1,
		Metadata: outbox.Metadata{messaging.MetaPartitionKey: "elsewhere"}})
	_, err := e.store.ReleaseDue(ctx, outbox.ReleaseOpts{})
	require.NoError(t, err)
	got := e.claimAll(ctx, t)
	require.Len(t, got, 2)
	keys := map[string]string{}
	for _, m := range got {
		msg, err := messaging.NewMessage(m)
		require.NoError(t, err)
		keys[m.Topic] = messaging.PartitionKey(msg)
	}
	assert.Equal(t, "default|order|o-7", keys["order.expire"])
	assert.Equal(t, "default|order|o-8", keys["order.paid"])
}

// TestScheduleRejectsBadInput: a bad due time, key or payload is a
// ValidationError and writes nothing.
func TestScheduleRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	db := testenv.SQLite(t)
	e := setup(t, db, nil)
	for name, c := range map[string]struct {
		due   outbox.Due
		opts  *outbox.ScheduleOpts
		topic string
		field string
	}{
		"zero time":      {outbox.At(time.Time{}), nil, "a.b", "due_at"},
		"negative delay": {outbox.After(-time.Second), nil, "a.b", "due_at"},
		"bad key":        {outbox.After(0), &outbox.ScheduleOpts{Key: "a\x00b"}, "a.b", "schedule_key"},
		"bad topic":      {outbox.After(0), nil, "", "topic"},
	} {
		tx := begin(t, db)
		_, err := e.store.Schedule(ctx, tx, c.topic, orderPaid{}, c.due, c.opts)
		require.ErrorIs(t, err, outbox.ErrInvalidEvent, name)
		var ve *outbox.ValidationError
		require.ErrorAs(t, err, &ve, name)
		assert.Equal(t, c.field, ve.Field, name)
		require.NoError(t, tx.Commit().Error)
	}
	backlog, err := e.store.ScheduledBacklog(ctx, "")
	require.NoError(t, err)
	assert.Equal(t, int64(0), backlog.Waiting)
}

// TestPurgeSentRemovesReleasedSchedules: retention removes released
// scheduled rows with the sent events, and keeps waiting ones.
func TestPurgeSentRemovesReleasedSchedules(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		e := setup(t, db, nil)
		e.schedule(ctx, t, "a.due", outbox.After(0), &outbox.ScheduleOpts{Key: "k"})
		e.schedule(ctx, t, "a.later", outbox.After(48*time.Hour), nil)
		_, err := e.store.ReleaseDue(ctx, outbox.ReleaseOpts{})
		require.NoError(t, err)
		e.stamper.Advance(25 * time.Hour)
		n, err := e.store.CountSent(ctx, 24*time.Hour, nil)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "the released row (the event itself is not sent yet)")
		n, err = e.store.PurgeSent(ctx, 24*time.Hour, nil)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		_, err = e.cancel(ctx, t, "k")
		assert.ErrorIs(t, err, outbox.ErrNotScheduled, "retention forgot the key")
		backlog, err := e.store.ScheduledBacklog(ctx, "")
		require.NoError(t, err)
		assert.Equal(t, int64(1), backlog.Waiting, "the waiting one stays")
	})
}

// TestListScheduled lists the waiting messages first due first, by tenant
// and key, and leaves out released ones.
func TestListScheduled(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		e := setup(t, db, nil)
		late := e.schedule(ctx, t, "a.late", outbox.After(2*time.Hour), &outbox.ScheduleOpts{Key: "k"})
		soon := e.schedule(ctx, t, "a.soon", outbox.After(time.Hour), &outbox.ScheduleOpts{Key: "k"})
		e.schedule(ctx, t, "a.other", outbox.After(time.Hour), &outbox.ScheduleOpts{Key: "k", Tenant: "acme"})
		e.schedule(ctx, t, "a.now", outbox.After(0), nil)
		_, err := e.store.ReleaseDue(ctx, outbox.ReleaseOpts{})
		require.NoError(t, err)

		got, err := e.store.ListScheduled(ctx, outbox.ScheduledFilter{Tenant: "default"})
		require.NoError(t, err)
		require.Len(t, got, 2, "a.now was released")
		assert.Equal(t, []string{soon.ID, late.ID}, []string{got[0].ID, got[1].ID}, "first due first")
		assert.JSONEq(t, `{"order_id":"o-1","amount":5}`, string(got[0].Payload))
		assert.True(t, got[0].DueAt.Equal(soon.DueAt))
		assert.True(t, got[0].CreatedAt.Equal(epoch), "%v", got[0].CreatedAt)

		got, err = e.store.ListScheduled(ctx, outbox.ScheduledFilter{Key: "k", Limit: 2})
		require.NoError(t, err)
		require.Len(t, got, 2)
		assert.ElementsMatch(t, []string{"default", "acme"}, []string{got[0].TenantID, got[1].TenantID}, "both due in an hour")
	})
}

// TestReleaseDueInBatches: a release takes at most Limit messages, first
// due first, and after a full batch says to look again at once.
func TestReleaseDueInBatches(t *testing.T) {
	ctx := context.Background()
	e := setup(t, testenv.SQLite(t), nil)
	for i := range 5 {
		e.schedule(ctx, t, "a.due", outbox.At(epoch.Add(time.Duration(5-i)*time.Second)), nil)
	}
	e.stamper.Advance(time.Minute)
	r, err := e.store.ReleaseDue(ctx, outbox.ReleaseOpts{Limit: 2})
	require.NoError(t, err)
	assert.Equal(t, 2, r.Released)
	assert.True(t, r.Waiting)
	assert.Zero(t, r.Next, "a full batch: look again at once")
	late := []float64{r.Late[0].Seconds(), r.Late[1].Seconds()}
	assert.ElementsMatch(t, []float64{59, 58}, late, "the first two due")
	r, err = e.store.ReleaseDue(ctx, outbox.ReleaseOpts{Limit: 2})
	require.NoError(t, err)
	assert.Equal(t, 2, r.Released)
	r, err = e.store.ReleaseDue(ctx, outbox.ReleaseOpts{Limit: 2})
	require.NoError(t, err)
	assert.Equal(t, 1, r.Released)
	assert.False(t, r.Waiting)
}

// TestReleaseDueLeasesToTheWorker: a release for a worker hands it the due
// messages already leased, first due first, as a claim would: no other
// worker can claim them, the worker records their outcome as a claim's,
// and one whose lease runs out is claimed again by another worker, the
// takeover counted as a failed attempt. A byte budget bounds the release
// (the first message always goes), and a worker without a lease is refused.
func TestReleaseDueLeasesToTheWorker(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		e := setup(t, db, nil)
		var ids []string
		for i := range 3 {
			ids = append(ids, e.schedule(ctx, t, "order.reminder", outbox.At(epoch.Add(time.Duration(3-i)*time.Second)), nil).ID)
		}
		e.stamper.Advance(time.Minute)

		_, err := e.store.ReleaseDue(ctx, outbox.ReleaseOpts{Worker: "w1"})
		require.ErrorIs(t, err, outbox.ErrInvalidClaim, "a worker without a lease")
		_, err = e.store.ReleaseDue(ctx, outbox.ReleaseOpts{MaxBytes: -1})
		require.ErrorIs(t, err, outbox.ErrInvalidClaim, "a negative byte budget")

		r, err := e.store.ReleaseDue(ctx, outbox.ReleaseOpts{Worker: "w1", Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, 3, r.Released)
		require.Len(t, r.Leased, 3)
		for i, m := range r.Leased {
			assert.Equal(t, ids[2-i], m.ID, "due order")
			assert.Equal(t, outbox.StatusPublishing, m.Status)
			require.NotNil(t, m.LockedBy)
			assert.Equal(t, "w1", *m.LockedBy)
			assert.Zero(t, m.Attempts)
			assert.Equal(t, "order.reminder", m.Topic)
			assert.Contains(t, m.Metadata, messaging.MetaDueAt)
			assert.InDelta(t, float64(59-i), r.Late[i].Seconds(), 0.01, "lateness of %s", m.ID)
		}
		assert.False(t, r.Waiting)
		assert.Empty(t, e.claimAll(ctx, t), "another worker claimed a leased release")

		n, err := e.store.MarkSent(ctx, "w1", []string{r.Leased[0].ID})
		require.NoError(t, err)
		assert.EqualValues(t, 1, n)
		e.stamper.Advance(2 * time.Minute)
		got := e.claimAll(ctx, t)
		require.Len(t, got, 2, "the lapsed leases are claimed again")
		for _, m := range got {
			assert.Equal(t, 1, m.Attempts, "the takeover of %s counts as an attempt", m.ID)
		}

		first := e.schedule(ctx, t, "order.reminder", outbox.After(time.Second), nil)
		e.schedule(ctx, t, "order.reminder", outbox.After(2*time.Second), nil)
		e.stamper.Advance(time.Minute)
		r, err = e.store.ReleaseDue(ctx, outbox.ReleaseOpts{Worker: "w1", Lease: time.Minute, MaxBytes: 1})
		require.NoError(t, err)
		require.Len(t, r.Leased, 1, "a budget smaller than one message releases the first alone")
		assert.Equal(t, first.ID, r.Leased[0].ID)
		assert.True(t, r.Waiting, "the second still waits")
	})
}
