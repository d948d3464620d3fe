package idempotency_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/uow"
)

// reply is a response read off the wire.
type reply struct {
	status int
	header http.Header
	body   string
	err    error
}

// fire sends a keyed POST to srv and delivers the reply on the returned
// channel.
func fire(srv *httptest.Server, key, body string) <-chan reply {
	ch := make(chan reply, 1)
	go func() {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/things", strings.NewReader(body))
		if err != nil {
			ch <- reply{err: err}
			return
		}
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			ch <- reply{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- reply{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
	}()
	return ch
}

func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// blocker makes the app's first call hold its transaction, after its write,
// until released. On PostgreSQL it records the backend pid of that
// transaction so the test can see who waits for it.
type blocker struct {
	entered chan struct{}
	release chan struct{}
	pid     atomic.Int64
}

func block(t *testing.T, e *env) *blocker {
	bl := &blocker{entered: make(chan struct{}), release: make(chan struct{})}
	e.app.after = func(r *http.Request, call int64) {
		if call != 1 {
			return
		}
		if e.backend.Name == "postgres" {
			var pid int64
			assert.NoError(t, uow.DB(r.Context(), e.db).Raw("SELECT pg_backend_pid()").Scan(&pid).Error)
			bl.pid.Store(pid)
		}
		close(bl.entered)
		<-bl.release
	}
	return bl
}

// waitBlocked returns once some backend waits for a lock held by the
// blocked transaction (PostgreSQL), polling with a deadline.
func (bl *blocker) waitBlocked(t *testing.T, db *gorm.DB) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, "the repeat to wait for the first request", func() bool {
		var n int64
		require.NoError(t, db.Raw("SELECT count(*) FROM pg_stat_activity WHERE ? = ANY(pg_blocking_pids(pid))",
			bl.pid.Load()).Scan(&n).Error)
		return n > 0
	})
}

// TestConcurrentRepeatWaitsAndReplays fires two requests with the same key
// at once, the first holding its transaction open after its write: the
// second waits for it and replays its response, and the handler runs once.
//
// On PostgreSQL the test sees the second request wait on the first's
// transaction (pg_blocking_pids). On SQLite the wait is for the database
// write lock at BEGIN IMMEDIATE, which SQL cannot observe; the test releases
// the first request once the second has entered the middleware, so the
// second almost always waits — and when it gets to BEGIN only after the
// release, it replays all the same.
func TestConcurrentRepeatWaitsAndReplays(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, nil)
		bl := block(t, e)
		arrived := make(chan struct{}, 2)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			arrived <- struct{}{}
			e.h.ServeHTTP(w, r)
		}))
		defer srv.Close()

		first := fire(srv, "same", `{"sku":"tea"}`)
		await(t, bl.entered, "the first request in the handler")
		<-arrived
		second := fire(srv, "same", `{"sku":"tea"}`)
		await(t, arrived, "the second request in the middleware")
		if b.Name == "postgres" {
			bl.waitBlocked(t, db)
		}
		select {
		case r := <-second:
			t.Fatalf("the second request did not wait: %d %s", r.status, r.body)
		default:
		}
		close(bl.release)

		r1, r2 := await(t, first, "the first reply"), await(t, second, "the second reply")
		require.NoError(t, r1.err)
		require.NoError(t, r2.err)
		require.Equal(t, http.StatusCreated, r1.status, r1.body)
		require.Equal(t, http.StatusCreated, r2.status, r2.body)
		assert.Equal(t, r1.body, r2.body)
		assert.Equal(t, r1.header.Get("Location"), r2.header.Get("Location"))
		assert.Empty(t, r1.header.Get(idempotency.HeaderReplayed))
		assert.Equal(t, "true", r2.header.Get(idempotency.HeaderReplayed))
		assert.Equal(t, int64(1), e.app.calls.Load())
		assert.Equal(t, int64(1), e.counter(t))
	})
}

