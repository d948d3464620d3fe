package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/console"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/rabbitmq"
)

func TestOverviewShowsCountsAgeAndActivity(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		res, body := e.get(t, "/")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		assert.Equal(t, "text/html; charset=utf-8", res.Header.Get("Content-Type"))
		for status, want := range map[outbox.Status]string{
			outbox.StatusNew: "1", outbox.StatusPublishing: "0", outbox.StatusSent: "",
			outbox.StatusFailed: "1", outbox.StatusDead: "2",
		} {
			assert.Equal(t, want, byID(body, "count-"+string(status)), "count of %s", status)
		}
		assert.Equal(t, "2", byID(body, "pending"))
		// c, created at epoch+2s, is the oldest pending row at epoch+10m.
		assert.Equal(t, "9m 58s", byID(body, "oldest-pending"))
		assert.Equal(t, "1", byID(body, "published-total"))
		assert.Equal(t, "3", byID(body, "failed-total"))
		assert.Contains(t, body, "<svg class=\"chart\"")
		assert.Contains(t, body, "09:02 UTC: 0 published, 2 failed", "the minute c and e failed")
		assert.Contains(t, body, "09:01 UTC: 1 published, 1 failed", "the minute a was sent and b died")

		assert.Equal(t, "2", cell(body, "by-topic", "order.paid", outbox.StatusDead))
		assert.Equal(t, "", cell(body, "by-topic", "order.paid", outbox.StatusSent), "sent rows are not monitored")
		assert.Equal(t, "1", cell(body, "by-topic", "order.placed", outbox.StatusFailed))
		assert.Equal(t, "1", cell(body, "by-tenant", "acme", outbox.StatusDead))
		assert.Equal(t, "1", cell(body, "by-tenant", "default", outbox.StatusDead))
		assert.Contains(t, body, `<option value="acme">acme</option>`, "tenant filter")

		res, body = e.get(t, "/?tenant=acme")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		assert.Equal(t, "1", byID(body, "count-dead"))
		assert.Equal(t, "0", byID(body, "count-new"))
		assert.Equal(t, "0", byID(body, "pending"))
		assert.Equal(t, "—", byID(body, "oldest-pending"))
		assert.Equal(t, "1", byID(body, "failed-total"))
		assert.NotContains(t, body, `id="by-tenant"`, "one tenant needs no per-tenant table")
		assert.Contains(t, body, `<option value="acme" selected>acme</option>`)

		res, body = e.get(t, "/?tenant=bad%20tenant")
		assert.Equal(t, http.StatusBadRequest, res.StatusCode)
		assert.Contains(t, byID(body, "error-message"), "Bad tenant filter")
	})
}

func TestSecurityHeadersOnEveryResponse(t *testing.T) {
	t.Parallel()
	e := setup(t, testenv.SQLite(t), nil)
	for _, path := range []string{"/", "/dead", "/dead/" + e.rows["b"].ID, "/static/console.css", "/nope", "/dead/nope"} {
		res, body := e.get(t, path)
		h := res.Header
		assert.Contains(t, h.Get("Content-Security-Policy"), "default-src 'none'", path)
		assert.NotContains(t, h.Get("Content-Security-Policy"), "unsafe-inline", path)
		assert.Contains(t, h.Get("Content-Security-Policy"), "frame-ancestors 'none'", path)
		assert.Equal(t, "DENY", h.Get("X-Frame-Options"), path)
		assert.Equal(t, "same-origin", h.Get("Referrer-Policy"), path)
		assert.Equal(t, "no-store", h.Get("Cache-Control"), path)
		assert.Equal(t, "nosniff", h.Get("X-Content-Type-Options"), path)
		assert.NotContains(t, body, "<script", path)
	}
	res, _ := e.get(t, "/nope")
	assert.Equal(t, http.StatusNotFound, res.StatusCode)
	res, body := e.get(t, "/static/console.css")
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Contains(t, res.Header.Get("Content-Type"), "text/css")
	assert.Contains(t, body, "svg.chart")
	res, _ = e.get(t, "/static/")
	assert.Equal(t, http.StatusNotFound, res.StatusCode, "no directory listing")
}

