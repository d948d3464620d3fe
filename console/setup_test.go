package console_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/console"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// epoch is where every test's fake clock starts.
var epoch = time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)

// secret is the CSRF secret of the tests' consoles, so a token taken from
// one console is valid on another built with the same secret.
var secret = []byte("0123456789abcdef0123456789abcdef")

// env is what a test needs: the database, the store and its clock, and a
// server with the console mounted under prefix.
type env struct {
	db     *gorm.DB
	store  *outbox.Store
	clock  *testenv.Clock
	rows   map[string]*outbox.Message
	con    *console.Console
	srv    *httptest.Server
	prefix string
	// client keeps cookies and does not follow redirects.
	client *http.Client
}

// setup migrates db, writes the fixture and serves a console with cfg
// (Secret defaults to secret) under /console/.
func setup(t *testing.T, db *gorm.DB, cfg *console.Config) *env {
	t.Helper()
	return setupAt(t, db, cfg, "/console")
}

// setupAt is setup with the console under prefix ("" for the root).
func setupAt(t *testing.T, db *gorm.DB, cfg *console.Config, prefix string) *env {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, outbox.Migrate(ctx, db))
	clock := testenv.NewClock(epoch)
	store, err := outbox.NewStore(db, &outbox.Config{Clock: clock, Test: outbox.TestConfig{Clock: clock}})
	require.NoError(t, err)
	e := &env{db: db, store: store, clock: clock, prefix: prefix}
	e.rows = fixture(t, e)
	c := console.Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Secret == nil {
		c.Secret = secret
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	con, err := console.New(store, &c)
	require.NoError(t, err)
	e.con = con
	mux := http.NewServeMux()
	if prefix == "" {
		mux.Handle("/", con)
	} else {
		mux.Handle(prefix+"/", http.StripPrefix(prefix, con))
	}
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	e.client = &http.Client{
		Jar:           jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       30 * time.Second,
	}
	return e
}

// fixture writes five events a second apart from epoch and takes them to
// their statuses; the clock ends at epoch+10m:
//
//	a default order.paid   sent at epoch+1m
//	b default order.paid   dead at epoch+1m  (last error with markup)
//	c default order.placed failed at epoch+2m30s
//	d default order.placed new
//	e acme    order.paid   dead at epoch+2m30s
func fixture(t *testing.T, e *env) map[string]*outbox.Message {
	t.Helper()
	ctx := context.Background()
	rows := map[string]*outbox.Message{}
	for _, r := range []struct{ name, tenant, topic string }{
		{"a", "default", "order.paid"}, {"b", "default", "order.paid"},
		{"c", "default", "order.placed"}, {"d", "default", "order.placed"},
		{"e", "acme", "order.paid"},
	} {
		tx := e.db.Begin()
		require.NoError(t, tx.Error)
		m, err := e.store.Add(ctx, tx, r.topic, map[string]any{"order_id": r.name, "note": "<script>alert(1)</script>secret-" + r.name},
			&outbox.AddOpts{Tenant: r.tenant, AggregateType: "order", AggregateID: "o-" + r.name, AggregateVersion: 1,
				Metadata: outbox.Metadata{"correlation_id": "corr-" + r.name, "note": "<i>meta</i>"}})
		if err != nil {
			tx.Rollback()
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit().Error)
		rows[r.name] = m
		e.clock.Advance(time.Second)
	}
	e.clock.Set(epoch.Add(time.Minute))
	claimed, err := e.store.Claim(ctx, outbox.ClaimOpts{Worker: "w", Limit: 5, Lease: time.Hour})
	require.NoError(t, err)
	require.Len(t, claimed, 5)
	_, err = e.store.MarkSent(ctx, "w", []string{rows["a"].ID})
	require.NoError(t, err)
	_, err = e.store.MarkFailed(ctx, "w", outbox.Failure{ID: rows["b"].ID, Err: errors.New(`broker said <b>no</b> & "gave up"`), Dead: true})
	require.NoError(t, err)
	e.clock.Set(epoch.Add(2*time.Minute + 30*time.Second))
	_, err = e.store.MarkFailed(ctx, "w", outbox.Failure{ID: rows["c"].ID, Err: errors.New("down"), RetryAfter: time.Hour - 150*time.Second})
	require.NoError(t, err)
	_, err = e.store.MarkFailed(ctx, "w", outbox.Failure{ID: rows["e"].ID, Err: errors.New("poison"), Dead: true})
	require.NoError(t, err)
	_, err = e.store.Release(ctx, "w", []string{rows["d"].ID})
	require.NoError(t, err)
	e.clock.Set(epoch.Add(10 * time.Minute))
	return rows
}

// url returns the server URL of path under the console's prefix.
func (e *env) url(path string) string { return e.srv.URL + e.prefix + path }

// get fetches path (under the prefix) and returns the response and body.
func (e *env) get(t *testing.T, path string) (*http.Response, string) {
	t.Helper()
	return e.do(t, http.MethodGet, e.url(path), nil, nil)
}

// post sends form to path (under the prefix).
func (e *env) post(t *testing.T, path string, form url.Values, header http.Header) (*http.Response, string) {
	t.Helper()
	return e.do(t, http.MethodPost, e.url(path), form, header)
}

func (e *env) do(t *testing.T, method, u string, form url.Values, header http.Header) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := e.client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, string(b)
}

// follow resolves a redirect's Location against its request and fetches it.
func (e *env) follow(t *testing.T, res *http.Response) (*http.Response, string) {
	t.Helper()
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	loc, err := res.Location()
	require.NoError(t, err)
	return e.do(t, http.MethodGet, loc.String(), nil, nil)
}

var tokenRE = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// token loads path and returns the CSRF token of its forms.
func (e *env) token(t *testing.T, path string) string {
	t.Helper()
	res, body := e.get(t, path)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	m := tokenRE.FindStringSubmatch(body)
	require.NotNil(t, m, "no csrf token in %s", path)
	return m[1]
}

// status returns the status of the fixture row name, or "" if it is gone.
func (e *env) status(t *testing.T, name string) outbox.Status {
	t.Helper()
	var rows []outbox.Message
	require.NoError(t, e.db.Where("id = ?", e.rows[name].ID).Find(&rows).Error)
	if len(rows) == 0 {
		return ""
	}
	return rows[0].Status
}

// byID returns the text of the element with id in body ("" if absent).
func byID(body, id string) string {
	re := regexp.MustCompile(`id="` + regexp.QuoteMeta(id) + `"[^>]*>([^<]*)<`)
	if m := re.FindStringSubmatch(body); m != nil {
		return strings.TrimSpace(m[1])
	}
	return ""
}

// cell returns the count in table tableID, row name, column status.
func cell(body, tableID, name string, status outbox.Status) string {
	i := strings.Index(body, `id="`+tableID+`"`)
	if i < 0 {
		return ""
	}
	body = body[i:]
	if j := strings.Index(body, "</table>"); j >= 0 {
		body = body[:j]
	}
	re := regexp.MustCompile(`(?s)<tr data-name="` + regexp.QuoteMeta(name) + `">.*?data-status="` + string(status) + `">(\d+)<`)
	if m := re.FindStringSubmatch(body); m != nil {
		return m[1]
	}
	return ""
}
