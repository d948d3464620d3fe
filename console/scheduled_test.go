package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/console"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// schedule writes one message of tenantID under key, due in after by the
// test's clock, in its own transaction.
func (e *env) schedule(t *testing.T, tenantID, topic, key string, after time.Duration) *outbox.ScheduledMessage {
	t.Helper()
	tx := e.db.Begin()
	m, err := e.store.Schedule(t.Context(), tx, topic, map[string]any{"key": key}, outbox.At(e.clock.Now().Add(after)),
		&outbox.ScheduleOpts{Tenant: tenantID, Key: key})
	if err != nil {
		tx.Rollback()
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit().Error)
	return m
}

// waitingIDs returns the ids of every scheduled message still waiting,
// first due first.
func (e *env) waitingIDs(t *testing.T) []string {
	t.Helper()
	rows, err := e.store.ListScheduled(t.Context(), outbox.ScheduledFilter{})
	require.NoError(t, err)
	var ids []string
	for _, m := range rows {
		ids = append(ids, m.ID)
	}
	return ids
}

// TestScheduledPageListsAndCancels: the page lists the waiting messages
// first due first under their count and first due time, narrowed by the
// tenant filter; Cancel takes the key's waiting messages of the row's
// tenant only, after the confirmation box, and says when it finds nothing
// waiting (404) or the key released for delivery already (409); a first
// due time past shows as overdue.
func TestScheduledPageListsAndCancels(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := t.Context()
		// The default tenant's late-1 was released a minute after it was
		// scheduled: too late to cancel.
		e.schedule(t, "default", "invoice.remind", "late-1", time.Minute)
		e.clock.Advance(2 * time.Minute)
		r, err := e.store.ReleaseDue(ctx, outbox.ReleaseOpts{})
		require.NoError(t, err)
		require.Equal(t, 1, r.Released)
		acme1 := e.schedule(t, "acme", "invoice.remind", "invoice-7", time.Hour)
		acme2 := e.schedule(t, "acme", "invoice.remind", "invoice-7", 90*time.Minute)
		dflt := e.schedule(t, "default", "invoice.remind", "invoice-7", 30*time.Minute)
		nokey := e.schedule(t, "default", "cart.abandoned", "", 2*time.Hour)

		res, body := e.get(t, "/scheduled")
		require.Equal(t, http.StatusOK, res.StatusCode)
		assert.Contains(t, body, `aria-current="page">Scheduled</a>`)
		assert.Equal(t, "4", byID(body, "scheduled-waiting"))
		assert.Contains(t, byID(body, "scheduled-first-due"), "First due "+dflt.DueAt.UTC().Format("2006-01-02 15:04:05")+" UTC")
		assert.NotContains(t, body, `id="scheduled-overdue"`)
		assert.Contains(t, body, `<option value="acme">acme</option>`, "the tenant filter")
		var order []int
		for _, m := range []*outbox.ScheduledMessage{dflt, acme1, acme2, nokey} {
			order = append(order, strings.Index(body, `data-id="`+m.ID+`"`))
		}
		assert.IsIncreasing(t, order, "first due first, every one listed")
		assert.Equal(t, 3, strings.Count(body, `data-action="cancel"`), "a message without a key has no Cancel")

		_, body = e.get(t, "/scheduled?tenant=acme")
		assert.Equal(t, "2", byID(body, "scheduled-waiting"))
		assert.Contains(t, body, `data-id="`+acme1.ID+`"`)
		assert.NotContains(t, body, dflt.ID)
		assert.NotContains(t, body, nokey.ID)

		tok := e.token(t, "/scheduled")
		cancel := func(form url.Values) (*http.Response, string) {
			form.Set("csrf_token", tok)
			return e.post(t, "/scheduled/cancel", form, nil)
		}
		res, body = cancel(url.Values{"tenant": {"acme"}, "key": {"invoice-7"}})
		assert.Equal(t, http.StatusBadRequest, res.StatusCode)
		assert.Contains(t, byID(body, "error-message"), "confirmation")
		res, _ = e.post(t, "/scheduled/cancel", url.Values{"tenant": {"acme"}, "key": {"invoice-7"}, "confirm": {"yes"}}, nil)
		assert.Equal(t, http.StatusForbidden, res.StatusCode, "no CSRF token")
		assert.Len(t, e.waitingIDs(t), 4, "nothing cancelled")

		res, _ = cancel(url.Values{"tenant": {"acme"}, "key": {"invoice-7"}, "confirm": {"yes"}, "back_tenant": {"acme"}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		assert.Equal(t, "../scheduled?done=cancelled&n=2&tenant=acme", res.Header.Get("Location"))
		_, body = e.follow(t, res)
		assert.Equal(t, "Cancelled 2 scheduled messages: they will not be delivered.", byID(body, "flash"))
		assert.Contains(t, byID(body, "no-scheduled"), "No scheduled messages wait for tenant acme")
		assert.Equal(t, []string{dflt.ID, nokey.ID}, e.waitingIDs(t), "the default tenant's message under the same key stays")

		res, body = cancel(url.Values{"tenant": {"acme"}, "key": {"invoice-7"}, "confirm": {"yes"}})
		assert.Equal(t, http.StatusNotFound, res.StatusCode)
		assert.Contains(t, byID(body, "error-message"), `No scheduled message with key &#34;invoice-7&#34; waits`)
		res, body = cancel(url.Values{"tenant": {"default"}, "key": {"late-1"}, "confirm": {"yes"}})
		assert.Equal(t, http.StatusConflict, res.StatusCode)
		assert.Contains(t, byID(body, "error-message"), "Too late to cancel")
		res, _ = cancel(url.Values{"tenant": {"no such tenant"}, "key": {"invoice-7"}, "confirm": {"yes"}})
		assert.Equal(t, http.StatusBadRequest, res.StatusCode)
		res, _ = cancel(url.Values{"key": {""}, "confirm": {"yes"}})
		assert.Equal(t, http.StatusBadRequest, res.StatusCode)
		assert.Equal(t, []string{dflt.ID, nokey.ID}, e.waitingIDs(t))

		// Past its due time and not released: no projector runs.
		e.clock.Advance(45 * time.Minute)
		_, body = e.get(t, "/scheduled")
		assert.Contains(t, byID(body, "scheduled-overdue"), "overdue by 15m 00s")
	})
}