func TestDeadLetterListEscapesAndFilters(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		res, body := e.get(t, "/dead")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		assert.Equal(t, "2", byID(body, "dead-total"))
		assert.Contains(t, body, `data-id="`+e.rows["b"].ID+`"`)
		assert.Contains(t, body, `data-id="`+e.rows["e"].ID+`"`)
		assert.NotContains(t, body, `data-id="`+e.rows["c"].ID+`"`, "failed is not dead")
		assert.Contains(t, body, "broker said &lt;b&gt;no&lt;/b&gt; &amp; &#34;gave up&#34;", "last error, escaped")
		assert.NotContains(t, body, "<b>no</b>")
		assert.NotContains(t, body, "secret-b", "no payloads in the list")
		assert.Contains(t, body, "2026-11-21 09:01:00 UTC", "b's failed_at")

		_, body = e.get(t, "/dead?tenant=acme")
		assert.Equal(t, "1", byID(body, "dead-total"))
		assert.NotContains(t, body, `data-id="`+e.rows["b"].ID+`"`)
		_, body = e.get(t, "/dead?topic=order.placed")
		assert.Equal(t, "0", byID(body, "dead-total"))
		assert.Contains(t, body, `id="no-dead"`)
	})
}

func TestRequeueAndDiscardChangeTheDatabase(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		tok := e.token(t, "/dead")

		res, _ := e.post(t, "/dead/"+e.rows["b"].ID+"/requeue", url.Values{"csrf_token": {tok}}, nil)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		assert.Equal(t, "../../dead?done=requeued&n=1", res.Header.Get("Location"), "relative, so it works under any prefix")
		assert.Equal(t, outbox.StatusNew, e.status(t, "b"))
		res, body := e.follow(t, res)
		require.Equal(t, http.StatusOK, res.StatusCode)
		assert.Equal(t, e.url("/dead"), strings.Split(res.Request.URL.String(), "?")[0])
		assert.Contains(t, byID(body, "flash"), "Requeued 1 dead letter")
		assert.NotContains(t, body, `data-id="`+e.rows["b"].ID+`"`, "no longer listed")

		// Requeueing it again finds no dead letter of that id: 404.
		res, body = e.post(t, "/dead/"+e.rows["b"].ID+"/requeue", url.Values{"csrf_token": {tok}}, nil)
		assert.Equal(t, http.StatusNotFound, res.StatusCode)
		assert.Contains(t, byID(body, "error-message"), "may have been requeued or discarded")

		// Discard needs the confirmation box.
		res, body = e.post(t, "/dead/"+e.rows["e"].ID+"/discard", url.Values{"csrf_token": {tok}}, nil)
		assert.Equal(t, http.StatusBadRequest, res.StatusCode)
		assert.Contains(t, byID(body, "error-message"), "confirmation")
		assert.Equal(t, outbox.StatusDead, e.status(t, "e"))
		res, _ = e.post(t, "/dead/"+e.rows["e"].ID+"/discard", url.Values{"csrf_token": {tok}, "confirm": {"yes"}, "back_tenant": {"acme"}}, nil)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		assert.Equal(t, "../../dead?done=discarded&n=1&tenant=acme", res.Header.Get("Location"), "keeps the list's filter")
		assert.Equal(t, outbox.Status(""), e.status(t, "e"), "deleted")
		assert.Equal(t, outbox.StatusFailed, e.status(t, "c"), "other rows untouched")
		assert.Equal(t, outbox.StatusSent, e.status(t, "a"))
	})
}

func TestRequeueByTopic(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		tok := e.token(t, "/dead")
		res, body := e.post(t, "/dead/requeue", url.Values{"csrf_token": {tok}}, nil)
		assert.Equal(t, http.StatusBadRequest, res.StatusCode, "a topic is required")
		assert.Contains(t, byID(body, "error-message"), "needs a topic")

		res, _ = e.post(t, "/dead/requeue", url.Values{"csrf_token": {tok}, "topic": {"order.paid"}, "tenant": {"acme"}}, nil)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		assert.Equal(t, outbox.StatusNew, e.status(t, "e"))
		assert.Equal(t, outbox.StatusDead, e.status(t, "b"), "other tenant's dead letter stays")

		res, _ = e.post(t, "/dead/requeue", url.Values{"csrf_token": {tok}, "topic": {"order.paid"}}, nil)
		_, body = e.follow(t, res)
		assert.Contains(t, byID(body, "flash"), "Requeued 1 dead letter")
		assert.Equal(t, outbox.StatusNew, e.status(t, "b"))
	})
}

