package projector_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/projector"
)

var errInjected = errors.New("injected database failure")

// failMarkFailed makes db fail the statement that records a failed publish
// (the UPDATE that counts an attempt) while armed is true, and counts the
// statements it failed.
func failMarkFailed(t *testing.T, db *gorm.DB, armed *atomic.Bool) *atomic.Int64 {
	t.Helper()
	var failed atomic.Int64
	require.NoError(t, db.Callback().Raw().Before("gorm:raw").Register("test:fail_mark_failed", func(tx *gorm.DB) {
		sql := tx.Statement.SQL.String()
		if armed.Load() && strings.HasPrefix(sql, "UPDATE outbox_events") && strings.Contains(sql, "attempts = attempts + 1") {
			failed.Add(1)
			_ = tx.AddError(errInjected)
		}
	}))
	return &failed
}

// TestFailedOutcomeWriteKeepsTheSuccesses: in one batch three events are
// confirmed by the broker and one fails, and the database fails to record
// that failure. The confirmed events must still be recorded as sent, not
// published again once their lease expires.
func TestFailedOutcomeWriteKeepsTheSuccesses(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db)
		ctx := context.Background()
		events := e.commit(t, []string{"ok-1", "ok-2", "bad", "ok-3"}, 1)
		rec := &recorder{}
		rec.setFail(func(env *messaging.Envelope) error {
			if env.AggregateID == "bad" {
				return errBroker
			}
			return nil
		})
		var armed atomic.Bool
		armed.Store(true)
		failed := failMarkFailed(t, db, &armed)
		cfg := fastConfig()
		cfg.Lease, cfg.PublishTimeout = 300*time.Millisecond, 200*time.Millisecond
		p, err := projector.New(e.store, rec, cfg)
		require.NoError(t, err)

		res, err := p.Drain(ctx)
		require.ErrorIs(t, err, errInjected)
		require.Equal(t, int64(1), failed.Load(), "the failure's record was the statement that failed")
		assert.Equal(t, 4, res.Claimed)
		assert.Equal(t, 3, res.Published)
		assert.Equal(t, int64(3), e.count(t, "status = 'sent' AND locked_by IS NULL"),
			"the confirmed events are recorded despite the failed write")

		// Once the lease of the unrecorded row expires it is claimed again;
		// the confirmed rows, had they stayed leased, would be too.
		armed.Store(false)
		rec.setFail(nil)
		testenv.WaitFor(t, 10*time.Second, "every event to be sent", func() bool {
			_, err := p.Drain(ctx)
			require.NoError(t, err)
			return e.count(t, "status = 'sent'") == 4
		})
		counts := rec.countByID()
		for i, id := range events {
			if i != 2 {
				assert.Equal(t, 1, counts[id], "confirmed event %d published once", i)
			}
		}
	})
}
