package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
)

// shortErrorLen is how many characters of the last error the list shows.
const shortErrorLen = 160

// deadData is the content of the dead-letter list.
type deadData struct {
	Tenant, Topic string
	// Tenants and Topics feed the filters (Tenants is nil when the console
	// is locked to one tenant).
	Tenants []string
	Topics  []topicCount
	Rows    []outbox.Message
	// Total counts the dead rows matching the filter; Rows holds at most
	// Config.DeadLimit of them.
	Total int64
	Shown int64
}

type topicCount struct {
	Topic string
	Count int64
}

// detailData is the content of a dead letter's page.
type detailData struct {
	Msg          outbox.Message
	ShowPayloads bool
	Payload      string
	Metadata     [][2]string
}

// filterParams reads the tenant and topic filters of the list (from the
// query on GET, from the form on POST).
func (c *Console) filterParams(w http.ResponseWriter, r *http.Request, v url.Values) (outbox.Filter, bool) {
	f := outbox.Filter{Tenant: c.cfg.Tenant, Topic: v.Get("topic")}
	if f.Tenant == "" {
		f.Tenant = v.Get("tenant")
		if f.Tenant != "" {
			if err := tenant.Validate(f.Tenant); err != nil {
				c.renderError(w, r, http.StatusBadRequest, "Bad tenant filter: "+err.Error())
				return f, false
			}
		}
	}
	if len(f.Topic) > 255 {
		c.renderError(w, r, http.StatusBadRequest, "Bad topic filter: longer than 255 characters.")
		return f, false
	}
	return f, true
}

func (c *Console) deadList(w http.ResponseWriter, r *http.Request) {
	f, ok := c.filterParams(w, r, r.URL.Query())
	if !ok {
		return
	}
	ctx := r.Context()
	rows, err := c.data.listDead(ctx, f, c.cfg.DeadLimit)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	total, err := c.data.countDead(ctx, f)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	groups, err := c.data.breakdown(ctx, f.Tenant)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := &deadData{Tenant: f.Tenant, Topic: f.Topic, Rows: rows, Total: total, Shown: int64(len(rows))}
	byTopic := map[string]int64{}
	for _, g := range groups {
		if g.Status == outbox.StatusDead {
			byTopic[g.Topic] += g.Count
		}
	}
	for topic, n := range byTopic {
		d.Topics = append(d.Topics, topicCount{Topic: topic, Count: n})
	}
	sort.Slice(d.Topics, func(i, j int) bool { return d.Topics[i].Topic < d.Topics[j].Topic })
	if c.cfg.Tenant == "" {
		all := groups
		if f.Tenant != "" {
			if all, err = c.data.breakdown(ctx, ""); err != nil {
				c.fail(w, r, err)
				return
			}
		}
		d.Tenants = tenantsOf(all)
	}
	p := c.newPage(w, r, "dead", "Dead letters", d)
	p.Flash = flash(r.URL.Query())
	c.render(w, r, http.StatusOK, "dead", p)
}

// findDead loads the dead letter id (of the console's tenant), answering
// 404 when there is none.
func (c *Console) findDead(w http.ResponseWriter, r *http.Request, id string) (*outbox.Message, bool) {
	rows, err := c.data.listDead(r.Context(), outbox.Filter{IDs: []string{id}}, 1)
	if err != nil {
		c.fail(w, r, err)
		return nil, false
	}
	if len(rows) == 0 {
		c.deadNotFound(w, r, id)
		return nil, false
	}
	return &rows[0], true
}

// deadNotFound answers 404 for the dead letter id: there is none of the
// console's tenant, or no longer.
func (c *Console) deadNotFound(w http.ResponseWriter, r *http.Request, id string) {
	c.renderError(w, r, http.StatusNotFound, fmt.Sprintf("No dead letter with id %q: it may have been requeued or discarded.", id))
}