func TestForgedPostsAreRefused(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		path := "/dead/" + e.rows["b"].ID + "/requeue"
		refused := func(name string, res *http.Response, body, reason string) {
			t.Helper()
			assert.Equal(t, http.StatusForbidden, res.StatusCode, name)
			assert.Contains(t, byID(body, "error-message"), reason, name)
			assert.Equal(t, outbox.StatusDead, e.status(t, "b"), name)
		}

		// No cookie, no token: a bare forged POST.
		res, body := e.post(t, path, url.Values{}, nil)
		refused("no cookie", res, body, "Missing CSRF cookie")

		tok := e.token(t, "/dead") // sets the cookie
		res, body = e.post(t, path, url.Values{}, nil)
		refused("cookie, no token", res, body, "invalid CSRF token")
		res, body = e.post(t, path, url.Values{"csrf_token": {tok + "x"}}, nil)
		refused("bad token", res, body, "invalid CSRF token")
		res, body = e.post(t, path, url.Values{"csrf_token": {strings.Repeat("A", len(tok))}}, nil)
		refused("guessed token", res, body, "invalid CSRF token")

		// A token of another console (another secret) is no good here.
		other := setup(t, testenv.SQLite(t), &console.Config{Secret: []byte("another secret of at least 32 bytes")})
		res, body = e.post(t, path, url.Values{"csrf_token": {other.token(t, "/dead")}}, nil)
		refused("other console's token", res, body, "invalid CSRF token")

		// A token for another browser's cookie is no good either.
		e2 := setup(t, testenv.SQLite(t), nil)
		res, body = e.post(t, path, url.Values{"csrf_token": {e2.token(t, "/dead")}}, nil)
		refused("other cookie's token", res, body, "invalid CSRF token")

		// A valid token from a cross-site page is still refused.
		res, body = e.post(t, path, url.Values{"csrf_token": {tok}}, http.Header{"Sec-Fetch-Site": {"cross-site"}})
		refused("cross-site", res, body, "Cross-origin")
		res, body = e.post(t, path, url.Values{"csrf_token": {tok}}, http.Header{"Origin": {"https://evil.example"}})
		refused("foreign origin", res, body, "Cross-origin")

		// GET never changes anything.
		res, _ = e.get(t, path)
		assert.Equal(t, http.StatusNotFound, res.StatusCode)
		assert.Equal(t, outbox.StatusDead, e.status(t, "b"))

		// The real thing passes.
		res, _ = e.post(t, path, url.Values{"csrf_token": {tok}}, http.Header{"Sec-Fetch-Site": {"same-origin"}})
		assert.Equal(t, http.StatusSeeOther, res.StatusCode)
		assert.Equal(t, outbox.StatusNew, e.status(t, "b"))
	})
}

func TestCSRFCookie(t *testing.T) {
	t.Parallel()
	e := setup(t, testenv.SQLite(t), nil)
	res, _ := e.get(t, "/dead/"+e.rows["b"].ID)
	var ck *http.Cookie
	for _, c := range res.Cookies() {
		if c.Name == "bento_console_csrf" {
			ck = c
		}
	}
	require.NotNil(t, ck, "cookie set on the first page")
	assert.Equal(t, "/console/", ck.Path, "scoped to the mount point, whatever page set it")
	assert.True(t, ck.HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, ck.SameSite)

	res, _ = e.get(t, "/")
	assert.Empty(t, res.Cookies(), "kept once set")
}

