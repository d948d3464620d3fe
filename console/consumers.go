package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/rabbitmq"
)

// Consumers lets the console show and act on consumer groups' dead letters
// (package consumer), kept in the queues "<group>.dead" of RabbitMQ or of
// the database bus, and on the events they parked behind a dead letter or
// a version gap, and shows their members.
type Consumers struct {
	// AMQP is the broker, and the event exchange the groups are bound to:
	// a replay goes to the replayed group's own queues on it. It is
	// required unless DeadLetters is set.
	AMQP *rabbitmq.Config
	// DeadLetters is where the groups' dead letters are: set it to
	// consumer.DatabaseDeadLetters(db) for groups on the database bus
	// (package dbbus), whose replays move each dead letter back to its
	// group in one transaction. Defaults to
	// consumer.RabbitMQDeadLetters(AMQP).
	DeadLetters *consumer.DeadLetters
	// Groups are the consumer groups to show. It has no default: at least
	// one is required.
	Groups []string
	// Inspect holds, per group, the settings of the group's consumers that
	// its parked-events and members pages need (see consumer.InspectOpts):
	// Versions decides what Release gives up, so set it to the group's
	// Config.Versions. A group not in it gets consumer.InspectOpts'
	// defaults. These pages read the inbox tables in the store's database.
	// Defaults to none.
	Inspect map[string]*consumer.InspectOpts
}

// groupData is the content of the consumer groups page.
type groupData struct {
	Groups []groupCount
	Limit  int
}

type groupCount struct {
	Group string
	Count int
	Err   string
}

// groupDeadData is the content of a group's dead-letter list.
type groupDeadData struct {
	Group string
	Rows  []consumer.DeadLetter
	Limit int
	Flash string
}

// groupDetailData is the content of a consumer dead letter's page.
type groupDetailData struct {
	Group        string
	Dead         consumer.DeadLetter
	ShowPayloads bool
	Payload      string
	Headers      [][2]string
}

// group returns the group named in the path, answering 404 for one the
// console does not show.
func (c *Console) group(w http.ResponseWriter, r *http.Request) (string, bool) {
	g := r.PathValue("group")
	if c.cfg.Consumers == nil || !slices.Contains(c.cfg.Consumers.Groups, g) {
		c.renderError(w, r, http.StatusNotFound, fmt.Sprintf("No consumer group %q here.", g))
		return "", false
	}
	return g, true
}

func (c *Console) consumerGroups(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Consumers == nil {
		c.notFound(w, r)
		return
	}
	d := &groupData{Limit: c.cfg.DeadLimit}
	for _, g := range c.cfg.Consumers.Groups {
		dead, err := c.data.groupDead(r.Context(), g, consumer.DeadFilter{}, c.cfg.DeadLimit)
		gc := groupCount{Group: g, Count: len(dead)}
		if err != nil {
			gc.Err = err.Error()
		}
		d.Groups = append(d.Groups, gc)
	}
	c.render(w, r, http.StatusOK, "consumers", c.newPage(w, r, "consumers", "Consumer dead letters", d))
}

func (c *Console) groupDead(w http.ResponseWriter, r *http.Request) {
	g, ok := c.group(w, r)
	if !ok {
		return
	}
	dead, err := c.data.groupDead(r.Context(), g, consumer.DeadFilter{}, c.cfg.DeadLimit)
	if err != nil {
		c.failBroker(w, r, err)
		return
	}
	d := &groupDeadData{Group: g, Rows: dead, Limit: c.cfg.DeadLimit, Flash: consumerFlash(r.URL.Query())}
	c.render(w, r, http.StatusOK, "group", c.newPage(w, r, "consumers", "Dead letters of "+g, d))
}

// findGroupDead loads dead letter id of group, answering 404 when there is
// none.
func (c *Console) findGroupDead(w http.ResponseWriter, r *http.Request, g, id string) (*consumer.DeadLetter, bool) {
	dead, err := c.data.groupDead(r.Context(), g, consumer.DeadFilter{IDs: []string{id}}, 1)
	if err != nil {
		c.failBroker(w, r, err)
		return nil, false
	}
	if len(dead) == 0 {
		c.groupDeadNotFound(w, r, g, id)
		return nil, false
	}
	return &dead[0], true
}

