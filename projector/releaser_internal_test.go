package projector

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// nopPublisher accepts everything; the releaser never publishes.
type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

// TestReleaserBacksOffWithoutSpinning: while its looks fail, the releaser
// asks the projector to sleep until its next try, each try later than the
// one before; it never answers "look again at once", which would spin the
// projector's loop (a claim per turn) for as long as the failure lasts.
// A wake-up during the backoff neither cuts it short nor lets the
// projector sleep past the next try.
func TestReleaserBacksOffWithoutSpinning(t *testing.T) {
	db := testenv.SQLite(t)
	ctx := context.Background()
	require.NoError(t, outbox.Migrate(ctx, db))
	require.NoError(t, db.Exec(`DROP TABLE outbox_scheduled`).Error) // every look fails
	store, err := outbox.NewStore(db, nil)
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.IdleSleep = time.Minute
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := New(store, nopPublisher{}, cfg)
	require.NoError(t, err)

	r := &releaser{p: p}
	var waits []time.Duration
	for range 4 {
		d, _ := r.run(ctx)
		require.Positive(t, d, "after failed look %d the projector would spin", len(waits)+1)
		assert.Positive(t, sleepOf(r.run(ctx)), "asked again before the next try")
		r.woken()
		assert.Positive(t, sleepOf(r.run(ctx)), "a wake-up cut the backoff short")
		assert.LessOrEqual(t, min(sleepOf(r.run(ctx)), r.wakeBound(time.Now())), d, "a wake-up let the projector sleep past the next try")
		waits = append(waits, d)
		time.Sleep(d + time.Millisecond)
	}
	for i := 1; i < len(waits); i++ {
		assert.Greater(t, waits[i], waits[i-1], "the backoff grows: %v", waits)
	}
	assert.LessOrEqual(t, waits[len(waits)-1], cfg.IdleSleep)
}

// sleepOf is the sleep releaser.run returns.
func sleepOf(d time.Duration, _ []*outbox.Message) time.Duration { return d }