func TestReadOnlyHasNoButtonsAndRefusesPosts(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, &console.Config{ReadOnly: true})
		for _, path := range []string{"/", "/dead", "/dead/" + e.rows["b"].ID} {
			res, body := e.get(t, path)
			require.Equal(t, http.StatusOK, res.StatusCode, path)
			assert.NotContains(t, body, "<button", path)
			assert.NotContains(t, body, `method="post"`, path)
			assert.NotContains(t, body, "csrf_token", path)
			assert.Contains(t, body, `id="read-only"`, path)
		}
		_, body := e.get(t, "/dead")
		assert.Contains(t, body, `data-id="`+e.rows["b"].ID+`"`, "the dead letters are still listed")

		// A token valid on a read-write console of the same secret, with its
		// cookie, is refused all the same.
		rw := setup(t, testenv.SQLite(t), nil)
		tok := rw.token(t, "/dead")
		u, _ := url.Parse(rw.srv.URL + "/console/")
		cookies := rw.client.Jar.Cookies(u)
		require.NotEmpty(t, cookies)
		eu, _ := url.Parse(e.srv.URL + "/console/")
		e.client.Jar.SetCookies(eu, cookies)
		for _, path := range []string{"/dead/" + e.rows["b"].ID + "/requeue", "/dead/requeue"} {
			res, body := e.post(t, path, url.Values{"csrf_token": {tok}, "topic": {"order.paid"}, "confirm": {"yes"}}, nil)
			assert.Equal(t, http.StatusForbidden, res.StatusCode, path)
			assert.Contains(t, byID(body, "error-message"), "read-only", path)
		}
		res, _ := e.post(t, "/dead/"+e.rows["b"].ID+"/discard", url.Values{"csrf_token": {tok}, "confirm": {"yes"}}, nil)
		assert.Equal(t, http.StatusForbidden, res.StatusCode)
		assert.Equal(t, outbox.StatusDead, e.status(t, "b"))
		assert.Equal(t, outbox.StatusDead, e.status(t, "e"))
	})
}

func TestPayloadsOnlyWhenEnabled(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		res, body := e.get(t, "/dead/"+e.rows["b"].ID)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		assert.Equal(t, e.rows["b"].ID, byID(body, "event-id"))
		assert.Equal(t, "1", byID(body, "field-attempts"))
		assert.Contains(t, byID(body, "last-error"), "broker said &lt;b&gt;no&lt;/b&gt;")
		assert.NotContains(t, body, "secret-b")
		assert.NotContains(t, body, "corr-b")
		assert.Contains(t, body, `id="payload-hidden"`)

		shown := setup(t, testenv.SQLite(t), &console.Config{ShowPayloads: true})
		_, body = shown.get(t, "/dead/"+shown.rows["b"].ID)
		assert.Contains(t, body, "secret-b")
		assert.Contains(t, body, "corr-b", "metadata")
		assert.Contains(t, body, `&lt;i&gt;meta&lt;/i&gt;`, "metadata escaped")
		assert.NotContains(t, body, "<i>meta")
		assert.NotContains(t, body, "<script>")

		res, body = e.get(t, "/dead/"+e.rows["c"].ID)
		assert.Equal(t, http.StatusNotFound, res.StatusCode, "c is failed, not dead")
		assert.Contains(t, byID(body, "error-message"), "No dead letter")
	})
}

func TestMountedUnderAnyPrefix(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{"/ops/bento", ""} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			t.Parallel()
			e := setupAt(t, testenv.SQLite(t), nil, prefix)
			if prefix != "" {
				// Without the trailing slash, relative links would miss the
				// prefix: the console redirects to it.
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodGet, prefix, nil)
				req.Host = "localhost" // not httptest's example.com, which the console refuses
				http.StripPrefix(prefix, e.con).ServeHTTP(rec, req)
				require.Equal(t, http.StatusSeeOther, rec.Code)
				assert.Equal(t, "bento/", rec.Header().Get("Location"), "relative to /ops/bento: /ops/bento/")
			}
			res, body := e.get(t, "/")
			require.Equal(t, http.StatusOK, res.StatusCode)
			assert.Contains(t, body, `href="./static/console.css"`)
			for _, link := range []string{"./static/console.css", "./dead"} {
				u, err := res.Request.URL.Parse(link)
				require.NoError(t, err)
				r, _ := e.do(t, http.MethodGet, u.String(), nil, nil)
				assert.Equal(t, http.StatusOK, r.StatusCode, link)
			}

			// From a detail page, links climb back to the root.
			id := e.rows["b"].ID
			res, body = e.get(t, "/dead/"+id)
			require.Equal(t, http.StatusOK, res.StatusCode)
			assert.Contains(t, body, `href="../static/console.css"`)
			assert.Contains(t, body, `action="../dead/`+id+`/requeue"`)
			action, err := res.Request.URL.Parse("../dead/" + id + "/requeue")
			require.NoError(t, err)
			assert.Equal(t, e.srv.URL+prefix+"/dead/"+id+"/requeue", action.String())

			tok := tokenRE.FindStringSubmatch(body)[1]
			res, _ = e.do(t, http.MethodPost, action.String(), url.Values{"csrf_token": {tok}}, nil)
			require.Equal(t, http.StatusSeeOther, res.StatusCode)
			res, _ = e.follow(t, res)
			assert.Equal(t, e.srv.URL+prefix+"/dead", strings.Split(res.Request.URL.String(), "?")[0])
			assert.Equal(t, outbox.StatusNew, e.status(t, "b"))
		})
	}
}

