package console

import (
	"fmt"
	"net/http"
	"net/url"
	"sort"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// unroutableData is the content of the unroutable page.
type unroutableData struct {
	Queue string
	Types []typeCount
	Rows  []*message.Message
	Limit int
	Total int
	Flash string
}

type typeCount struct {
	Type  string
	Count int
}

func (c *Console) unroutableList(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Unroutable == nil {
		c.notFound(w, r)
		return
	}
	parked, err := c.data.listUnroutable(r.Context(), rabbitmq.UnroutableFilter{}, unroutableScanLimit)
	if err != nil {
		c.failBroker(w, r, err)
		return
	}
	d := &unroutableData{Queue: rabbitmq.UnroutableQueue(c.cfg.Unroutable.ExchangeName()), Limit: c.cfg.DeadLimit, Total: len(parked)}
	byType := map[string]int{}
	for _, m := range parked {
		byType[m.Metadata.Get(messaging.MetaEventType)]++
	}
	for t, n := range byType {
		d.Types = append(d.Types, typeCount{Type: t, Count: n})
	}
	sort.Slice(d.Types, func(i, j int) bool { return d.Types[i].Type < d.Types[j].Type })
	d.Rows = parked[:min(len(parked), c.cfg.DeadLimit)]
	q := r.URL.Query()
	if q.Get("done") == "replayed" {
		d.Flash = fmt.Sprintf("Replayed %s event(s) of type %s; %s came back (no queue is bound for them yet).",
			q.Get("n"), q.Get("type"), q.Get("back"))
	}
	c.render(w, r, http.StatusOK, "unroutable", c.newPage(w, r, "unroutable", "Unroutable events", d))
}

// unroutableScanLimit bounds how many parked events the page reads.
const unroutableScanLimit = 10_000

// unroutableReplay republishes the parked events of one event type.
func (c *Console) unroutableReplay(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Unroutable == nil {
		c.notFound(w, r)
		return
	}
	t := r.PostForm.Get("event_type")
	if t == "" || len(t) > 255 {
		c.renderError(w, r, http.StatusBadRequest, "Replay needs an event type.")
		return
	}
	replayed, back, err := c.data.replayUnroutable(r.Context(), rabbitmq.UnroutableFilter{EventTypes: []string{t}})
	if err != nil {
		c.failBroker(w, r, err)
		return
	}
	c.cfg.Logger.InfoContext(r.Context(), "console: replayed unroutable events", "event_type", t, "replayed", len(replayed), "back", back)
	q := url.Values{"done": {"replayed"}, "type": {t}, "n": {fmt.Sprint(len(replayed))}, "back": {fmt.Sprint(back)}}
	redirect(w, relBase(r.URL.Path)+"unroutable?"+q.Encode())
}
