package projector_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
)

// TestRunRelaysScheduledMessagesWhenDue: a running projector whose idle
// poll is a minute relays each scheduled message once it falls due, never
// before, and never one whose cancel committed. It learns a new due time
// from the scheduling commit (PostgreSQL's notification, or Wake from an
// after-commit hook) and then sleeps until that time, so the messages
// arrive long before the poll would find them. (How soon is the bench's to
// measure; the bound here only tells the due-time wake-up from the poll.)
func TestRunRelaysScheduledMessagesWhenDue(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		e := setup(t, db)
		rec := &recorder{notify: make(chan string, 16)}
		reg := prometheus.NewRegistry()
		cfg := fastConfig()
		cfg.IdleSleep = time.Minute
		cfg.Registerer = reg
		cfg.DisableNotify = !b.Notify
		p, err := projector.New(e.store, rec, cfg)
		require.NoError(t, err)
		runProjector(t, p)
		time.Sleep(100 * time.Millisecond) // asleep for its minute

		const n = 5
		const cancelledDue = 2 * time.Second
		want := map[string]bool{}
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			for i := range n {
				m, err := e.store.Schedule(ctx, tx, "order.payment_due", map[string]int{"i": i},
					outbox.After(time.Duration(300+300*i)*time.Millisecond), &outbox.ScheduleOpts{Key: fmt.Sprint("k-", i)})
				if err != nil {
					return err
				}
				want[m.ID] = true
			}
			// Due after the five, and far enough out that a loaded
			// machine still commits the cancel before it falls due.
			_, err := e.store.Schedule(ctx, tx, "order.payment_due", map[string]int{"i": -1},
				outbox.After(cancelledDue), &outbox.ScheduleOpts{Key: "cancelled"})
			return err
		}))
		scheduled := time.Now()
		p.Wake() // what the unit of work's AfterCommit hook does
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			_, err := e.store.Cancel(ctx, tx, "cancelled", nil)
			return err
		}))

		arrived := map[string]time.Time{}
		for len(arrived) < n {
			select {
			case id := <-rec.notify:
				require.True(t, want[id], "%s was not to be published", id)
				require.NotContains(t, arrived, id, "published twice")
				arrived[id] = time.Now()
			case <-time.After(20 * time.Second):
				t.Fatalf("%d of %d scheduled messages published within 20s", len(arrived), n)
			}
		}
		for _, d := range rec.all() {
			due, err := time.Parse(time.RFC3339Nano, d.env.Metadata[messaging.MetaDueAt])
			require.NoError(t, err)
			got := arrived[d.env.ID]
			assert.False(t, got.Before(due.Add(-5*time.Millisecond)), "%s published %v before its due time", d.env.ID, due.Sub(got))
			assert.Less(t, got.Sub(due), 10*time.Second, "%s published %v after its due time: found by the poll, not the timer", d.env.ID, got.Sub(due))
			t.Logf("%s: due %s, published %v after", d.env.ID, due.Format("15:04:05.000"), got.Sub(due))
		}
		select {
		case id := <-rec.notify:
			t.Fatalf("%s published after the five", id)
		case <-time.After(time.Until(scheduled.Add(cancelledDue + 500*time.Millisecond))):
		}
		assert.Equal(t, uint64(n), histogramCount(t, reg, "bento_outbox_scheduled_release_lag_seconds"))
		assert.Equal(t, 0.0, gaugeValue(t, reg, "bento_outbox_scheduled_waiting"), "nothing waits")
	})
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestWakeSoonAfterALookIsNotLost: a projector rate-limits its look for due
// scheduled messages while it is busy. A wake-up (Wake after a commit, or
// PostgreSQL's notification) that lands within that limit of its last look
// must still make it look, once the limit has passed: it is the only news
// of a new due time an idle projector gets before its IdleSleep. Here each message is scheduled (and
// the projector woken) the moment the one before it is published, a few
// milliseconds after the look that released it, and each must arrive near
// its due time, not a minute later by the poll.
func TestWakeSoonAfterALookIsNotLost(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		e := setup(t, db)
		rec := &recorder{notify: make(chan string, 64)}
		cfg := fastConfig()
		cfg.IdleSleep = time.Minute
		cfg.DisableNotify = true // only Wake tells it; the notification would be a second chance
		p, err := projector.New(e.store, rec, cfg)
		require.NoError(t, err)
		runProjector(t, p)
		time.Sleep(100 * time.Millisecond)

		const n = 5
		for i := range n {
			require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
				_, err := e.store.Schedule(ctx, tx, "order.payment_due", map[string]int{"i": i},
					outbox.After(time.Millisecond), &outbox.ScheduleOpts{Key: fmt.Sprint("k-", i)})
				return err
			}))
			p.Wake()
			select {
			case <-rec.notify:
			case <-time.After(15 * time.Second):
				t.Fatalf("message %d of %d not published within 15s of its due time: the wake was lost", i+1, n)
			}
		}
	})
}

// TestReleaseRetriesSoonAfterAnError: a failed look for due messages (the
// table locked away, a dropped connection) is retried with a short backoff,
// not after the projector's IdleSleep, so a message that falls due during
// an outage is relayed soon after it ends.
func TestReleaseRetriesSoonAfterAnError(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		e := setup(t, db)
		rec := &recorder{notify: make(chan string, 4)}
		cfg := fastConfig()
		cfg.IdleSleep = time.Minute
		cfg.DisableNotify = true
		p, err := projector.New(e.store, rec, cfg)
		require.NoError(t, err)
		runProjector(t, p)

		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			_, err := e.store.Schedule(ctx, tx, "order.payment_due", map[string]int{"i": 1},
				outbox.After(300*time.Millisecond), &outbox.ScheduleOpts{Key: "k"})
			return err
		}))
		p.Wake()
		time.Sleep(50 * time.Millisecond) // it has looked and knows the due time
		require.NoError(t, db.Exec(`ALTER TABLE outbox_scheduled RENAME TO outbox_scheduled_away`).Error)
		time.Sleep(time.Second) // the due time passes; its looks fail
		require.NoError(t, db.Exec(`ALTER TABLE outbox_scheduled_away RENAME TO outbox_scheduled`).Error)
		start := time.Now()
		select {
		case <-rec.notify:
			t.Logf("published %v after the table came back", time.Since(start))
		case <-time.After(15 * time.Second):
			t.Fatal("the message due during the outage was not published within 15s of its end")
		}
	})
}