// groupDeadNotFound answers 404 for the dead letter id of group: there is
// none of the console's tenant, or no longer.
func (c *Console) groupDeadNotFound(w http.ResponseWriter, r *http.Request, g, id string) {
	c.renderError(w, r, http.StatusNotFound, fmt.Sprintf("No dead letter %q in %s: it may have been replayed or discarded.", id, g))
}

func (c *Console) groupDeadDetail(w http.ResponseWriter, r *http.Request) {
	g, ok := c.group(w, r)
	if !ok {
		return
	}
	dl, ok := c.findGroupDead(w, r, g, r.PathValue("id"))
	if !ok {
		return
	}
	d := &groupDetailData{Group: g, Dead: *dl, ShowPayloads: c.cfg.ShowPayloads}
	if c.cfg.ShowPayloads {
		var buf bytes.Buffer
		if err := json.Indent(&buf, dl.Payload, "", "  "); err == nil {
			d.Payload = buf.String()
		} else {
			d.Payload = string(dl.Payload)
		}
		for k, v := range dl.Metadata {
			d.Headers = append(d.Headers, [2]string{k, v})
		}
		sort.Slice(d.Headers, func(i, j int) bool { return d.Headers[i][0] < d.Headers[j][0] })
	}
	// Never let the template see them unless shown.
	d.Dead.Payload, d.Dead.Metadata = nil, nil
	c.render(w, r, http.StatusOK, "groupdetail", c.newPage(w, r, "consumers", "Dead letter "+dl.MessageID, d))
}

// groupDeadAct replays or discards one dead letter of a group, answering
// 404 when there is none to act on.
func (c *Console) groupDeadAct(verb string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		g, ok := c.group(w, r)
		if !ok {
			return
		}
		id := r.PathValue("id")
		if verb == "discard" && r.PostForm.Get("confirm") != "yes" {
			c.renderError(w, r, http.StatusBadRequest, "Discarding deletes the message for good: tick the confirmation box on its page.")
			return
		}
		f := consumer.DeadFilter{IDs: []string{id}}
		var done []consumer.DeadLetter
		var err error
		if verb == "replay" {
			done, err = c.data.replayGroupDead(r.Context(), g, f)
		} else {
			done, err = c.data.discardGroupDead(r.Context(), g, f)
		}
		if err != nil {
			c.failBroker(w, r, err)
			return
		}
		if len(done) == 0 {
			c.groupDeadNotFound(w, r, g, id)
			return
		}
		past := map[string]string{"replay": "replayed", "discard": "discarded"}[verb]
		c.cfg.Logger.InfoContext(r.Context(), "console: consumer dead letter "+past, "group", g, "id", id, "count", len(done))
		q := url.Values{"done": {past}, "n": {fmt.Sprint(len(done))}}
		// From consumers/{group}/{id}/{verb} back to consumers/{group}.
		redirect(w, relBase(r.URL.Path)+"consumers/"+url.PathEscape(g)+"?"+q.Encode())
	}
}

// consumerFlash is the message after a replay or discard: built from the
// query, never taken from it.
func consumerFlash(q url.Values) string {
	n, err := strconv.Atoi(q.Get("n"))
	if err != nil || n < 1 {
		return ""
	}
	switch q.Get("done") {
	case "replayed":
		return fmt.Sprintf("Replayed %d dead letter: it is back in the group's processing; the inbox skips it if it was applied meanwhile.", n)
	case "discarded":
		return fmt.Sprintf("Discarded %d dead letter.", n)
	}
	return ""
}

// failBroker answers 502 for a broker error, logging it.
func (c *Console) failBroker(w http.ResponseWriter, r *http.Request, err error) {
	c.cfg.Logger.ErrorContext(r.Context(), "console: broker error", "path", r.URL.Path, "err", err)
	c.renderError(w, r, http.StatusBadGateway, "The dead-letter queue could not be read or changed: "+err.Error())
}
