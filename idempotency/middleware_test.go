package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/tenant"
	"github.com/bentoevents/bento/uow"
)

// TestFirstRequestRunsAndRepeatReplays checks the main path: the first
// request runs the handler and commits its write with the key; a repeat gets
// the same status, body and stored headers back, marked replayed, without
// running the handler.
func TestFirstRequestRunsAndRepeatReplays(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, nil)

		first := e.post("order-1", `{"sku":"tea"}`)
		require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
		assert.JSONEq(t, `{"n":1,"echo":"{\"sku\":\"tea\"}","tenant":"default"}`, first.Body.String())
		assert.Equal(t, "/things/1", first.Header().Get("Location"))
		assert.Equal(t, "1", first.Header().Get("X-Call"), "the first response carries all headers")
		assert.Equal(t, int64(1), e.counter(t))

		for range 2 {
			again := e.post("order-1", `{"sku":"tea"}`)
			requireReplay(t, first, again)
		}
		assert.Equal(t, int64(1), e.app.calls.Load())
		assert.Equal(t, int64(1), e.counter(t))

		rows := e.keys(t)
		require.Len(t, rows, 1)
		assert.Equal(t, "default", rows[0].TenantID)
		assert.Equal(t, "order-1", rows[0].Key)
		assert.Equal(t, idempotency.StateCompleted, rows[0].State)
		assert.Equal(t, http.StatusCreated, rows[0].StatusCode)
		assert.Equal(t, idempotency.RequestDigest(http.MethodPost, "/things", []byte(`{"sku":"tea"}`)), rows[0].RequestDigest)
		assert.Equal(t, http.Header{"Content-Type": {"application/json"}, "Location": {"/things/1"}}, rows[0].Headers)
		assert.Equal(t, first.Body.Bytes(), rows[0].Body)
		assert.Equal(t, idempotency.DefaultTTL, rows[0].ExpiresAt.Sub(rows[0].CreatedAt))
	})
}

// TestKeyReusedWithDifferentRequestConflicts checks that a key answers only
// the request it was first used with: another body, path, query or method
// gets 409 and the handler does not run.
func TestKeyReusedWithDifferentRequestConflicts(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, nil)
		require.Equal(t, http.StatusCreated, e.post("k", `{"sku":"tea"}`).Code)

		for name, r := range map[string]*http.Request{
			"body":   newRequest(http.MethodPost, "/things", "k", `{"sku":"coffee"}`),
			"path":   newRequest(http.MethodPost, "/other", "k", `{"sku":"tea"}`),
			"query":  newRequest(http.MethodPost, "/things?dry_run=1", "k", `{"sku":"tea"}`),
			"method": newRequest(http.MethodPut, "/things", "k", `{"sku":"tea"}`),
		} {
			t.Run(name, func(t *testing.T) {
				p := requireProblem(t, e.serve(r), http.StatusConflict, idempotency.ProblemKeyReused)
				assert.Equal(t, "Idempotency-Key reused with a different request", p.Title)
			})
		}
		assert.Equal(t, int64(1), e.app.calls.Load())
		assert.Equal(t, int64(1), e.counter(t))
		// The original request still replays.
		assert.Equal(t, "true", e.post("k", `{"sku":"tea"}`).Header().Get(idempotency.HeaderReplayed))
	})
}

// TestRequestWithoutKeyPassesThrough checks that requests without the
// header reach the handler every time, untouched and outside any ledger
// transaction.
func TestRequestWithoutKeyPassesThrough(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, nil)
		var joined []bool
		e.app.after = func(r *http.Request, _ int64) {
			_, ok := uow.TxFromContext(r.Context())
			joined = append(joined, ok)
		}
		for i := 1; i <= 3; i++ {
			w := e.serve(newRequestWithoutKey(`{"sku":"tea"}`))
			require.Equal(t, http.StatusCreated, w.Code)
			assert.Empty(t, w.Header().Get(idempotency.HeaderReplayed))
		}
		assert.Equal(t, int64(3), e.app.calls.Load())
		assert.Equal(t, int64(3), e.counter(t))
		assert.Equal(t, []bool{false, false, false}, joined)
		assert.Empty(t, e.keys(t))
	})
}

