package console_test

import (
	"errors"
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
	"github.com/bentoevents/bento/process"
)

// checkoutState is a process manager's state model as an application
// declares it; its table is the console's process table checkouts.
type checkoutState struct {
	process.Base
	OrderID string
}

// TableName is the table Config.ProcessTables names.
func (checkoutState) TableName() string { return "checkouts" }

// checkoutsConsole is the configuration of a console showing the
// checkouts table.
func checkoutsConsole(cfg console.Config) *console.Config {
	cfg.ProcessTables = []string{"checkouts"}
	return &cfg
}

// startCheckout writes a checkout process of tenantID under key, started
// ago before the test's clock, with the live timeouts named, each
// scheduled an hour on under the process's timeout key.
func (e *env) startCheckout(t *testing.T, tenantID, key string, ago time.Duration, completed bool, timeouts ...string) {
	t.Helper()
	require.NoError(t, e.db.AutoMigrate(&checkoutState{}))
	started := e.clock.Now().UTC().Add(-ago)
	s := checkoutState{Base: process.Base{TenantID: tenantID, Key: key, Process: "checkout", Version: 1, Completed: completed,
		StartedAt: started, UpdatedAt: started, Timeouts: process.Timeouts{}}, OrderID: key}
	for _, name := range timeouts {
		s.Timeouts[name] = e.schedule(t, tenantID, "checkout.timeout", "checkout/"+key+"/"+name, time.Hour).ID
	}
	require.NoError(t, e.db.Create(&s).Error)
}

// runningCheckouts returns tenant/key of every running checkout.
func (e *env) runningCheckouts(t *testing.T) []string {
	t.Helper()
	rows, err := process.List(t.Context(), e.db, "checkouts", process.Filter{})
	require.NoError(t, err)
	var out []string
	for _, p := range rows {
		out = append(out, p.TenantID+"/"+p.Key)
	}
	return out
}

// TestProcessesPageListsAndAbandons: the page lists the running processes
// of the configured table, started first first with their timeouts,
// narrowed by the tenant filter; Abandon completes the row's process of
// its tenant only and cancels its timeouts, after the confirmation box and
// with the CSRF token, and says when the process is not found (404) or
// completed already (409).
func TestProcessesPageListsAndAbandons(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, checkoutsConsole(console.Config{}))
		e.startCheckout(t, "acme", "o-1", 3*time.Hour, false, "payment", "reminder")
		e.startCheckout(t, "globex", "o-1", 2*time.Hour, false, "payment")
		e.startCheckout(t, "default", "o-2", time.Hour, false)
		e.startCheckout(t, "acme", "o-0", 4*time.Hour, true)
		timeouts := e.waitingIDs(t)
		require.Len(t, timeouts, 3)

		res, body := e.get(t, "/processes")
		require.Equal(t, http.StatusOK, res.StatusCode)
		assert.Contains(t, body, `aria-current="page">Processes</a>`)
		assert.Equal(t, "3", byID(body, "processes-running"))
		assert.Contains(t, body, `<option value="globex">globex</option>`, "the tenant filter")
		var order []int
		for _, p := range []string{`data-tenant="acme" data-key="o-1"`, `data-tenant="globex" data-key="o-1"`, `data-tenant="default" data-key="o-2"`} {
			order = append(order, strings.Index(body, p))
		}
		assert.IsIncreasing(t, order, "started first first, every running one listed")
		assert.NotContains(t, body, `data-key="o-0"`, "a completed process is not listed")
		assert.Contains(t, body, "<td>payment, reminder</td>")
		assert.Equal(t, 3, strings.Count(body, `data-action="abandon"`))

		_, body = e.get(t, "/processes?tenant=acme")
		assert.Equal(t, "1", byID(body, "processes-running"))
		assert.NotContains(t, body, `data-tenant="globex"`)

		tok := e.token(t, "/processes")
		abandon := func(form url.Values) (*http.Response, string) {
			form.Set("csrf_token", tok)
			return e.post(t, "/processes/abandon", form, nil)
		}
		acme := url.Values{"table": {"checkouts"}, "tenant": {"acme"}, "key": {"o-1"}}
		res, body = abandon(url.Values{"table": {"checkouts"}, "tenant": {"acme"}, "key": {"o-1"}})
		assert.Equal(t, http.StatusBadRequest, res.StatusCode)
		assert.Contains(t, byID(body, "error-message"), "confirmation")
		res, _ = e.post(t, "/processes/abandon", url.Values{"table": {"checkouts"}, "tenant": {"acme"}, "key": {"o-1"}, "confirm": {"yes"}}, nil)
		assert.Equal(t, http.StatusForbidden, res.StatusCode, "no CSRF token")
		assert.Equal(t, []string{"acme/o-1", "globex/o-1", "default/o-2"}, e.runningCheckouts(t), "nothing abandoned")

		acme.Set("confirm", "yes")
		acme.Set("back_tenant", "acme")
		res, _ = abandon(acme)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		assert.Equal(t, "../processes?done=abandoned&tenant=acme", res.Header.Get("Location"))
		_, body = e.follow(t, res)
		assert.Contains(t, byID(body, "flash"), "Abandoned the process")
		assert.Equal(t, "0", byID(body, "processes-running"))
		assert.Contains(t, body, "No process runs in checkouts for tenant acme.")
		assert.Equal(t, []string{"globex/o-1", "default/o-2"}, e.runningCheckouts(t), "globex's process under the same key runs")
		assert.Equal(t, timeouts[2:], e.waitingIDs(t), "acme's timeouts were cancelled, globex's waits")

		res, body = abandon(acme)
		assert.Equal(t, http.StatusConflict, res.StatusCode)
		assert.Contains(t, byID(body, "error-message"), "completed already")
		res, body = abandon(url.Values{"table": {"checkouts"}, "tenant": {"acme"}, "key": {"o-9"}, "confirm": {"yes"}})
		assert.Equal(t, http.StatusNotFound, res.StatusCode)
		assert.Contains(t, byID(body, "error-message"), `No process with key &#34;o-9&#34; in checkouts`)
		// Without a tenant the key is the default tenant's.
		res, _ = abandon(url.Values{"table": {"checkouts"}, "key": {"o-1"}, "confirm": {"yes"}})
		assert.Equal(t, http.StatusNotFound, res.StatusCode)
		for _, form := range []url.Values{
			{"table": {"outbox_events"}, "tenant": {"globex"}, "key": {"o-1"}, "confirm": {"yes"}},
			{"table": {"checkouts"}, "tenant": {"no such tenant"}, "key": {"o-1"}, "confirm": {"yes"}},
			{"table": {"checkouts"}, "tenant": {"globex"}, "key": {""}, "confirm": {"yes"}},
		} {
			res, _ = abandon(form)
			assert.Equal(t, http.StatusBadRequest, res.StatusCode, "%v", form)
		}
		assert.Equal(t, []string{"globex/o-1", "default/o-2"}, e.runningCheckouts(t))
	})
}