func TestTenantLock(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, &console.Config{Tenant: "acme"})
		_, body := e.get(t, "/?tenant=default")
		assert.Equal(t, "1", byID(body, "count-dead"), "acme only, whatever the query says")
		assert.Equal(t, "0", byID(body, "count-new"), "default's new row is not counted")
		assert.Equal(t, "tenant acme", byID(body, "tenant-lock"))
		assert.NotContains(t, body, `name="tenant"`, "no tenant filter")

		_, body = e.get(t, "/dead")
		assert.Equal(t, "1", byID(body, "dead-total"))
		assert.NotContains(t, body, e.rows["b"].ID)

		res, _ := e.get(t, "/dead/"+e.rows["b"].ID)
		assert.Equal(t, http.StatusNotFound, res.StatusCode, "another tenant's dead letter")

		tok := e.token(t, "/dead")
		res, _ = e.post(t, "/dead/"+e.rows["b"].ID+"/requeue", url.Values{"csrf_token": {tok}}, nil)
		assert.Equal(t, http.StatusNotFound, res.StatusCode, "another tenant's dead letter")
		res, _ = e.post(t, "/dead/requeue", url.Values{"csrf_token": {tok}, "topic": {"order.paid"}, "tenant": {"default"}}, nil)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		res, _ = e.post(t, "/dead/"+e.rows["b"].ID+"/discard", url.Values{"csrf_token": {tok}, "confirm": {"yes"}}, nil)
		assert.Equal(t, http.StatusNotFound, res.StatusCode, "another tenant's dead letter")
		assert.Equal(t, outbox.StatusDead, e.status(t, "b"), "untouched")
		assert.Equal(t, outbox.StatusNew, e.status(t, "e"), "acme's own, requeued by topic")
	})
}

func TestStoreErrorRendersA500(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		require.NoError(t, sqlDB.Close())
		for _, path := range []string{"/", "/dead", "/dead/" + e.rows["b"].ID} {
			res, body := e.get(t, path)
			assert.Equal(t, http.StatusInternalServerError, res.StatusCode, path)
			msg := byID(body, "error-message")
			assert.Contains(t, msg, "The outbox could not be read or changed: outbox:", path)
			assert.NotContains(t, body, "goroutine", path)
			assert.Contains(t, res.Header.Get("Content-Type"), "text/html", path)
		}
	})
}

func TestRefreshAndTitle(t *testing.T) {
	t.Parallel()
	e := setup(t, testenv.SQLite(t), &console.Config{Refresh: 15 * time.Second, Title: "shop <ops>"})
	_, body := e.get(t, "/")
	assert.Contains(t, body, `<meta http-equiv="refresh" content="15">`)
	assert.Contains(t, body, "shop &lt;ops&gt;")
	_, body = e.get(t, "/dead")
	assert.NotContains(t, body, "http-equiv", "only the overview reloads itself")
	_, body = setup(t, testenv.SQLite(t), nil).get(t, "/")
	assert.NotContains(t, body, "http-equiv")
}