func newRequestWithoutKey(body string) *http.Request {
	r := newRequest(http.MethodPost, "/things", "", body)
	r.Header.Del(idempotency.HeaderKey)
	return r
}

// TestInvalidKeyIsRejected checks that a malformed key, an empty one or a
// repeated header gets 400 problem+json and never reaches the handler.
func TestInvalidKeyIsRejected(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, nil)
		for name, key := range map[string]string{
			"256 characters": strings.Repeat("k", 256),
			"tab":            "a\tb",
			"newline":        "a\nb",
			"non-ASCII rune": "clé",
			"DEL":            "a\x7f",
			"empty":          "",
		} {
			t.Run(name, func(t *testing.T) {
				requireProblem(t, e.post(key, "{}"), http.StatusBadRequest, idempotency.ProblemInvalidKey)
			})
		}
		t.Run("sent twice", func(t *testing.T) {
			r := newRequest(http.MethodPost, "/things", "a", "{}")
			r.Header.Add(idempotency.HeaderKey, "b")
			requireProblem(t, e.serve(r), http.StatusBadRequest, idempotency.ProblemInvalidKey)
		})
		assert.Zero(t, e.app.calls.Load())
		assert.Empty(t, e.keys(t))

		// The limits are inclusive: 255 printable characters, spaces included.
		long := " ~" + strings.Repeat("k", 253)
		require.Equal(t, http.StatusCreated, e.post(long, "{}").Code)
		require.Len(t, e.keys(t), 1)
		assert.Equal(t, long, e.keys(t)[0].Key)
	})
}

// TestBodyOverLimitIsRejected checks that a keyed request whose body is
// larger than MaxBodyBytes gets 413, whether its length is declared or not.
func TestBodyOverLimitIsRejected(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, &idempotency.Config{MaxBodyBytes: 16})
		requireProblem(t, e.post("k1", strings.Repeat("x", 17)), http.StatusRequestEntityTooLarge, idempotency.ProblemBodyTooLarge)
		chunked := newRequest(http.MethodPost, "/things", "k2", strings.Repeat("x", 17))
		chunked.ContentLength = -1 // unknown: the body is read up to the limit
		requireProblem(t, e.serve(chunked), http.StatusRequestEntityTooLarge, idempotency.ProblemBodyTooLarge)
		assert.Zero(t, e.app.calls.Load())

		w := e.post("k3", strings.Repeat("x", 16))
		require.Equal(t, http.StatusCreated, w.Code)
		assert.Contains(t, w.Body.String(), strings.Repeat("x", 16), "the handler reads the whole buffered body")
	})
}

// TestServerErrorIsNotStored checks that a 5xx rolls back the key and the
// handler's writes and reaches the client unchanged, so a retry runs the
// handler again.
func TestServerErrorIsNotStored(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, nil)
		e.app.status = func(call int64) int {
			if call == 1 {
				return http.StatusInternalServerError
			}
			return http.StatusCreated
		}
		w := e.post("k", "{}")
		require.Equal(t, http.StatusInternalServerError, w.Code)
		assert.JSONEq(t, `{"n":1,"echo":"{}","tenant":"default"}`, w.Body.String(), "the handler's response, unchanged")
		assert.Equal(t, "1", w.Header().Get("X-Call"))
		assert.Equal(t, int64(0), e.counter(t), "the handler's write was rolled back")
		assert.Empty(t, e.keys(t))

		retry := e.post("k", "{}")
		require.Equal(t, http.StatusCreated, retry.Code)
		assert.Empty(t, retry.Header().Get(idempotency.HeaderReplayed))
		assert.Equal(t, int64(1), e.counter(t))
		requireReplay(t, retry, e.post("k", "{}"))
		assert.Equal(t, int64(2), e.app.calls.Load())
	})
}

