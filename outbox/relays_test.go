package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// listener is a LISTEN connection on the outbox channel, for the
// notifications of one schema (other tests notify on the same channel).
type listener struct {
	conn   *pgx.Conn
	schema string
}

func listenOutbox(t *testing.T, db *gorm.DB, dsn string) *listener {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(context.Background(), "LISTEN "+outbox.NotifyChannel)
	require.NoError(t, err)
	l := &listener{conn: conn}
	require.NoError(t, db.Raw("SELECT current_schema()").Scan(&l.schema).Error)
	return l
}

// notified reports whether a notification of the schema arrives within d.
func (l *listener) notified(t *testing.T, d time.Duration) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		n, err := l.conn.WaitForNotification(ctx)
		if errors.Is(err, context.DeadlineExceeded) {
			return false
		}
		require.NoError(t, err)
		if strings.HasPrefix(n.Payload, l.schema+":") {
			return true
		}
	}
}

// TestCommitsNotifyOnlyIdleRelays checks the trigger of migration 004:
// commits notify while some projector is idle, and only then.
func TestCommitsNotifyOnlyIdleRelays(t *testing.T) {
	t.Parallel()
	for _, partitioned := range []bool{false, true} {
		db, dsn := testenv.Postgres(t)
		ctx := context.Background()
		if partitioned {
			require.NoError(t, outbox.MigrateWith(ctx, db, &outbox.MigrateOpts{Partitioning: outbox.Daily}))
		}
		e := setup(t, db, nil)
		e.stamper.Set(time.Now().UTC())
		l := listenOutbox(t, db, dsn)
		// A commit's notification arrives at once; waiting 5 s for one that
		// should come, and 300 ms for one that should not, keeps the test
		// stable on a loaded machine.
		commit := func(wait time.Duration) bool {
			e.add(ctx, t, "order.paid", orderPaid{OrderID: "o"}, nil)
			return l.notified(t, wait)
		}
		const should, shouldNot = 5 * time.Second, 300 * time.Millisecond

		assert.False(t, commit(shouldNot), "partitioned=%v: no projector registered, no notification", partitioned)
		require.NoError(t, e.store.SetRelayIdle(ctx, "p1", true))
		assert.True(t, commit(should), "an idle projector is notified")
		require.NoError(t, e.store.SetRelayIdle(ctx, "p2", false))
		assert.True(t, commit(should), "one idle projector is enough")
		require.NoError(t, e.store.SetRelayIdle(ctx, "p1", false))
		assert.False(t, commit(shouldNot), "busy projectors are not notified")
		require.NoError(t, e.store.SetRelayIdle(ctx, "p1", true))
		relays, err := e.store.Relays(ctx)
		require.NoError(t, err)
		require.Len(t, relays, 2)
		assert.Equal(t, []string{"p1", "p2"}, []string{relays[0].WorkerID, relays[1].WorkerID})
		assert.Equal(t, []bool{true, false}, []bool{relays[0].Idle, relays[1].Idle})
		assert.WithinDuration(t, time.Now(), relays[0].ChangedAt, time.Minute)
		require.NoError(t, e.store.RemoveRelay(ctx, "p1"))
		assert.False(t, commit(shouldNot), "a removed projector is not notified")
	}
}

// TestGoingIdleWaitsForWritersThatSawItBusy plays the race the handshake
// closes: a writer reads the projector as busy (so it will not notify),
// and the projector goes idle before the writer commits. SetRelayIdle must
// not return before that commit, so the projector's next claim sees the
// event.
func TestGoingIdleWaitsForWritersThatSawItBusy(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	ctx := context.Background()
	e := setup(t, db, nil)
	e.stamper.Set(time.Now().UTC())
	require.NoError(t, e.store.SetRelayIdle(ctx, "p1", false))

	tx := begin(t, db)
	m, err := e.store.Add(ctx, tx, "order.paid", orderPaid{OrderID: "o"}, nil) // the trigger read "busy"
	require.NoError(t, err)

	idle := make(chan error, 1)
	go func() { idle <- e.store.SetRelayIdle(ctx, "p1", true) }()
	select {
	case err := <-idle:
		t.Fatalf("SetRelayIdle returned (%v) while a writer that saw the projector busy was still open", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx.Commit().Error)
	select {
	case err := <-idle:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("SetRelayIdle still waiting after the writer committed")
	}
	claimed := e.claim(t, "p1", 10)
	require.Len(t, claimed, 1, "the claim after going idle sees the event that did not notify")
	assert.Equal(t, m.ID, claimed[0].ID)
}
