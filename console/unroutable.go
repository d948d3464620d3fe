package console

import (
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"time"

	"github.com/bentoevents/bento/messaging"
)

// unroutableData is the content of the unroutable page.
type unroutableData struct {
	Queue string
	// Database is true on the database bus, which keeps the events (and
	// says how long ago each was published), false on RabbitMQ.
	Database bool
	Types    []typeCount
	Rows     []unroutableRow
	Limit    int
	Total    int
	Flash    string
}

type typeCount struct {
	Type  string
	Count int
	// Oldest is the age of the type's oldest event ("" when unknown).
	Oldest string
}

// unroutableRow is one event of the list.
type unroutableRow struct {
	ID, EventType, Aggregate, OccurredAt string
	// Age is how long ago it was published ("" when unknown).
	Age string
}

func (c *Console) unroutableOn() bool { return c.cfg.Unroutable != nil || c.cfg.UnroutableDB != nil }

func (c *Console) unroutableList(w http.ResponseWriter, r *http.Request) {
	if !c.unroutableOn() {
		c.notFound(w, r)
		return
	}
	parked, err := c.data.listUnroutable(r.Context(), nil, unroutableScanLimit)
	if err != nil {
		c.failBroker(w, r, err)
		return
	}
	d := &unroutableData{Queue: c.data.unroutableQueue(), Database: c.cfg.UnroutableDB != nil, Limit: c.cfg.DeadLimit, Total: len(parked)}
	byType := map[string]*typeCount{}
	oldest := map[string]time.Duration{}
	for _, k := range parked {
		t := k.Msg.Metadata.Get(messaging.MetaEventType)
		tc := byType[t]
		if tc == nil {
			tc = &typeCount{Type: t}
			byType[t] = tc
		}
		tc.Count++
		if k.HasAge && k.Age >= oldest[t] {
			oldest[t] = k.Age
			tc.Oldest = fmtAge(k.Age)
		}
	}
	for _, tc := range byType {
		d.Types = append(d.Types, *tc)
	}
	sort.Slice(d.Types, func(i, j int) bool { return d.Types[i].Type < d.Types[j].Type })
	for _, k := range parked[:min(len(parked), c.cfg.DeadLimit)] {
		md := k.Msg.Metadata
		row := unroutableRow{ID: k.Msg.UUID, EventType: md.Get(messaging.MetaEventType), OccurredAt: md.Get(messaging.MetaOccurredAt)}
		if md.Get(messaging.MetaAggregateID) != "" {
			row.Aggregate = md.Get(messaging.MetaAggregateType) + "/" + md.Get(messaging.MetaAggregateID)
		}
		if k.HasAge {
			row.Age = fmtAge(k.Age)
		}
		d.Rows = append(d.Rows, row)
	}
	q := r.URL.Query()
	if q.Get("done") == "replayed" {
		d.Flash = fmt.Sprintf("Replayed %s event(s) of type %s; %s came back (no queue is bound for them yet).",
			q.Get("n"), q.Get("type"), q.Get("back"))
		if d.Database {
			d.Flash = fmt.Sprintf("Replayed %s event(s) of type %s; %s stay kept (no group is bound to their topic yet).",
				q.Get("n"), q.Get("type"), q.Get("back"))
		}
	}
	c.render(w, r, http.StatusOK, "unroutable", c.newPage(w, r, "unroutable", "Unroutable events", d))
}

// unroutableScanLimit bounds how many parked events the page reads.
const unroutableScanLimit = 10_000

// unroutableReplay republishes the parked events of one event type.
func (c *Console) unroutableReplay(w http.ResponseWriter, r *http.Request) {
	if !c.unroutableOn() {
		c.notFound(w, r)
		return
	}
	t := r.PostForm.Get("event_type")
	if t == "" || len(t) > 255 {
		c.renderError(w, r, http.StatusBadRequest, "Replay needs an event type.")
		return
	}
	replayed, back, err := c.data.replayUnroutable(r.Context(), []string{t})
	if err != nil {
		c.failBroker(w, r, err)
		return
	}
	c.cfg.Logger.InfoContext(r.Context(), "console: replayed unroutable events", "event_type", t, "replayed", replayed, "back", back)
	q := url.Values{"done": {"replayed"}, "type": {t}, "n": {fmt.Sprint(replayed)}, "back": {fmt.Sprint(back)}}
	redirect(w, relBase(r.URL.Path)+"unroutable?"+q.Encode())
}