func (c *Console) deadDetail(w http.ResponseWriter, r *http.Request) {
	m, ok := c.findDead(w, r, r.PathValue("id"))
	if !ok {
		return
	}
	d := &detailData{Msg: *m, ShowPayloads: c.cfg.ShowPayloads}
	if c.cfg.ShowPayloads {
		var buf bytes.Buffer
		if err := json.Indent(&buf, m.Payload, "", "  "); err == nil {
			d.Payload = buf.String()
		} else {
			d.Payload = string(m.Payload)
		}
		for k, v := range m.Metadata {
			d.Metadata = append(d.Metadata, [2]string{k, v})
		}
		sort.Slice(d.Metadata, func(i, j int) bool { return d.Metadata[i][0] < d.Metadata[j][0] })
	} else {
		// Never let the template see them.
		d.Msg.Payload, d.Msg.Metadata = nil, nil
	}
	p := c.newPage(w, r, "dead", "Dead letter "+m.ID, d)
	c.render(w, r, http.StatusOK, "detail", p)
}

// requeueOne moves one dead letter back to new, answering 404 when there
// is none to move.
func (c *Console) requeueOne(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	n, err := c.data.requeue(r.Context(), outbox.Filter{IDs: []string{id}})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if n == 0 {
		c.deadNotFound(w, r, id)
		return
	}
	c.cfg.Logger.InfoContext(r.Context(), "console: requeued dead letter", "id", id, "rows", n)
	c.afterAction(w, r, "requeued", n)
}

// discardOne deletes one dead letter; the form must confirm it. It answers
// 404 when there is none to delete.
func (c *Console) discardOne(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if r.PostForm.Get("confirm") != "yes" {
		c.renderError(w, r, http.StatusBadRequest, "Discarding deletes the event for good: tick the confirmation box on the dead letter's page.")
		return
	}
	n, err := c.data.discard(r.Context(), outbox.Filter{IDs: []string{id}})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if n == 0 {
		c.deadNotFound(w, r, id)
		return
	}
	c.cfg.Logger.InfoContext(r.Context(), "console: discarded dead letter", "id", id, "rows", n)
	c.afterAction(w, r, "discarded", n)
}

// requeueTopic moves every dead letter of one topic (and tenant, if the
// form names one) back to new.
func (c *Console) requeueTopic(w http.ResponseWriter, r *http.Request) {
	f, ok := c.filterParams(w, r, r.PostForm)
	if !ok {
		return
	}
	if f.Topic == "" {
		c.renderError(w, r, http.StatusBadRequest, "Requeue by topic needs a topic.")
		return
	}
	n, err := c.data.requeue(r.Context(), f)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.cfg.Logger.InfoContext(r.Context(), "console: requeued dead letters of a topic", "topic", f.Topic, "tenant", f.Tenant, "rows", n)
	c.afterAction(w, r, "requeued", n)
}

// afterAction redirects to the dead-letter list (POST-redirect-GET),
// keeping the list's filters, with the outcome in the query: the flash
// message is built from it, never taken from it, so a crafted link cannot
// put words on the page.
func (c *Console) afterAction(w http.ResponseWriter, r *http.Request, done string, n int64) {
	q := url.Values{"done": {done}, "n": {strconv.FormatInt(n, 10)}}
	if c.cfg.Tenant == "" {
		if t := r.PostForm.Get("back_tenant"); t != "" && tenant.Validate(t) == nil {
			q.Set("tenant", t)
		}
	}
	if t := r.PostForm.Get("back_topic"); t != "" && len(t) <= 255 {
		q.Set("topic", t)
	}
	redirect(w, relBase(r.URL.Path)+"dead?"+q.Encode())
}

// flash turns the outcome of an action into the message shown after the
// redirect.
func flash(q url.Values) string {
	done := q.Get("done")
	if done != "requeued" && done != "discarded" {
		return ""
	}
	n, err := strconv.ParseInt(q.Get("n"), 10, 64)
	if err != nil || n < 0 {
		return ""
	}
	switch {
	case n == 0:
		return "Nothing was " + done + ": the dead letter is gone or no longer dead."
	case n == 1 && done == "requeued":
		return "Requeued 1 dead letter: it is back in status new and will be published again."
	case n == 1:
		return "Discarded 1 dead letter."
	default:
		return fmt.Sprintf("%s %d dead letters.", strings.ToUpper(done[:1])+done[1:], n)
	}
}

// shortError returns the first line of a last error, cut to shortErrorLen
// characters.
func shortError(s *string) string {
	if s == nil {
		return ""
	}
	e := *s
	if i := strings.IndexByte(e, '\n'); i >= 0 {
		e = e[:i] + " …"
	}
	if utf8.RuneCountInString(e) > shortErrorLen {
		e = string([]rune(e)[:shortErrorLen-1]) + "…"
	}
	return e
}
