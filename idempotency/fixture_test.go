package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/tenant"
	"github.com/bentoevents/bento/uow"
)

// app is the handler behind the middleware: it counts its calls, increments
// the "hits" counter row through the request's transaction and answers 201
// with JSON and a Location. Its hooks are set before it serves.
type app struct {
	db    *gorm.DB
	calls atomic.Int64
	// status, when set, picks the status of call n (1-based).
	status func(call int64) int
	// after, when set, runs after the counter write of call n.
	after func(r *http.Request, call int64)
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	call := a.calls.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	db := uow.DB(r.Context(), a.db)
	var n int64
	if err := db.Exec("UPDATE counters SET n = n + 1 WHERE name = 'hits'").Error; err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if err := db.Raw("SELECT n FROM counters WHERE name = 'hits'").Scan(&n).Error; err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if a.after != nil {
		a.after(r, call)
	}
	status := http.StatusCreated
	if a.status != nil {
		status = a.status(call)
	}
	tid, _ := tenant.From(r.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/things/%d", n))
	w.Header().Set("X-Call", fmt.Sprint(call)) // not a stored header
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"n": n, "echo": string(body), "tenant": tid})
}

// env is what each test needs.
type env struct {
	db      *gorm.DB
	backend testenv.Backend
	app     *app
	ledger  *idempotency.Ledger
	h       http.Handler // ledger.Middleware(app)
}

// setup migrates db, creates the counters table and puts a ledger with cfg
// in front of a fresh app. A cfg that names no caller gets SingleCaller.
func setup(t *testing.T, b testenv.Backend, db *gorm.DB, cfg *idempotency.Config) *env {
	t.Helper()
	c := idempotency.Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Caller == nil {
		c.SingleCaller = true
	}
	cfg = &c
	require.NoError(t, idempotency.Migrate(context.Background(), db))
	require.NoError(t, db.Exec(`CREATE TABLE counters (name VARCHAR(64) PRIMARY KEY, n INTEGER NOT NULL)`).Error)
	require.NoError(t, db.Exec(`INSERT INTO counters (name, n) VALUES ('hits', 0)`).Error)
	l, err := idempotency.New(db, cfg)
	require.NoError(t, err)
	a := &app{db: db}
	return &env{db: db, backend: b, app: a, ledger: l, h: l.Middleware(a)}
}

// newRequest returns a request with key as its Idempotency-Key.
func newRequest(method, target, key, body string) *http.Request {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.Header.Set(idempotency.HeaderKey, key)
	return r
}

// serve sends r through the middleware.
func (e *env) serve(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	return w
}

// post sends POST /things with key and body.
func (e *env) post(key, body string) *httptest.ResponseRecorder {
	return e.serve(newRequest(http.MethodPost, "/things", key, body))
}

// counter returns the committed hits counter.
func (e *env) counter(t *testing.T) int64 {
	t.Helper()
	var n int64
	require.NoError(t, e.db.Raw("SELECT n FROM counters WHERE name = 'hits'").Scan(&n).Error)
	return n
}

// keys returns the committed ledger rows ordered by tenant and key.
func (e *env) keys(t *testing.T) []idempotency.Record {
	t.Helper()
	var rows []idempotency.Record
	require.NoError(t, e.db.Order("tenant_id, idem_key").Find(&rows).Error)
	return rows
}

// problemBody is an RFC 9457 problem as the tests read it.
type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// requireProblem checks that w is a problem+json response of status and
// type typ.
func requireProblem(t *testing.T, w *httptest.ResponseRecorder, status int, typ string) problemBody {
	t.Helper()
	require.Equal(t, status, w.Code, "body: %s", w.Body.String())
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	var p problemBody
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p), "body: %s", w.Body.String())
	assert.Equal(t, status, p.Status)
	assert.Equal(t, typ, p.Type)
	assert.NotEmpty(t, p.Title)
	assert.NotEmpty(t, p.Detail)
	assert.Empty(t, w.Header().Get(idempotency.HeaderReplayed))
	return p
}

// requireReplay checks that replay repeats first, with only the stored
// headers and Idempotent-Replayed: true.
func requireReplay(t *testing.T, first, replay *httptest.ResponseRecorder) {
	t.Helper()
	require.Equal(t, first.Code, replay.Code)
	assert.Equal(t, first.Body.String(), replay.Body.String())
	assert.Equal(t, first.Header().Get("Location"), replay.Header().Get("Location"))
	assert.Equal(t, first.Header().Get("Content-Type"), replay.Header().Get("Content-Type"))
	assert.Equal(t, "true", replay.Header().Get(idempotency.HeaderReplayed))
	assert.Empty(t, first.Header().Get(idempotency.HeaderReplayed))
	assert.Empty(t, replay.Header().Get("X-Call"), "X-Call is not a stored header")
}
