package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"time"

	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
)

// scheduledData is the content of the scheduled messages' page.
type scheduledData struct {
	Tenant string
	// Tenants feed the filter (nil when the console is locked to one
	// tenant).
	Tenants []string
	// Rows are the first Config.DeadLimit waiting messages, first due
	// first; Waiting counts them all.
	Rows     []outbox.ScheduledMessage
	Waiting  int64
	FirstDue time.Time
	// Overdue is how long past FirstDue it is: no projector releases them.
	Overdue time.Duration
	Flash   string
}

func (c *Console) scheduledList(w http.ResponseWriter, r *http.Request) {
	f, ok := c.filterParams(w, r, r.URL.Query())
	if !ok {
		return
	}
	ctx := r.Context()
	rows, err := c.data.listScheduled(ctx, outbox.ScheduledFilter{Tenant: f.Tenant, Limit: c.cfg.DeadLimit})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	backlog, err := c.data.scheduledBacklog(ctx, f.Tenant)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := &scheduledData{Tenant: f.Tenant, Rows: rows, Waiting: backlog.Waiting, FirstDue: backlog.FirstDue,
		Overdue: backlog.Overdue, Flash: cancelledFlash(r.URL.Query())}
	if c.cfg.Tenant == "" {
		groups, err := c.data.breakdown(ctx, "")
		if err != nil {
			c.fail(w, r, err)
			return
		}
		d.Tenants = scheduledTenants(tenantsOf(groups), f.Tenant, rows)
	}
	c.render(w, r, http.StatusOK, "scheduled", c.newPage(w, r, "scheduled", "Scheduled messages", d))
}

// scheduledTenants adds to tenants, for the filter, the tenant filtered
// on and those of the messages listed.
func scheduledTenants(tenants []string, filtered string, rows []outbox.ScheduledMessage) []string {
	more := []string{filtered}
	for _, m := range rows {
		more = append(more, m.TenantID)
	}
	return withTenants(tenants, more...)
}

// withTenants adds to tenants, for a tenant filter, each of more not empty
// and not among them yet, and sorts them.
func withTenants(tenants []string, more ...string) []string {
	seen := map[string]bool{}
	for _, t := range tenants {
		seen[t] = true
	}
	for _, t := range more {
		if t != "" && !seen[t] {
			seen[t] = true
			tenants = append(tenants, t)
		}
	}
	sort.Strings(tenants)
	return tenants
}

// scheduledCancel cancels the waiting messages scheduled under the form's
// key in its tenant (the console's tenant, when it has one); the form must
// confirm it. It answers 404 when nothing waits under the key and 409 when
// the key's messages were released for delivery already.
func (c *Console) scheduledCancel(w http.ResponseWriter, r *http.Request) {
	f, ok := c.filterParams(w, r, r.PostForm)
	if !ok {
		return
	}
	key := r.PostForm.Get("key")
	if key == "" || len(key) > outbox.MaxScheduleKeyLen {
		c.renderError(w, r, http.StatusBadRequest, "Cancel needs the key of the scheduled messages.")
		return
	}
	if r.PostForm.Get("confirm") != "yes" {
		c.renderError(w, r, http.StatusBadRequest, "A cancelled message is never delivered: tick the confirmation box next to Cancel.")
		return
	}
	n, err := c.data.cancelScheduled(r.Context(), f.Tenant, key)
	var verr *outbox.ValidationError
	switch {
	case errors.Is(err, outbox.ErrCancelTooLate):
		c.renderError(w, r, http.StatusConflict, fmt.Sprintf("Too late to cancel key %q: its messages were already released for delivery, "+
			"and are or will be delivered.", key))
		return
	case errors.Is(err, outbox.ErrNotScheduled):
		c.renderError(w, r, http.StatusNotFound, fmt.Sprintf("No scheduled message with key %q waits: none was scheduled under it, "+
			"or it was cancelled already.", key))
		return
	case errors.As(err, &verr):
		c.renderError(w, r, http.StatusBadRequest, "Bad cancel: "+err.Error())
		return
	case err != nil:
		c.fail(w, r, err)
		return
	}
	c.cfg.Logger.InfoContext(r.Context(), "console: cancelled scheduled messages", "key", key, "tenant", f.Tenant, "messages", n)
	q := url.Values{"done": {"cancelled"}, "n": {strconv.FormatInt(n, 10)}}
	if c.cfg.Tenant == "" {
		if t := r.PostForm.Get("back_tenant"); t != "" && tenant.Validate(t) == nil {
			q.Set("tenant", t)
		}
	}
	redirect(w, relBase(r.URL.Path)+"scheduled?"+q.Encode())
}

// cancelledFlash turns the outcome of a cancel into the message shown
// after the redirect; like flash, it builds the words, never takes them
// from the query.
func cancelledFlash(q url.Values) string {
	if q.Get("done") != "cancelled" {
		return ""
	}
	n, err := strconv.ParseInt(q.Get("n"), 10, 64)
	switch {
	case err != nil || n < 1:
		return ""
	case n == 1:
		return "Cancelled 1 scheduled message: it will not be delivered."
	}
	return fmt.Sprintf("Cancelled %d scheduled messages: they will not be delivered.", n)
}
