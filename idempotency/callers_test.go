package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/internal/testenv"
)

// errNoToken is what the tests' Callers return for a request without
// credentials.
var errNoToken = errors.New("no bearer token")

// tokenSubject is a Caller for bearer tokens: the caller is the token's
// subject, which stays the same when the token is refreshed. The tests'
// tokens read "Bearer sub=<subject>;v=<version>"; a real Caller reads the
// verified token's claims.
func tokenSubject(r *http.Request) (string, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	sub, _, _ := strings.Cut(strings.TrimPrefix(tok, "sub="), ";")
	if !ok || sub == "" {
		return "", errNoToken
	}
	return sub, nil
}

// userKey carries the user id the session middleware found.
type userKey struct{}

// sessions stands for an application's session authentication: it maps
// the session cookie to its user and puts the user id in the context,
// where the Caller finds it.
func sessions(users map[string]string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, err := r.Cookie("session"); err == nil && users[c.Value] != "" {
			r = r.WithContext(context.WithValue(r.Context(), userKey{}, users[c.Value]))
		}
		next.ServeHTTP(w, r)
	})
}

func sessionUser(r *http.Request) (string, error) {
	id, _ := r.Context().Value(userKey{}).(string)
	if id == "" {
		return "", errors.New("no session")
	}
	return id, nil
}

// payment sends the same payment with key "pay-1", with header set to
// value.
func payment(h http.Handler, header, value string) *httptest.ResponseRecorder {
	r := newRequest(http.MethodPost, "/payments", "pay-1", `{"amount":100,"iban":"DE89370400440532013000"}`)
	if header != "" {
		r.Header.Set(header, value)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestTokenRefreshRunsOnce: a client whose bearer token is refreshed
// between an attempt and its retry gets its first response back; the
// command runs once, because the Caller names the token's subject, not the
// token. (Scoped by the raw Authorization header, it ran twice.)
func TestTokenRefreshRunsOnce(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, &idempotency.Config{Caller: tokenSubject})
		first := payment(e.h, "Authorization", "Bearer sub=alice;v=1")
		require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
		retry := payment(e.h, "Authorization", "Bearer sub=alice;v=2") // refreshed
		t.Logf("token refreshed between attempt and retry: %d run(s) for one key, retry replayed=%q",
			e.app.calls.Load(), retry.Header().Get(idempotency.HeaderReplayed))
		requireReplay(t, first, retry)
		assert.Equal(t, int64(1), e.app.calls.Load(), "one payment for one key")

		bob := payment(e.h, "Authorization", "Bearer sub=bob;v=1")
		require.Equal(t, http.StatusCreated, bob.Code)
		assert.Empty(t, bob.Header().Get(idempotency.HeaderReplayed), "another subject runs its own request")
		assert.Equal(t, int64(2), e.app.calls.Load())
		for _, row := range e.keys(t) {
			assert.NotContains(t, row.Key, "alice", "the caller is not stored in clear")
		}
	})
}

// TestCookieUsersKeepTheirOwnKeys: two users of a session-cookie
// application who send the same key each run their own command and get
// their own response, on the first request and on retries. (Scoped by
// the Authorization header, which such an application does not send, the
// second user received the first one's payment.)
func TestCookieUsersKeepTheirOwnKeys(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, &idempotency.Config{Caller: sessionUser})
		h := sessions(map[string]string{"s-alice": "user-1", "s-bob": "user-2"}, e.h)
		alice := payment(h, "Cookie", "session=s-alice")
		bob := payment(h, "Cookie", "session=s-bob")
		t.Logf("two cookie users, one key: %d run(s), bob replayed=%q, same Location=%v", e.app.calls.Load(),
			bob.Header().Get(idempotency.HeaderReplayed), alice.Header().Get("Location") == bob.Header().Get("Location"))
		require.Equal(t, http.StatusCreated, alice.Code, alice.Body.String())
		require.Equal(t, http.StatusCreated, bob.Code, bob.Body.String())
		assert.Empty(t, bob.Header().Get(idempotency.HeaderReplayed), "not alice's response replayed")
		assert.NotEqual(t, alice.Header().Get("Location"), bob.Header().Get("Location"))
		assert.Equal(t, int64(2), e.app.calls.Load(), "each user's command ran")
		requireReplay(t, alice, payment(h, "Cookie", "session=s-alice"))
		requireReplay(t, bob, payment(h, "Cookie", "session=s-bob"))
		assert.Equal(t, int64(2), e.app.calls.Load())
	})
}

// TestCallerErrorRunsNothing: a keyed request whose Caller fails or names
// nobody gets 401 and runs nothing; a request without a key does not ask
// the Caller.
func TestCallerErrorRunsNothing(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db, &idempotency.Config{Caller: tokenSubject})
		p := requireProblem(t, payment(e.h, "", ""), http.StatusUnauthorized, idempotency.ProblemNoCaller)
		assert.NotContains(t, p.Detail, errNoToken.Error(), "the Caller's error is logged, not sent")
		empty, err := idempotency.New(db, &idempotency.Config{Caller: func(*http.Request) (string, error) { return "", nil }})
		require.NoError(t, err)
		requireProblem(t, payment(empty.Middleware(e.app), "Authorization", "Bearer sub=alice"), http.StatusUnauthorized, idempotency.ProblemNoCaller)
		assert.Equal(t, int64(0), e.app.calls.Load())
		assert.Empty(t, e.keys(t))

		w := httptest.NewRecorder()
		e.h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/things", strings.NewReader("{}")))
		assert.Equal(t, http.StatusCreated, w.Code, "no key: no caller needed")
	})
}

// TestCallerIsRequired: New refuses a Config that names no caller, with
// ErrNoCaller, and one that sets both Caller and SingleCaller; with
// SingleCaller every request of a tenant shares its keys.
func TestCallerIsRequired(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	e := setup(t, testenv.Backend{Name: "sqlite", Open: testenv.SQLite}, db, &idempotency.Config{SingleCaller: true})
	for _, cfg := range []*idempotency.Config{nil, {}, {TTL: 1}} {
		_, err := idempotency.New(db, cfg)
		require.ErrorIs(t, err, idempotency.ErrNoCaller)
		require.ErrorIs(t, err, idempotency.ErrInvalidConfig)
	}
	_, err := idempotency.New(db, &idempotency.Config{Caller: tokenSubject, SingleCaller: true})
	require.ErrorIs(t, err, idempotency.ErrInvalidConfig)
	assert.NotErrorIs(t, err, idempotency.ErrNoCaller)
	assert.Contains(t, err.Error(), "Caller:")

	first := payment(e.h, "Authorization", "Bearer sub=alice")
	requireReplay(t, first, payment(e.h, "Authorization", "Bearer sub=bob"))
	assert.Equal(t, int64(1), e.app.calls.Load(), "a single caller's key is shared")
}