// TestProcessesPageKeepsToTheConsolesTenant: a console locked to tenant
// acme lists acme's processes only, whatever the query, and an abandon of
// globex's key abandons acme's process under that key, never globex's.
func TestProcessesPageKeepsToTheConsolesTenant(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, checkoutsConsole(console.Config{Tenant: "acme"}))
		e.startCheckout(t, "acme", "o-1", 2*time.Hour, false)
		e.startCheckout(t, "globex", "o-1", time.Hour, false, "payment")
		e.startCheckout(t, "globex", "globex-only", time.Hour, false)

		_, body := e.get(t, "/processes?tenant=globex")
		assert.Equal(t, "1", byID(body, "processes-running"))
		assert.Contains(t, body, `data-tenant="acme" data-key="o-1"`)
		assert.NotContains(t, body, "globex")
		assert.NotContains(t, body, `<select name="tenant">`, "no tenant filter")

		tok := e.token(t, "/processes")
		res, body := e.post(t, "/processes/abandon", url.Values{"csrf_token": {tok}, "table": {"checkouts"}, "tenant": {"globex"},
			"key": {"globex-only"}, "confirm": {"yes"}}, nil)
		assert.Equal(t, http.StatusNotFound, res.StatusCode, "globex's process is none of acme's")
		assert.Equal(t, `No process with key &#34;globex-only&#34; in checkouts.`, byID(body, "error-message"), "nothing of globex's process")
		res, _ = e.post(t, "/processes/abandon", url.Values{"csrf_token": {tok}, "table": {"checkouts"}, "tenant": {"globex"},
			"key": {"o-1"}, "confirm": {"yes"}, "back_tenant": {"globex"}}, nil)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		assert.Equal(t, "../processes?done=abandoned", res.Header.Get("Location"))
		assert.ElementsMatch(t, []string{"globex/o-1", "globex/globex-only"}, e.runningCheckouts(t), "acme's abandoned, globex's both run")
		assert.Len(t, e.waitingIDs(t), 1, "globex's timeout waits")
	})
}

// TestProcessesPageReadOnly: a read-only console lists processes with no
// Abandon, and refuses the POST.
func TestProcessesPageReadOnly(t *testing.T) {
	t.Parallel()
	e := setup(t, testenv.SQLite(t), checkoutsConsole(console.Config{ReadOnly: true}))
	e.startCheckout(t, "acme", "o-1", time.Hour, false)
	res, body := e.get(t, "/processes")
	require.Equal(t, http.StatusOK, res.StatusCode)
	assert.Contains(t, body, `data-key="o-1"`)
	assert.NotContains(t, body, "<button")
	assert.NotContains(t, body, "csrf_token")
	res, _ = e.post(t, "/processes/abandon", url.Values{"table": {"checkouts"}, "tenant": {"acme"}, "key": {"o-1"}, "confirm": {"yes"}}, nil)
	assert.Equal(t, http.StatusForbidden, res.StatusCode)
	assert.Equal(t, []string{"acme/o-1"}, e.runningCheckouts(t))
}

// TestProcessesPageNeedsItsTables: without Config.ProcessTables the page
// and its nav link are absent, and a table name that is no plain SQL
// identifier is refused by New.
func TestProcessesPageNeedsItsTables(t *testing.T) {
	t.Parallel()
	e := setup(t, testenv.SQLite(t), nil)
	res, body := e.get(t, "/processes")
	assert.Equal(t, http.StatusNotFound, res.StatusCode)
	assert.Contains(t, byID(body, "error-message"), "ProcessTables")
	_, body = e.get(t, "/")
	assert.NotContains(t, body, `href="./processes"`)
	_, err := console.New(e.store, &console.Config{ProcessTables: []string{"checkouts", "bad-table"}})
	require.True(t, errors.Is(err, console.ErrInvalidConfig), "%v", err)
	assert.ErrorIs(t, err, process.ErrInvalidTable)
	assert.Contains(t, err.Error(), "ProcessTables[1]")
}
