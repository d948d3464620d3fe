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
	"github.com/bentoevents/bento/partition"
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
			require.NoError(t, outbox.MigrateWith(ctx, db, &partition.MigrateOpts{Partitioning: partition.Daily}))
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

// TestWritersOpenUntilWritersThatSawItBusyEnd plays the race the going-idle
// handshake closes: a writer reads the projector as busy (so it will not
// notify), and the projector goes idle before the writer commits.
// SetRelayIdle returns at once; WritersOpen reports the writer until it
// commits, and the claim made after WritersOpen reports none sees the
// event.
func TestWritersOpenUntilWritersThatSawItBusyEnd(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	ctx := context.Background()
	e := setup(t, db, nil)
	e.stamper.Set(time.Now().UTC())
	require.NoError(t, e.store.SetRelayIdle(ctx, "p1", false))
	open, err := e.store.WritersOpen(ctx)
	require.NoError(t, err)
	assert.False(t, open, "no writer yet")

	tx := begin(t, db)
	m, err := e.store.Add(ctx, tx, "order.paid", orderPaid{OrderID: "o"}, nil) // the trigger read "busy"
	require.NoError(t, err)

	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	require.NoError(t, e.store.SetRelayIdle(sctx, "p1", true), "going idle does not wait for the writer")
	for range 3 {
		open, err = e.store.WritersOpen(sctx)
		require.NoError(t, err)
		assert.True(t, open, "the writer that saw the projector busy is open")
	}
	assert.Empty(t, e.claim(t, "p1", 10), "the writer has not committed")

	require.NoError(t, tx.Commit().Error)
	open, err = e.store.WritersOpen(ctx)
	require.NoError(t, err)
	assert.False(t, open, "the writer has ended")
	claimed := e.claim(t, "p1", 10)
	require.Len(t, claimed, 1, "the claim after WritersOpen said no sees the event that did not notify")
	assert.Equal(t, m.ID, claimed[0].ID)
}

// TestWritersOpenOnSQLite: SQLite has no trigger to wait for.
func TestWritersOpenOnSQLite(t *testing.T) {
	t.Parallel()
	e := setup(t, testenv.SQLite(t), nil)
	e.add(context.Background(), t, "order.paid", orderPaid{OrderID: "o"}, nil)
	open, err := e.store.WritersOpen(context.Background())
	require.NoError(t, err)
	assert.False(t, open)
}

// waitingForRelaysKey reports whether some session waits for the advisory
// key the outbox trigger takes in db's schema.
func waitingForRelaysKey(t *testing.T, db *gorm.DB) bool {
	t.Helper()
	var n int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
  AND objid::bigint = (hashtext(current_schema() || '.bento_outbox_relays')::bigint & 4294967295)`).
		Scan(&n).Error)
	return n > 0
}

// TestGoingIdleNeverMakesWritersWait is the stall the going-idle handshake
// must not cause: transaction A holds an uncommitted outbox insert, a
// projector goes idle, and then transaction B, on another connection,
// writes one event. B must commit while A is still open: no writer waits
// for another writer.
func TestGoingIdleNeverMakesWritersWait(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := setup(t, db, nil)
	e.stamper.Set(time.Now().UTC())
	require.NoError(t, e.store.SetRelayIdle(ctx, "p1", false))

	txA := begin(t, db)
	_, err := e.store.Add(ctx, txA, "order.paid", orderPaid{OrderID: "a"}, nil)
	require.NoError(t, err)

	idle := make(chan error, 1)
	go func() { idle <- e.store.SetRelayIdle(ctx, "p1", true) }()
	// Go on once SetRelayIdle returned or is waiting for the writers' key.
	var idleErr error
	returned := false
	testenv.WaitFor(t, 5*time.Second, "SetRelayIdle to return or wait for the writers' key", func() bool {
		select {
		case idleErr = <-idle:
			returned = true
		default:
		}
		return returned || waitingForRelaysKey(t, db)
	})
	require.NoError(t, idleErr)

	// B: one event on another connection, bounded so a stall fails the test.
	bctx, bcancel := context.WithTimeout(ctx, 2*time.Second)
	defer bcancel()
	start := time.Now()
	err = db.WithContext(bctx).Transaction(func(tx *gorm.DB) error {
		_, err := e.store.Add(bctx, tx, "order.paid", orderPaid{OrderID: "b"}, nil)
		return err
	})
	require.NoError(t, err, "B could not commit while A was open (waited %v)", time.Since(start))
	assert.Less(t, time.Since(start), time.Second, "B's commit")
	require.Equal(t, int64(1), countRows(t, db, ""), "B committed, A still open")

	require.NoError(t, txA.Commit().Error)
	if !returned {
		require.NoError(t, <-idle)
	}
}

// TestWritersOpenNeverMakesWritersWait: asking WritersOpen over and over
// while a writer is open holds up no other writer.
func TestWritersOpenNeverMakesWritersWait(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := setup(t, db, nil)
	e.stamper.Set(time.Now().UTC())
	require.NoError(t, e.store.SetRelayIdle(ctx, "p1", true))

	txA := begin(t, db)
	_, err := e.store.Add(ctx, txA, "order.paid", orderPaid{OrderID: "a"}, nil)
	require.NoError(t, err)

	type answers struct {
		n   int
		err error
	}
	stop := make(chan struct{})
	asked := make(chan answers, 1)
	go func() {
		var a answers
		defer func() { asked <- a }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			open, err := e.store.WritersOpen(ctx)
			if err == nil && !open {
				err = errors.New("no writer open, but A is")
			}
			if err != nil {
				a.err = err
				return
			}
			a.n++
		}
	}()
	for i := range 20 {
		bctx, bcancel := context.WithTimeout(ctx, 2*time.Second)
		err := db.WithContext(bctx).Transaction(func(tx *gorm.DB) error {
			_, err := e.store.Add(bctx, tx, "order.paid", orderPaid{OrderID: "b"}, nil)
			return err
		})
		bcancel()
		require.NoError(t, err, "writer %d", i)
	}
	close(stop)
	a := <-asked
	require.NoError(t, a.err)
	assert.Positive(t, a.n, "WritersOpen answered while the writers ran")
	assert.Equal(t, int64(20), countRows(t, db, ""), "every writer committed while A was open")
	require.NoError(t, txA.Commit().Error)
}