// TestTransientFailuresAreNotStored checks that a response saying the
// request may succeed later (a concurrency conflict's 409, 408, 425, 429)
// is not stored, like a server error: the handler's work is rolled back and
// a retry with the same key runs again instead of getting the failure back
// for the key's TTL.
func TestTransientFailuresAreNotStored(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, nil)
		for _, status := range []int{http.StatusConflict, http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests} {
			t.Run(fmt.Sprint(status), func(t *testing.T) {
				e.app.calls.Store(0)
				require.NoError(t, db.Exec("UPDATE counters SET n = 0").Error)
				e.app.status = func(call int64) int {
					if call == 1 {
						return status
					}
					return http.StatusCreated
				}
				key := fmt.Sprintf("k-%d", status)
				first := e.post(key, "{}")
				require.Equal(t, status, first.Code)
				assert.Equal(t, int64(0), e.counter(t), "the handler's write was rolled back")
				retry := e.post(key, "{}")
				require.Equal(t, http.StatusCreated, retry.Code, "the retry ran again")
				assert.Empty(t, retry.Header().Get(idempotency.HeaderReplayed))
				requireReplay(t, retry, e.post(key, "{}"))
				assert.Equal(t, int64(2), e.app.calls.Load())
			})
		}
	})
}

// TestClientErrorIsStored checks that a 4xx is a result like any other: it
// is stored and replayed.
func TestClientErrorIsStored(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, nil)
		e.app.status = func(int64) int { return http.StatusUnprocessableEntity }
		first := e.post("k", "{}")
		require.Equal(t, http.StatusUnprocessableEntity, first.Code)
		again := e.post("k", "{}")
		requireReplay(t, first, again)
		assert.Equal(t, int64(1), e.app.calls.Load())
		require.Len(t, e.keys(t), 1)
		assert.Equal(t, http.StatusUnprocessableEntity, e.keys(t)[0].StatusCode)
	})
}

// TestKeysAreScopedByTenant checks that one key under two tenants is two
// keys, with the tenant taken from the request's context by default.
func TestKeysAreScopedByTenant(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, nil)
		// An outer middleware (authentication, say) puts the tenant in the
		// context, where the default Config.Tenant finds it.
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if id := r.Header.Get("X-Tenant"); id != "" {
				r = r.WithContext(tenant.With(r.Context(), id))
			}
			e.h.ServeHTTP(w, r)
		})
		send := func(tid string) *http.Request {
			r := newRequest(http.MethodPost, "/things", "same-key", "{}")
			r.Header.Set("X-Tenant", tid)
			return r
		}
		serve := func(r *http.Request) *httptest.ResponseRecorder {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		acme := serve(send("acme"))
		globex := serve(send("globex"))
		require.Equal(t, http.StatusCreated, acme.Code)
		require.Equal(t, http.StatusCreated, globex.Code)
		assert.Contains(t, acme.Body.String(), `"tenant":"acme"`, "the handler sees the tenant")
		assert.Contains(t, globex.Body.String(), `"tenant":"globex"`)
		assert.Empty(t, globex.Header().Get(idempotency.HeaderReplayed))
		assert.Equal(t, int64(2), e.app.calls.Load())
		requireReplay(t, acme, serve(send("acme")))

		rows := e.keys(t)
		require.Len(t, rows, 2)
		assert.Equal(t, []string{"acme", "globex"}, []string{rows[0].TenantID, rows[1].TenantID})

		// An explicit Config.Tenant, and an invalid tenant.
		l, err := idempotency.New(db, &idempotency.Config{SingleCaller: true, Tenant: func(r *http.Request) string { return r.Header.Get("X-Tenant") }})
		require.NoError(t, err)
		w := httptest.NewRecorder()
		l.Middleware(e.app).ServeHTTP(w, send("initech"))
		require.Equal(t, http.StatusCreated, w.Code)
		assert.Contains(t, w.Body.String(), `"tenant":"initech"`)
		w = httptest.NewRecorder()
		l.Middleware(e.app).ServeHTTP(w, send("not a tenant!"))
		requireProblem(t, w, http.StatusBadRequest, "about:blank")
		assert.Len(t, e.keys(t), 3)
	})
}

