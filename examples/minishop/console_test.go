package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/outbox"
)

func TestConsoleIsMountedAtSlashConsole(t *testing.T) {
	t.Parallel()
	env, a := newKitApp(t)
	checkout, err := a.checkoutConsumer() // so the order's checkout runs, for the Processes page
	require.NoError(t, err)
	env.Start(t, checkout)
	placed, err := a.PlaceOrder(context.Background(), "c1", []order.Item{{SKU: "tea", Qty: 1}})
	require.NoError(t, err)
	env.Drain(t)

	// One event that could not be published.
	store := a.units.Outbox()
	tx := env.DB.Begin()
	poison, err := store.Add(context.Background(), tx, "order.placed", map[string]any{"order_id": "payload-marker-42"}, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit().Error)
	claimed, err := store.Claim(context.Background(), outbox.ClaimOpts{Worker: "test", Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	_, err = store.MarkFailed(context.Background(), "test", outbox.Failure{ID: poison.ID, Err: errors.New("broker refused"), Dead: true})
	require.NoError(t, err)

	h, err := a.handler()
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) (*http.Response, string) {
		t.Helper()
		res, err := client.Get(srv.URL + path)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res, string(b)
	}

	res, body := get("/console/")
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	assert.Contains(t, body, "<title>Overview · minishop outbox</title>")
	// order.placed and stock.reserved were published.
	assert.Regexp(t, `id="published-total">2<`, body)
	assert.Regexp(t, `id="count-dead">1<`, body)
	assert.Contains(t, body, `data-name="order.placed"`)
	assert.Equal(t, "DENY", res.Header.Get("X-Frame-Options"))

	res, _ = get("/console")
	assert.Contains(t, []int{http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusSeeOther}, res.StatusCode)
	assert.Equal(t, "/console/", res.Header.Get("Location"))

	res, body = get("/console/static/console.css")
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Contains(t, body, "svg.chart")

	// Read-write, but not without a token.
	res, err = client.PostForm(srv.URL+"/console/dead/requeue", url.Values{"topic": {"order.placed"}})
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusForbidden, res.StatusCode)
	_, body = get("/console/dead")
	assert.Contains(t, body, "broker refused")
	assert.Contains(t, body, `data-action="requeue" data-id="`+poison.ID+`"`, "read-write: the buttons are there")
	assert.NotContains(t, body, "payload-marker-42", "no payloads")
	_, body = get("/console/dead/" + poison.ID)
	assert.Contains(t, body, `id="payload-hidden"`)
	assert.NotContains(t, body, "payload-marker-42", "payloads hidden on the detail page too")
	assert.Equal(t, outbox.StatusDead, statusOf(t, env.DB, poison.ID))

	// The order's checkout waits for its payment on the Processes page.
	res, body = get("/console/processes")
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	assert.Contains(t, body, `<h2>checkouts</h2>`)
	assert.Contains(t, body, `data-tenant="default" data-key="`+placed.ID+`"`)
	assert.Contains(t, body, `data-action="abandon" data-key="`+placed.ID+`"`)
}

func statusOf(t *testing.T, db *gorm.DB, id string) outbox.Status {
	t.Helper()
	var m outbox.Message
	require.NoError(t, db.Take(&m, "id = ?", id).Error)
	return m.Status
}