// TestConcurrentRepeatGivesUpAfterLockTimeout checks that a repeat that
// waits longer than LockTimeout gets 409 ProblemInProgress, and that the
// first request still completes and is replayed afterwards. It runs on both
// backends: on SQLite the ledger shortens the busy timeout of the
// connection it begins on to LockTimeout for the transaction.
func TestConcurrentRepeatGivesUpAfterLockTimeout(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, &idempotency.Config{LockTimeout: 200 * time.Millisecond})
		bl := block(t, e)
		srv := httptest.NewServer(e.h)
		defer srv.Close()

		first := fire(srv, "same", "{}")
		await(t, bl.entered, "the first request in the handler")
		start := time.Now()
		r2 := await(t, fire(srv, "same", "{}"), "the second reply") // the first is held until after this
		waited := time.Since(start)
		require.NoError(t, r2.err)
		require.Equal(t, http.StatusConflict, r2.status, r2.body)
		assert.Equal(t, "application/problem+json", r2.header.Get("Content-Type"))
		assert.Contains(t, r2.body, idempotency.ProblemInProgress)
		assert.Contains(t, r2.body, "request with this Idempotency-Key still in progress")
		assert.GreaterOrEqual(t, waited, 190*time.Millisecond, "the repeat waited LockTimeout")

		close(bl.release)
		r1 := await(t, first, "the first reply")
		require.NoError(t, r1.err)
		require.Equal(t, http.StatusCreated, r1.status, r1.body)
		r3 := await(t, fire(srv, "same", "{}"), "the third reply")
		require.Equal(t, http.StatusCreated, r3.status)
		assert.Equal(t, "true", r3.header.Get(idempotency.HeaderReplayed))
		assert.Equal(t, r1.body, r3.body)
		assert.Equal(t, int64(1), e.app.calls.Load())

		// The handler's own statements are not bound by LockTimeout, and on
		// SQLite the pool's busy timeout was put back.
		if b.Name == "sqlite" {
			var busy int64
			require.NoError(t, db.Raw("PRAGMA busy_timeout").Scan(&busy).Error)
			assert.Equal(t, int64(10000), busy)
		}
	})
}

// TestRepeatOfFailedFirstRunsTheHandler checks that a repeat that waited for
// a first request that ended in a 5xx (rolled back) runs the handler itself.
func TestRepeatOfFailedFirstRunsTheHandler(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, nil)
		bl := block(t, e)
		e.app.status = func(call int64) int {
			if call == 1 {
				return http.StatusServiceUnavailable
			}
			return http.StatusCreated
		}
		srv := httptest.NewServer(e.h)
		defer srv.Close()
		first := fire(srv, "same", "{}")
		await(t, bl.entered, "the first request in the handler")
		second := fire(srv, "same", "{}")
		if b.Name == "postgres" {
			bl.waitBlocked(t, db)
		}
		close(bl.release)
		r1, r2 := await(t, first, "the first reply"), await(t, second, "the second reply")
		require.Equal(t, http.StatusServiceUnavailable, r1.status)
		require.Equal(t, http.StatusCreated, r2.status, r2.body)
		assert.Empty(t, r2.header.Get(idempotency.HeaderReplayed))
		assert.Equal(t, int64(2), e.app.calls.Load())
		assert.Equal(t, int64(1), e.counter(t))
		assert.Contains(t, r2.body, `"n":1`)
	})
}

// TestHandlerStatementsAreNotBoundByLockTimeout checks, on PostgreSQL, that
// LockTimeout bounds only the wait on the key: the handler's own statements
// run under the session's lock_timeout again, so a handler that waits
// longer than LockTimeout for a row lock still succeeds. (On SQLite a
// ledger transaction holds the write lock from BEGIN, so its statements
// never wait.)
func TestHandlerStatementsAreNotBoundByLockTimeout(t *testing.T) {
	t.Parallel()
	b := testenv.Backends()[0] // PostgreSQL only: see above
	require.Equal(t, "postgres", b.Name)
	db := b.Open(t)
	{
		const lockTimeout = 50 * time.Millisecond
		e := setup(t, b, db, &idempotency.Config{LockTimeout: lockTimeout})
		holder := db.Begin()
		defer holder.Rollback()
		require.NoError(t, holder.Exec("SELECT n FROM counters WHERE name = 'hits' FOR UPDATE").Error)
		var holderPID int64
		require.NoError(t, holder.Raw("SELECT pg_backend_pid()").Scan(&holderPID).Error)

		done := make(chan *httptest.ResponseRecorder, 1)
		go func() { done <- e.post("k", "{}") }()
		bl := &blocker{}
		bl.pid.Store(holderPID)
		bl.waitBlocked(t, db)       // the handler's UPDATE waits for the row lock
		time.Sleep(4 * lockTimeout) // deliberately longer than LockTimeout
		require.NoError(t, holder.Commit().Error)
		w := await(t, done, "the reply")
		require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
		assert.Equal(t, int64(1), e.counter(t))
	}
}