// TestHostMustBeAllowed: a request whose Host header names something else
// than the console (what DNS rebinding produces) gets 421 and nothing of
// the console, not even a CSRF cookie; loopback names and the configured
// AllowedHosts pass.
func TestHostMustBeAllowed(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	e := setup(t, db, &console.Config{AllowedHosts: []string{"console.internal", "ops.example:8443"}})
	port := strings.TrimPrefix(e.srv.URL, "http://127.0.0.1:")
	get := func(host string) (*http.Response, string) {
		req, err := http.NewRequest(http.MethodGet, e.url("/"), nil)
		require.NoError(t, err)
		req.Host = host
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res, string(b)
	}
	for _, host := range []string{"rebind.attacker.test:" + port, "evil.test", "console.internal.attacker.test", "ops.example:80", "127.0.0.2"} {
		res, body := get(host)
		assert.Equal(t, http.StatusMisdirectedRequest, res.StatusCode, host)
		assert.Empty(t, res.Header.Values("Set-Cookie"), "%s: no CSRF cookie", host)
		assert.Contains(t, body, "AllowedHosts", host)
		assert.NotContains(t, body, "order.paid", "%s: nothing of the outbox", host)
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port, "LOCALHOST", "console.internal:" + port, "console.internal", "ops.example:8443"} {
		res, _ := get(host)
		assert.Equal(t, http.StatusOK, res.StatusCode, host)
	}
	_, err := console.New(e.store, &console.Config{AllowedHosts: []string{"", "a b", "http://x/"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "AllowedHosts[0]")
	assert.Contains(t, err.Error(), "AllowedHosts[2]")
}

// TestHostBehindAReverseProxy: a reverse proxy on the console's host that
// rewrites Host to its upstream, 127.0.0.1 (nginx's default, proxy_set_header
// Host $proxy_host; httputil's SetURL), makes every request look like one
// for a loopback name, whatever name the browser asked for. With
// ExcludeLoopback such requests get 421, X-Forwarded-Host and Forwarded
// are not read, and only a proxy that passes the browser's Host on reaches
// the console, under the public name AllowedHosts lists.
func TestHostBehindAReverseProxy(t *testing.T) {
	t.Parallel()
	const public = "console.example.com"
	e := setup(t, testenv.SQLite(t), &console.Config{AllowedHosts: []string{public}, ExcludeLoopback: true})
	// proxy serves a reverse proxy to to's console.
	proxy := func(to *env, passHost bool) string {
		upstream, err := url.Parse(to.srv.URL)
		require.NoError(t, err)
		p := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(upstream) // Host: 127.0.0.1:<port>, as nginx's $proxy_host
			r.SetXForwarded()  // X-Forwarded-Host: the browser's Host
			if passHost {
				r.Out.Host = r.In.Host // nginx: proxy_set_header Host $host
			}
		}})
		t.Cleanup(p.Close)
		return p.URL
	}
	get := func(base, host string, header http.Header) int {
		req, err := http.NewRequest(http.MethodGet, base+e.prefix+"/", nil)
		require.NoError(t, err)
		req.Host = host
		for k, v := range header {
			req.Header[k] = v
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		return res.StatusCode
	}

	rewriting := proxy(e, false)
	admitted := 0
	for _, host := range []string{public, "rebind.attacker.test", "localhost", "127.0.0.1"} {
		code := get(rewriting, host, nil)
		assert.Equal(t, http.StatusMisdirectedRequest, code, "through a proxy that rewrites Host, browser's Host %s", host)
		if code == http.StatusOK {
			admitted++
		}
	}
	t.Logf("through a proxy that rewrites Host to 127.0.0.1: %d of 4 requests admitted", admitted)

	passing := proxy(e, true)
	for host, want := range map[string]int{
		public: http.StatusOK, public + ":443": http.StatusOK,
		"rebind.attacker.test": http.StatusMisdirectedRequest, "127.0.0.1:8080": http.StatusMisdirectedRequest,
		"localhost": http.StatusMisdirectedRequest, "[::1]:8080": http.StatusMisdirectedRequest,
	} {
		assert.Equal(t, want, get(passing, host, nil), "through a proxy that passes Host on, Host %s", host)
	}

	// Straight to the console: the forwarding headers count for nothing.
	for _, h := range []http.Header{{"X-Forwarded-Host": {public}}, {"Forwarded": {"host=" + public}}} {
		assert.Equal(t, http.StatusMisdirectedRequest, get(e.srv.URL, "127.0.0.1:8080", h), "%v is not trusted", h)
	}
	assert.Equal(t, http.StatusOK, get(e.srv.URL, public, http.Header{"X-Forwarded-Host": {"rebind.attacker.test"}}), "only Host counts")

	// The default still allows the loopback names, for a console reached
	// on its loopback address: behind a rewriting proxy it admits anything.
	def := setup(t, testenv.SQLite(t), &console.Config{AllowedHosts: []string{public}})
	assert.Equal(t, http.StatusOK, get(proxy(def, false), "rebind.attacker.test", nil), "ExcludeLoopback unset")
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	require.NoError(t, outbox.Migrate(context.Background(), db))
	store, err := outbox.NewStore(db, nil)
	require.NoError(t, err)
	_, err = console.New(store, &console.Config{Secret: []byte("short"), DeadLimit: -1, Tenant: "no spaces", Refresh: -1})
	require.ErrorIs(t, err, console.ErrInvalidConfig)
	for _, field := range []string{"Secret:", "DeadLimit:", "Tenant:", "Refresh:"} {
		assert.Contains(t, err.Error(), field)
	}
	_, err = console.New(store, &console.Config{ExcludeLoopback: true})
	require.ErrorIs(t, err, console.ErrInvalidConfig, "ExcludeLoopback without AllowedHosts")
	assert.Contains(t, err.Error(), "ExcludeLoopback:")
	_, err = console.New(store, &console.Config{Consumers: &console.Consumers{}})
	require.ErrorIs(t, err, console.ErrInvalidConfig, "Consumers without AMQP and Groups")
	assert.Contains(t, err.Error(), "Consumers:")
	_, err = console.New(store, &console.Config{Consumers: &console.Consumers{DeadLetters: consumer.DatabaseDeadLetters(db)}})
	require.ErrorIs(t, err, console.ErrInvalidConfig, "Consumers on the database bus without Groups")
	_, err = console.New(store, &console.Config{Consumers: &console.Consumers{DeadLetters: consumer.DatabaseDeadLetters(db), Groups: []string{"g"}}})
	require.NoError(t, err, "Consumers on the database bus need no AMQP")
	_, err = console.New(nil, nil)
	assert.Error(t, err)

	for name, in := range map[string]*console.Config{"nil": nil, "zero": {}} {
		c, err := console.New(store, in)
		require.NoError(t, err, name)
		cfg := c.Config()
		assert.Equal(t, 100, cfg.DeadLimit, name)
		assert.Equal(t, "bento console", cfg.Title, name)
		assert.Len(t, cfg.Secret, 32, name)
		assert.Zero(t, cfg.Refresh, name)
		assert.False(t, cfg.ReadOnly, name)
		assert.False(t, cfg.ShowPayloads, name)
		assert.NotNil(t, cfg.Logger, name)
	}
}

