package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/console"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/rabbitmq"
)

// probe is what one route of a console locked to tenant acme is asked
// with the other tenants' ids, and what it must answer.
type probe struct {
	method, path string
	form         url.Values
	// status is the answer; for 303, location must be in the Location.
	status   int
	location string
	// hidden must not be in the body, shown must be (acme's own, so the
	// page is not merely empty).
	hidden, shown []string
}

// TestTenantLockedConsoleKeepsToItsTenant walks every route of a console
// locked to tenant acme, taken from the console's own route table, with
// the ids of tenant default's outbox dead letter and tenant globex's
// consumer dead letter and unroutable event (and globex's scheduled
// message and processes): the pages that show or act on one id answer
// 404, the lists and bulk actions hold acme's only, and afterwards the
// other tenants' dead letters, event, scheduled message and processes are
// all still there. A route the table here does not know fails the test, so a new
// page cannot be added without being walked.
func TestTenantLockedConsoleKeepsToItsTenant(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ex := testenv.NewExchange(t)
	amqpCfg := &rabbitmq.Config{URL: ex.URL, Exchange: ex.Name}
	group := "walk-" + ex.Name
	deadQueue := consumer.DeadLetterQueue(group)
	ex.Queues(group, deadQueue)
	// The group's queue (so a replay has somewhere to go) and its
	// dead-letter queue, which the test fills by publishing to it.
	require.NoError(t, rabbitmq.DeclareQueue(ctx, amqpCfg, group, "walk.live"))
	require.NoError(t, rabbitmq.DeclareQueue(ctx, amqpCfg, deadQueue, "walk.dead"))
	pub, err := rabbitmq.NewPublisher(ctx, amqpCfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	publish := func(id, eventType, tenantID, payload string) {
		m := message.NewMessage(id, []byte(payload))
		m.Metadata.Set(messaging.MetaEventType, eventType)
		m.Metadata.Set(messaging.MetaTenantID, tenantID)
		m.Metadata.Set(consumer.MetaDeadCause, consumer.CausePermanent)
		require.NoError(t, pub.Publish(eventType, m))
	}
	publish("dl-acme", "walk.dead", "acme", `{"iban":"acme-own"}`)
	publish("dl-globex", "walk.dead", "globex", `{"iban":"DE89370400440532013000"}`)
	publish("un-acme", "walk.nobody", "acme", `{}`)
	publish("un-globex", "walk.nobody", "globex", `{}`)
	unroutable := rabbitmq.UnroutableQueue(ex.Name)
	testenv.WaitFor(t, 10*time.Second, "the dead letters and unroutable events are in their queues", func() bool {
		return len(queueIDs(t, amqpCfg, deadQueue)) == 2 && len(queueIDs(t, amqpCfg, unroutable)) == 2
	})

	e := setup(t, testenv.SQLite(t), &console.Config{
		Tenant: "acme", ShowPayloads: true,
		Consumers: &console.Consumers{AMQP: amqpCfg, Groups: []string{group}}, Unroutable: amqpCfg,
		ProcessTables: []string{"checkouts"},
	})
	b, own := e.rows["b"].ID, e.rows["e"].ID // tenant default's dead letter; acme's
	// The group's parked events and holds: acme's order o1 and globex's
	// order o2 are each held behind their version 2, with version 3
	// parked; one instance of the group is live.
	require.NoError(t, inbox.Migrate(ctx, e.db))
	in, err := inbox.New(e.db, &inbox.Config{Consumer: group})
	require.NoError(t, err)
	for _, a := range []struct{ tenant, id string }{{"acme", "o1"}, {"globex", "o2"}} {
		for v, park := range []bool{false, true} {
			m, err := messaging.NewMessage(&outbox.Message{ID: fmt.Sprintf("pk-%s-%d", a.tenant, v+2), TenantID: a.tenant,
				Topic: "walk.live", AggregateType: "order", AggregateID: a.id, AggregateVersion: int64(v + 2), SchemaVersion: 1,
				Payload: []byte(`{"iban":"DE89370400440532013000"}`), OccurredAt: time.Now().UTC()})
			require.NoError(t, err)
			if park {
				require.NoError(t, in.Park(ctx, m, 0, inbox.ParkedHeld))
			} else {
				require.NoError(t, in.Hold(ctx, m))
			}
		}
	}
	require.NoError(t, e.db.Exec(`INSERT INTO consumer_members (consumer, member_id, partitions, expires_ms) VALUES (?, ?, 1, ?)`,
		group, "walk-member", time.Now().Add(time.Hour).UnixMilli()).Error)
	// A scheduled message of acme's and one of globex's under the same key.
	schedOwn := e.schedule(t, "acme", "walk.later", "walk-key", time.Hour).ID
	schedGlobex := e.schedule(t, "globex", "walk.later", "walk-key", time.Hour).ID
	// A process of acme's and one of globex's under the same key, and one
	// of globex's only.
	e.startCheckout(t, "acme", "walk-proc", time.Hour, false)
	e.startCheckout(t, "globex", "walk-proc", time.Hour, false)
	e.startCheckout(t, "globex", "walk-globex", time.Hour, false)
	parked := "/consumers/" + group + "/parked"
	tok := e.token(t, "/dead")
	post := func(form url.Values) url.Values {
		form.Set("csrf_token", tok)
		return form
	}
	probes := map[string]probe{
		"GET /{$}":       {method: "GET", path: "/?tenant=default", status: 200, shown: []string{`id="count-dead">1<`}, hidden: []string{`id="count-dead">2<`}},
		"GET /dead":      {method: "GET", path: "/dead?tenant=default", status: 200, shown: []string{own}, hidden: []string{b}},
		"GET /dead/{id}": {method: "GET", path: "/dead/" + b, status: 404, hidden: []string{"secret-b"}},
		"POST /dead/{id}/requeue": {method: "POST", path: "/dead/" + b + "/requeue", form: post(url.Values{}),
			status: 404},
		"POST /dead/{id}/discard": {method: "POST", path: "/dead/" + b + "/discard", form: post(url.Values{"confirm": {"yes"}}),
			status: 404},
		// Bulk: acme's dead letter of the topic moves, default's does not.
		"POST /dead/requeue": {method: "POST", path: "/dead/requeue", form: post(url.Values{"topic": {"order.paid"}, "tenant": {"default"}}),
			status: 303, location: "n=1"},
		"GET /scheduled": {method: "GET", path: "/scheduled?tenant=globex", status: 200, shown: []string{`data-id="` + schedOwn + `"`},
			hidden: []string{schedGlobex}},
		// acme's message under the key is cancelled, globex's is not.
		"POST /scheduled/cancel": {method: "POST", path: "/scheduled/cancel",
			form: post(url.Values{"tenant": {"globex"}, "key": {"walk-key"}, "confirm": {"yes"}}), status: 303, location: "n=1"},
		"GET /processes": {method: "GET", path: "/processes?tenant=globex", status: 200, shown: []string{`data-tenant="acme" data-key="walk-proc"`},
			hidden: []string{`data-tenant="globex"`, "walk-globex"}},
		// acme's process under the key is abandoned, globex's is not.
		"POST /processes/abandon": {method: "POST", path: "/processes/abandon",
			form: post(url.Values{"table": {"checkouts"}, "tenant": {"globex"}, "key": {"walk-proc"}, "confirm": {"yes"}}), status: 303,
			location: "done=abandoned"},
		"GET /consumers":         {method: "GET", path: "/consumers", status: 200, shown: []string{`<td class="num">1</td>`}, hidden: []string{`<td class="num">2</td>`}},
		"GET /consumers/{group}": {method: "GET", path: "/consumers/" + group, status: 200, shown: []string{`data-id="dl-acme"`}, hidden: []string{"dl-globex"}},
		"GET /consumers/{group}/{id}": {method: "GET", path: "/consumers/" + group + "/dl-globex", status: 404,
			hidden: []string{"DE89370400440532013000"}},
		"POST /consumers/{group}/{id}/replay": {method: "POST", path: "/consumers/" + group + "/dl-globex/replay",
			form: post(url.Values{}), status: 404},
		"POST /consumers/{group}/{id}/discard": {method: "POST", path: "/consumers/" + group + "/dl-globex/discard",
			form: post(url.Values{"confirm": {"yes"}}), status: 404},
		"GET /consumers/{group}/parked": {method: "GET", path: parked + "?tenant=globex", status: 200,
			shown: []string{`data-id="pk-acme-3"`, `data-id="pk-acme-2"`}, hidden: []string{"pk-globex"}},
		"GET /consumers/{group}/parked/aggregate": {method: "GET", path: parked + "/aggregate?tenant=globex&type=order&id=o2",
			status: 404, hidden: []string{"pk-globex"}},
		"POST /consumers/{group}/parked/release": {method: "POST", path: parked + "/release",
			form: post(url.Values{"tenant": {"globex"}, "type": {"order"}, "id": {"o2"}, "message_id": {"pk-globex-2"},
				"confirm": {"yes"}}), status: 404},
		// Instances, no tenant's data.
		"GET /consumers/{group}/members": {method: "GET", path: "/consumers/" + group + "/members", status: 200,
			shown: []string{`data-member="walk-member"`}},
		"GET /unroutable": {method: "GET", path: "/unroutable", status: 200, shown: []string{`data-id="un-acme"`}, hidden: []string{"un-globex"}},
		// Bulk: acme's event of the type is replayed (and comes back, no
		// queue being bound), globex's is not.
		"POST /unroutable/replay": {method: "POST", path: "/unroutable/replay", form: post(url.Values{"event_type": {"walk.nobody"}}),
			status: 303, location: "n=1"},
		// No tenant's data behind these two.
		"GET /static/": {method: "GET", path: "/static/console.css", status: 200},
		"/":            {method: "GET", path: "/no/such/page", status: 404},
	}

	routes := console.RoutePatterns(e.con)
	kept := 0
	for _, pattern := range routes {
		p, ok := probes[pattern]
		if !assert.True(t, ok, "route %q has no probe here: add what it must answer to another tenant", pattern) {
			continue
		}
		var res *http.Response
		var body string
		if p.method == http.MethodPost {
			res, body = e.post(t, p.path, p.form, nil)
		} else {
			res, body = e.get(t, p.path)
		}
		ok = assert.Equal(t, p.status, res.StatusCode, "%s (%s %s)", pattern, p.method, p.path)
		if p.location != "" {
			ok = assert.Contains(t, res.Header.Get("Location"), p.location, pattern) && ok
		}
		for _, s := range p.hidden {
			ok = assert.NotContains(t, body, s, "%s shows another tenant's %q", pattern, s) && ok
		}
		for _, s := range p.shown {
			ok = assert.Contains(t, body, s, "%s: acme's own", pattern) && ok
		}
		if ok {
			kept++
		}
		t.Logf("%-40s %s %-60s -> %d %s", pattern, p.method, p.path, res.StatusCode, map[bool]string{true: "kept out", false: "LEAKED"}[ok])
	}
	for pattern := range probes {
		assert.True(t, slices.Contains(routes, pattern), "probe for %q, which is no route of the console", pattern)
	}

	// Nothing of the other tenants was changed.
	intact := 0
	if assert.Equal(t, outbox.StatusDead, e.status(t, "b"), "default's outbox dead letter") {
		intact++
	}
	if assert.Contains(t, queueIDs(t, amqpCfg, deadQueue), "dl-globex", "globex's consumer dead letter") {
		intact++
	}
	if assert.Contains(t, queueIDs(t, amqpCfg, unroutable), "un-globex", "globex's unroutable event") {
		intact++
	}
	if holds, err := in.ListHolds(ctx, inbox.ParkedFilter{TenantID: "globex"}, 10); assert.NoError(t, err) && assert.Len(t, holds, 1, "globex's hold") {
		intact++
	}
	if assert.Equal(t, []string{schedGlobex}, e.waitingIDs(t), "globex's scheduled message") {
		intact++
	}
	if assert.ElementsMatch(t, []string{"globex/walk-proc", "globex/walk-globex"}, e.runningCheckouts(t), "globex's processes") {
		intact++
	}
	assert.Empty(t, queueIDs(t, amqpCfg, group), "nothing replayed into the group")
	t.Logf("%d of %d routes kept tenant acme's console to acme; %d of 6 of the other tenants' messages, holds and processes intact",
		kept, len(routes), intact)
}

// queueIDs lists the message ids in queue, leaving them there.
func queueIDs(t *testing.T, cfg *rabbitmq.Config, queue string) []string {
	t.Helper()
	var ids []string
	err := rabbitmq.BrowseQueue(t.Context(), cfg, queue, 1000, func(m *message.Message) (rabbitmq.Browse, error) {
		ids = append(ids, m.UUID)
		return rabbitmq.Browse{}, nil
	})
	require.NoError(t, err)
	return ids
}
