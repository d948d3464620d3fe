package projector_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
)

// TestStopMidClaimLeavesNothingLeased: a projector stopped while its claim
// is on its way back (the rows leased on the server, the answer not yet
// read) leaves none of them leased to it. Every stop of a busy projector,
// a deploy's, can land there; rows left leased would wait out the whole
// lease and then count a failed attempt each, spending the attempts of
// healthy events. The projector's connections go through a proxy that
// delays each answer 300 ms, and the test stops it as soon as the claim
// committed.
func TestStopMidClaimLeavesNothingLeased(t *testing.T) {
	const events = 20
	stopMidStatement(t, events, func(t *testing.T, e *env) {
		e.commit(t, counterIDs(events), 1)
	})
}

// TestStopMidReleaseLeavesNothingLeased: the same for the release of due
// scheduled messages, which leases what it releases to the projector: a
// stop while its answer is on its way back leaves none of them leased.
func TestStopMidReleaseLeavesNothingLeased(t *testing.T) {
	const messages = 20
	stopMidStatement(t, messages, func(t *testing.T, e *env) {
		tx := e.db.Begin()
		require.NoError(t, tx.Error)
		for range messages {
			_, err := e.store.Schedule(t.Context(), tx, "reminder.due", map[string]int{"n": 1}, outbox.At(time.Now().Add(-time.Minute)), nil)
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit().Error)
	})
}

// stopMidStatement writes n messages with write, runs a projector whose
// connections answer 300 ms late, stops it as soon as a statement leased
// rows to it on the server, and checks that none stays leased, that no
// attempt was counted, and that each of the n is sent or ready.
func stopMidStatement(t *testing.T, n int, write func(*testing.T, *env)) {
	db, dsn := testenv.Postgres(t)
	viaDB, proxy := testenv.ProxiedPostgres(t, dsn)

	e := setup(t, db)
	write(t, e)
	store, err := outbox.NewStore(viaDB, nil)
	require.NoError(t, err)
	cfg := fastConfig()
	cfg.Lease = time.Hour // what the stop leaves leased stays so
	cfg.DisableNotify = true
	p, err := projector.New(store, &recorder{}, cfg)
	require.NoError(t, err)

	proxy.Slow(300 * time.Millisecond)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	testenv.WaitFor(t, 30*time.Second, "the claim committed on the server", func() bool {
		return e.count(t, "status = ?", outbox.StatusPublishing) > 0
	})
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the projector did not stop within 30s")
	}

	assert.Zero(t, e.count(t, "status = ?", outbox.StatusPublishing), "rows left leased to a stopped projector")
	assert.Zero(t, e.count(t, "attempts > 0"), "attempts counted against healthy events")
	assert.EqualValues(t, n, e.count(t, "status IN ?", []outbox.Status{outbox.StatusNew, outbox.StatusSent}),
		"every message is sent or ready for the next claim")
}
