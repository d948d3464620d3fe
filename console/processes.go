package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/bentoevents/bento/process"
	"github.com/bentoevents/bento/tenant"
)

// maxProcessKeyLen is the longest correlation key process.Base stores.
const maxProcessKeyLen = 255

// processesData is the content of the processes' page.
type processesData struct {
	Tenant string
	// Tenants feed the filter (nil when the console is locked to one
	// tenant).
	Tenants []string
	// Tables are Config.ProcessTables, in order, each with its running
	// processes; Running counts the processes listed in all of them.
	Tables  []processTable
	Running int
	Flash   string
}

// processTable is one state table's running processes.
type processTable struct {
	Table string
	// Rows are its first Config.DeadLimit running processes, started
	// first first; More is set when there may be more.
	Rows []processRow
	More bool
}

// processRow is one process as the page shows it.
type processRow struct {
	process.Info
	// TimeoutNames lists the names of its live timeouts.
	TimeoutNames string
}

// processesList lists the running processes of each of
// Config.ProcessTables, of the tenant filtered on (the console's, when it
// has one).
func (c *Console) processesList(w http.ResponseWriter, r *http.Request) {
	if len(c.cfg.ProcessTables) == 0 {
		c.renderError(w, r, http.StatusNotFound, "This console shows no processes: name the process managers' state tables in console.Config.ProcessTables.")
		return
	}
	f, ok := c.filterParams(w, r, r.URL.Query())
	if !ok {
		return
	}
	ctx := r.Context()
	d := &processesData{Tenant: f.Tenant, Flash: abandonedFlash(r.URL.Query())}
	seen := []string{f.Tenant}
	for _, table := range c.cfg.ProcessTables {
		rows, err := c.data.listProcesses(ctx, table, process.Filter{Tenant: f.Tenant, Limit: c.cfg.DeadLimit})
		if err != nil {
			c.fail(w, r, err)
			return
		}
		pt := processTable{Table: table, More: len(rows) == c.cfg.DeadLimit}
		for _, p := range rows {
			pt.Rows = append(pt.Rows, processRow{Info: p, TimeoutNames: strings.Join(p.Timeouts.Names(), ", ")})
			seen = append(seen, p.TenantID)
		}
		d.Running += len(rows)
		d.Tables = append(d.Tables, pt)
	}
	if c.cfg.Tenant == "" {
		groups, err := c.data.breakdown(ctx, "")
		if err != nil {
			c.fail(w, r, err)
			return
		}
		d.Tenants = withTenants(tenantsOf(groups), seen...)
	}
	c.render(w, r, http.StatusOK, "processes", c.newPage(w, r, "processes", "Processes", d))
}

// processAbandon abandons the running process of the form's table and key
// in its tenant (the console's tenant, when it has one); the form must
// confirm it. It answers 404 when the tenant has no such process and 409
// when the process completed already, or took a step meanwhile.
func (c *Console) processAbandon(w http.ResponseWriter, r *http.Request) {
	f, ok := c.filterParams(w, r, r.PostForm)
	if !ok {
		return
	}
	table, key := r.PostForm.Get("table"), r.PostForm.Get("key")
	if !slices.Contains(c.cfg.ProcessTables, table) {
		c.renderError(w, r, http.StatusBadRequest, "Abandon needs one of the process tables this console shows.")
		return
	}
	if key == "" || len(key) > maxProcessKeyLen {
		c.renderError(w, r, http.StatusBadRequest, "Abandon needs the key of the process.")
		return
	}
	if r.PostForm.Get("confirm") != "yes" {
		c.renderError(w, r, http.StatusBadRequest, "An abandoned process is completed without a step and its timeouts cancelled: "+
			"tick the confirmation box next to Abandon.")
		return
	}
	err := c.data.abandonProcess(r.Context(), table, f.Tenant, key)
	switch {
	case errors.Is(err, process.ErrNotFound):
		c.renderError(w, r, http.StatusNotFound, fmt.Sprintf("No process with key %q in %s.", key, table))
		return
	case errors.Is(err, process.ErrCompleted):
		c.renderError(w, r, http.StatusConflict, fmt.Sprintf("The process with key %q in %s completed already: nothing to abandon.", key, table))
		return
	case errors.Is(err, process.ErrConflict):
		c.renderError(w, r, http.StatusConflict, fmt.Sprintf("The process with key %q in %s took a step while it was being abandoned: "+
			"nothing changed; look at it again.", key, table))
		return
	case err != nil:
		c.fail(w, r, err)
		return
	}
	c.cfg.Logger.InfoContext(r.Context(), "console: abandoned process", "table", table, "key", key, "tenant", f.Tenant)
	q := url.Values{"done": {"abandoned"}}
	if c.cfg.Tenant == "" {
		if t := r.PostForm.Get("back_tenant"); t != "" && tenant.Validate(t) == nil {
			q.Set("tenant", t)
		}
	}
	redirect(w, relBase(r.URL.Path)+"processes?"+q.Encode())
}

// abandonedFlash turns the outcome of an abandon into the message shown
// after the redirect; like flash, it builds the words, never takes them
// from the query.
func abandonedFlash(q url.Values) string {
	if q.Get("done") != "abandoned" {
		return ""
	}
	return "Abandoned the process: it is completed, its timeouts are cancelled, and later messages for it are dropped."
}
