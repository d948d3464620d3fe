package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
)

// groupParkedData is the content of a group's parked-events page.
type groupParkedData struct {
	Group string
	// Tenant and Reason are the filter asked for.
	Tenant, Reason string
	Parked         []inbox.Parked
	Holds          []inbox.Hold
	Limit          int
	Flash          string
}

// groupParkedAggregateData is the content of a parked aggregate's page.
type groupParkedAggregateData struct {
	Group string
	Agg   *consumer.ParkedAggregate
	Limit int
}

// groupMembersData is the content of a group's members page.
type groupMembersData struct {
	Group   string
	Members []consumer.Member
}

// parkedReasons are the reasons the parked-events page filters by.
var parkedReasons = map[string]bool{"": true, inbox.ParkedHeld: true, inbox.ParkedWaiting: true, inbox.ParkedGap: true}

func (c *Console) groupParked(w http.ResponseWriter, r *http.Request) {
	g, ok := c.group(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	f := inbox.ParkedFilter{TenantID: q.Get("tenant"), Reason: q.Get("reason")}
	if !parkedReasons[f.Reason] {
		c.renderError(w, r, http.StatusBadRequest, fmt.Sprintf("No parked reason %q: held, waiting or gap.", f.Reason))
		return
	}
	parked, holds, err := c.data.groupParked(r.Context(), g, f, c.cfg.DeadLimit)
	if err != nil {
		c.failInbox(w, r, err)
		return
	}
	d := &groupParkedData{Group: g, Tenant: f.TenantID, Reason: f.Reason, Parked: parked, Holds: holds,
		Limit: c.cfg.DeadLimit, Flash: parkedFlash(q)}
	c.render(w, r, http.StatusOK, "parked", c.newPage(w, r, "consumers", "Parked events of "+g, d))
}

// parkedAggregateOf returns the aggregate a request names in its query or
// form: tenant, type and id.
func parkedAggregateOf(v url.Values) inbox.Aggregate {
	return inbox.Aggregate{TenantID: v.Get("tenant"), Type: v.Get("type"), ID: v.Get("id")}
}

// parkedNotFound answers 404 for agg of group: nothing of the console's
// tenant is parked or held there, or no longer.
func (c *Console) parkedNotFound(w http.ResponseWriter, r *http.Request, g string, agg inbox.Aggregate) {
	c.renderError(w, r, http.StatusNotFound, fmt.Sprintf("Nothing of %s %s is parked or held in %s: it may have been released or applied.",
		agg.Type, agg.ID, g))
}

func (c *Console) groupParkedAggregate(w http.ResponseWriter, r *http.Request) {
	g, ok := c.group(w, r)
	if !ok {
		return
	}
	agg := parkedAggregateOf(r.URL.Query())
	a, err := c.data.groupParkedAggregate(r.Context(), g, agg, c.cfg.DeadLimit)
	switch {
	case errors.Is(err, consumer.ErrNothingParked), errors.Is(err, inbox.ErrInvalidArgument):
		c.parkedNotFound(w, r, g, agg)
		return
	case err != nil:
		c.failInbox(w, r, err)
		return
	}
	d := &groupParkedAggregateData{Group: g, Agg: a, Limit: c.cfg.DeadLimit}
	c.render(w, r, http.StatusOK, "parkedaggregate", c.newPage(w, r, "consumers", "Parked "+agg.Type+" "+agg.ID, d))
}

// groupParkedRelease releases a parked aggregate from the message the form
// names, answering 404 when nothing of the console's tenant is parked or
// held there and 409 when the release is stale.
func (c *Console) groupParkedRelease(w http.ResponseWriter, r *http.Request) {
	g, ok := c.group(w, r)
	if !ok {
		return
	}
	agg, id := parkedAggregateOf(r.PostForm), r.PostForm.Get("message_id")
	if _, err := c.data.groupParkedAggregate(r.Context(), g, agg, 1); err != nil {
		if errors.Is(err, consumer.ErrNothingParked) || errors.Is(err, inbox.ErrInvalidArgument) {
			c.parkedNotFound(w, r, g, agg)
		} else {
			c.failInbox(w, r, err)
		}
		return
	}
	if r.PostForm.Get("confirm") != "yes" {
		c.renderError(w, r, http.StatusBadRequest, "Releasing gives up the message for good: tick the confirmation box on the aggregate's page.")
		return
	}
	err := c.data.releaseParked(r.Context(), g, agg, id)
	switch {
	case errors.Is(err, consumer.ErrNothingParked):
		c.parkedNotFound(w, r, g, agg)
		return
	case errors.Is(err, consumer.ErrStaleRelease):
		c.renderError(w, r, http.StatusConflict, "Nothing released: "+err.Error()+". Reload the aggregate's page.")
		return
	case err != nil:
		c.failInbox(w, r, err)
		return
	}
	c.cfg.Logger.InfoContext(r.Context(), "console: parked aggregate released", "group", g, "tenant_id", agg.TenantID,
		"aggregate_type", agg.Type, "aggregate_id", agg.ID, "message_id", id)
	// From consumers/{group}/parked/release back to consumers/{group}/parked.
	redirect(w, relBase(r.URL.Path)+"consumers/"+url.PathEscape(g)+"/parked?done=released")
}

// parkedFlash is the message after a release: built from the query, never
// taken from it.
func parkedFlash(q url.Values) string {
	if q.Get("done") == "released" {
		return "Released the aggregate: a running consumer of the group applies its parked events within about a second."
	}
	return ""
}

func (c *Console) groupMembers(w http.ResponseWriter, r *http.Request) {
	g, ok := c.group(w, r)
	if !ok {
		return
	}
	members, err := c.data.groupMembers(r.Context(), g)
	if err != nil {
		c.failInbox(w, r, err)
		return
	}
	d := &groupMembersData{Group: g, Members: members}
	c.render(w, r, http.StatusOK, "members", c.newPage(w, r, "consumers", "Members of "+g, d))
}

// failInbox answers 500 for an error of the inbox tables, logging it.
func (c *Console) failInbox(w http.ResponseWriter, r *http.Request, err error) {
	c.cfg.Logger.ErrorContext(r.Context(), "console: inbox error", "path", r.URL.Path, "err", err)
	c.renderError(w, r, http.StatusInternalServerError, "The consumer group's inbox tables could not be read or changed: "+err.Error())
}