// TestScheduledPageKeepsToTheConsolesTenant: a console locked to tenant
// acme lists acme's scheduled messages only, whatever the query, and a
// cancel of globex's key cancels acme's messages under that key, never
// globex's.
func TestScheduledPageKeepsToTheConsolesTenant(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, &console.Config{Tenant: "acme"})
		own := e.schedule(t, "acme", "invoice.remind", "remind", time.Hour)
		other := e.schedule(t, "globex", "invoice.remind", "remind", 30*time.Minute)
		otherOnly := e.schedule(t, "globex", "invoice.remind", "globex-only", 30*time.Minute)

		_, body := e.get(t, "/scheduled?tenant=globex")
		assert.Equal(t, "1", byID(body, "scheduled-waiting"))
		assert.Contains(t, body, `data-id="`+own.ID+`"`)
		assert.NotContains(t, body, other.ID)
		assert.NotContains(t, body, otherOnly.ID)
		assert.NotContains(t, body, `name="tenant" value="globex"`)
		assert.NotContains(t, body, `<select name="tenant">`, "no tenant filter")

		tok := e.token(t, "/scheduled")
		res, body := e.post(t, "/scheduled/cancel", url.Values{"csrf_token": {tok}, "tenant": {"globex"}, "key": {"globex-only"}, "confirm": {"yes"}}, nil)
		assert.Equal(t, http.StatusNotFound, res.StatusCode, "globex's key is none of acme's")
		assert.NotContains(t, body, otherOnly.ID)
		res, _ = e.post(t, "/scheduled/cancel", url.Values{"csrf_token": {tok}, "tenant": {"globex"}, "key": {"remind"}, "confirm": {"yes"}}, nil)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		assert.Equal(t, "../scheduled?done=cancelled&n=1", res.Header.Get("Location"))
		assert.ElementsMatch(t, []string{other.ID, otherOnly.ID}, e.waitingIDs(t), "acme's cancelled, globex's both wait")
	})
}

// TestScheduledPageReadOnly: a read-only console lists scheduled messages
// with no Cancel, and refuses the POST.
func TestScheduledPageReadOnly(t *testing.T) {
	t.Parallel()
	e := setup(t, testenv.SQLite(t), &console.Config{ReadOnly: true})
	m := e.schedule(t, "acme", "invoice.remind", "remind", time.Hour)
	res, body := e.get(t, "/scheduled")
	require.Equal(t, http.StatusOK, res.StatusCode)
	assert.Contains(t, body, `data-id="`+m.ID+`"`)
	assert.NotContains(t, body, "<button")
	assert.NotContains(t, body, "csrf_token")
	res, _ = e.post(t, "/scheduled/cancel", url.Values{"tenant": {"acme"}, "key": {"remind"}, "confirm": {"yes"}}, nil)
	assert.Equal(t, http.StatusForbidden, res.StatusCode)
	assert.Equal(t, []string{m.ID}, e.waitingIDs(t))
}