// TestUnroutablePageListsAndReplays: an event relayed before any queue was
// bound for its type is listed on the unroutable page by type; replaying
// it before its group's queue exists says it came back; once the queue is
// declared, the replay delivers it there and the page is empty.
func TestUnroutablePageListsAndReplays(t *testing.T) {
	t.Parallel()
	ex := testenv.NewExchange(t)
	amqpCfg := &rabbitmq.Config{URL: ex.URL, Exchange: ex.Name}
	pub, err := rabbitmq.NewPublisher(t.Context(), amqpCfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	m := message.NewMessage("late-1", []byte(`{}`))
	m.Metadata.Set(messaging.MetaEventType, "late.event")
	require.NoError(t, pub.Publish("late.event", m))
	require.Eventually(t, func() bool {
		n, err := rabbitmq.QueueDepth(t.Context(), amqpCfg, rabbitmq.UnroutableQueue(ex.Name))
		return err == nil && n == 1
	}, 10*time.Second, 20*time.Millisecond)

	e := setup(t, testenv.SQLite(t), &console.Config{Unroutable: amqpCfg})
	res, body := e.get(t, "/unroutable")
	require.Equal(t, http.StatusOK, res.StatusCode)
	assert.Contains(t, body, `data-type="late.event"`)
	assert.Contains(t, body, `data-id="late-1"`)
	tok := e.token(t, "/unroutable")
	res, _ = e.post(t, "/unroutable/replay", url.Values{"csrf_token": {tok}, "event_type": {"late.event"}}, nil)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	_, body = e.follow(t, res)
	assert.Contains(t, byID(body, "flash"), "Replayed 1 event(s) of type late.event; 1 came back")

	queue := "late-group-" + ex.Name
	ex.Queues(queue)
	require.NoError(t, rabbitmq.DeclareQueue(t.Context(), amqpCfg, queue, "late.*"))
	res, _ = e.post(t, "/unroutable/replay", url.Values{"csrf_token": {tok}, "event_type": {"late.event"}}, nil)
	_, body = e.follow(t, res)
	assert.Contains(t, byID(body, "flash"), "Replayed 1 event(s) of type late.event; 0 came back")
	assert.Contains(t, body, `id="unroutable-empty"`)
	require.Eventually(t, func() bool {
		n, err := rabbitmq.QueueDepth(t.Context(), amqpCfg, queue)
		return err == nil && n == 1
	}, 10*time.Second, 20*time.Millisecond)
}