// TestFailedCommitAppliesNothing checks that when the commit itself fails
// (here a deferred foreign key checked only at COMMIT), the client gets 500
// and nothing — key, handler writes — was applied, so a retry runs anew.
func TestFailedCommitAppliesNothing(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, nil)
		require.NoError(t, db.Exec(`CREATE TABLE targets (id INTEGER PRIMARY KEY)`).Error)
		require.NoError(t, db.Exec(`CREATE TABLE bombs (id INTEGER PRIMARY KEY,
			ref INTEGER REFERENCES targets(id) DEFERRABLE INITIALLY DEFERRED)`).Error)
		e.app.after = func(r *http.Request, call int64) {
			if call == 1 {
				require.NoError(t, uow.DB(r.Context(), db).Exec(`INSERT INTO bombs (id, ref) VALUES (1, 42)`).Error)
			}
		}
		requireProblem(t, e.post("k", "{}"), http.StatusInternalServerError, idempotency.ProblemNotRecorded)
		assert.Equal(t, int64(0), e.counter(t))
		assert.Empty(t, e.keys(t))
		var bombs int64
		require.NoError(t, db.Raw("SELECT count(*) FROM bombs").Scan(&bombs).Error)
		assert.Zero(t, bombs)

		retry := e.post("k", "{}")
		require.Equal(t, http.StatusCreated, retry.Code, retry.Body.String())
		assert.Empty(t, retry.Header().Get(idempotency.HeaderReplayed))
		assert.Equal(t, int64(1), e.counter(t))
	})
}

// TestHandlerPanicRollsBack checks that a panicking handler's work and key
// are rolled back, the panic goes on, and the ledger keeps working (on
// SQLite: the write lock and connection were released).
func TestHandlerPanicRollsBack(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, nil)
		e.app.after = func(_ *http.Request, call int64) {
			if call == 1 {
				panic("boom")
			}
		}
		w := httptest.NewRecorder()
		require.PanicsWithValue(t, "boom", func() { e.h.ServeHTTP(w, newRequest(http.MethodPost, "/things", "k", "{}")) })
		assert.False(t, w.Flushed || w.Body.Len() > 0, "nothing was written to the client")
		assert.Equal(t, int64(0), e.counter(t))
		assert.Empty(t, e.keys(t))

		require.Equal(t, http.StatusCreated, e.post("k", "{}").Code)
		require.Equal(t, http.StatusCreated, e.post("other", "{}").Code)
		assert.Equal(t, int64(2), e.counter(t))
	})
}

// TestImplicitStatusAndSniffedType checks a handler that writes without
// WriteHeader or Content-Type: 200 and the sniffed type are stored and
// replayed, as net/http would have sent them.
func TestImplicitStatusAndSniffedType(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, nil)
		h := e.ledger.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("<html>ok</html>"))
		}))
		first := httptest.NewRecorder()
		h.ServeHTTP(first, newRequest(http.MethodPost, "/page", "k", ""))
		again := httptest.NewRecorder()
		h.ServeHTTP(again, newRequest(http.MethodPost, "/page", "k", ""))
		for _, w := range []*httptest.ResponseRecorder{first, again} {
			assert.Equal(t, http.StatusOK, w.Code)
			assert.Equal(t, "text/html; charset=utf-8", w.Header().Get("Content-Type"))
			assert.Equal(t, "<html>ok</html>", w.Body.String())
		}
		assert.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed))
	})
}

// TestNewNeedsMigrate: New on a database without the ledger's table fails
// with ErrNotMigrated and succeeds once Migrate ran.
func TestNewNeedsMigrate(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		cfg := &idempotency.Config{SingleCaller: true}
		_, err := idempotency.New(db, cfg)
		require.ErrorIs(t, err, idempotency.ErrNotMigrated)
		require.NoError(t, idempotency.Migrate(context.Background(), db))
		_, err = idempotency.New(db, cfg)
		require.NoError(t, err)
	})
}

// TestMigrateIsIdempotent checks that Migrate can run again and that
// Migrations ships one file per dialect.
func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		require.NoError(t, idempotency.Migrate(ctx, db))
		require.NoError(t, idempotency.Migrate(ctx, db))
		assert.True(t, db.Migrator().HasTable("idempotency_keys"))
		assert.True(t, db.Migrator().HasIndex(&idempotency.Record{}, "idempotency_keys_expires"))
	})
}
