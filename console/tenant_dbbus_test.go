package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/console"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// TestTenantLockedConsoleOnTheDatabaseBus is the consumer dead-letter and
// unroutable parts of TestTenantLockedConsoleKeepsToItsTenant with the
// groups on the database bus, on PostgreSQL and SQLite: a console locked
// to tenant acme counts and lists acme's dead letter only, answers 404 to
// a page, replay or discard of globex's, and replays acme's own into the
// group; globex's dead letter stays in the dead-letter queue and never
// reaches the group. Its unroutable page lists acme's kept event only,
// and a replay of their common event type delivers acme's alone: globex's
// stays kept.
func TestTenantLockedConsoleOnTheDatabaseBus(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := t.Context()
		group := "walk"
		require.NoError(t, dbbus.Migrate(ctx, db))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, group, "walk.live"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, consumer.DeadLetterQueue(group), consumer.DeadLetterTopic(group)))
		bus, err := dbbus.New(db, &dbbus.Config{NoListen: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = bus.Close() })
		for _, d := range []struct{ id, tenant, payload string }{
			{"dl-acme", "acme", `{"iban":"acme-own"}`},
			{"dl-globex", "globex", `{"iban":"DE89370400440532013000"}`},
		} {
			m := message.NewMessage(d.id, []byte(d.payload))
			m.Metadata.Set(messaging.MetaEventType, "walk.live")
			m.Metadata.Set(messaging.MetaTenantID, d.tenant)
			m.Metadata.Set(consumer.MetaDeadCause, consumer.CausePermanent)
			require.NoError(t, bus.Publish(consumer.DeadLetterTopic(group), m))
		}

		// Two stock.moved events no group is bound to yet, one per tenant.
		for _, k := range []struct{ id, tenant string }{{"lost-acme", "acme"}, {"lost-globex", "globex"}} {
			m := message.NewMessage(k.id, []byte(`{}`))
			m.Metadata.Set(messaging.MetaEventType, "stock.moved")
			m.Metadata.Set(messaging.MetaTenantID, k.tenant)
			require.NoError(t, bus.Publish("stock.moved", m))
		}
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "stock", "stock.*"))

		e := setup(t, db, &console.Config{Tenant: "acme", ShowPayloads: true, UnroutableDB: db,
			Consumers: &console.Consumers{DeadLetters: consumer.DatabaseDeadLetters(db), Groups: []string{group}}})
		tok := e.token(t, "/dead")
		post := func(form url.Values) url.Values {
			form.Set("csrf_token", tok)
			return form
		}
		for _, p := range []probe{
			{method: "GET", path: "/consumers", status: 200, shown: []string{`<td class="num">1</td>`}, hidden: []string{`<td class="num">2</td>`}},
			{method: "GET", path: "/consumers/" + group, status: 200, shown: []string{`data-id="dl-acme"`}, hidden: []string{"dl-globex"}},
			{method: "GET", path: "/consumers/" + group + "/dl-globex", status: 404, hidden: []string{"DE89370400440532013000"}},
			{method: "GET", path: "/consumers/" + group + "/dl-acme", status: 200, shown: []string{"acme-own"}},
			{method: "POST", path: "/consumers/" + group + "/dl-globex/replay", form: post(url.Values{}), status: 404},
			{method: "POST", path: "/consumers/" + group + "/dl-globex/discard", form: post(url.Values{"confirm": {"yes"}}), status: 404},
			{method: "POST", path: "/consumers/" + group + "/dl-acme/replay", form: post(url.Values{}), status: 303, location: "n=1"},
			{method: "GET", path: "/unroutable", status: 200, shown: []string{`data-id="lost-acme"`, `id="unroutable-total">1<`}, hidden: []string{"lost-globex"}},
			{method: "POST", path: "/unroutable/replay", form: post(url.Values{"event_type": {"stock.moved"}}), status: 303, location: "n=1"},
		} {
			var res *http.Response
			var body string
			if p.method == http.MethodPost {
				res, body = e.post(t, p.path, p.form, nil)
			} else {
				res, body = e.get(t, p.path)
			}
			assert.Equal(t, p.status, res.StatusCode, "%s %s", p.method, p.path)
			if p.location != "" {
				assert.Contains(t, res.Header.Get("Location"), p.location, p.path)
			}
			for _, s := range p.hidden {
				assert.NotContains(t, body, s, "%s shows another tenant's %q", p.path, s)
			}
			for _, s := range p.shown {
				assert.Contains(t, body, s, "%s: acme's own", p.path)
			}
		}

		ids := func(g string) []string {
			var out []string
			require.NoError(t, dbbus.Peek(ctx, db, g, 100, func(b dbbus.Browsed) bool {
				out = append(out, b.Message.UUID)
				return true
			}))
			return out
		}
		assert.Equal(t, []string{"dl-globex"}, ids(consumer.DeadLetterQueue(group)), "globex's dead letter left its queue")
		assert.Equal(t, []string{"dl-acme"}, ids(group), "only acme's replayed dead letter is in the group")
		assert.Equal(t, []string{"lost-globex"}, ids(dbbus.UnroutableGroup), "globex's unroutable event left the unroutable group")
		assert.Equal(t, []string{"lost-acme"}, ids("stock"), "only acme's unroutable event is delivered")
	})
}

// TestUnroutablePageOnTheDatabaseBus: on the database bus, the unroutable
// page lists the events kept because no group was bound to their topic,
// by event type with their count and the oldest one's age; replaying a
// type while still no group is bound keeps them and says so; once two
// groups are bound, the replay delivers each event to both, once, and
// the page is empty. On PostgreSQL and SQLite.
func TestUnroutablePageOnTheDatabaseBus(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := t.Context()
		require.NoError(t, dbbus.Migrate(ctx, db))
		bus, err := dbbus.New(db, &dbbus.Config{NoListen: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = bus.Close() })
		for _, id := range []string{"late-1", "late-2"} {
			m := message.NewMessage(id, []byte(`{}`))
			m.Metadata.Set(messaging.MetaEventType, "late.event")
			m.Metadata.Set(messaging.MetaAggregateType, "order")
			m.Metadata.Set(messaging.MetaAggregateID, id)
			require.NoError(t, bus.Publish("late.event", m))
		}
		aged := any(time.Now().Add(-2 * time.Hour))
		if db.Dialector.Name() == "sqlite" {
			aged = time.Now().Add(-2 * time.Hour).UTC().Format("2006-01-02 15:04:05")
		}
		require.NoError(t, db.Exec(`UPDATE dbbus_messages SET created_at = ? WHERE id = 'late-1'`, aged).Error)

		e := setup(t, db, &console.Config{UnroutableDB: db})
		res, body := e.get(t, "/unroutable")
		require.Equal(t, http.StatusOK, res.StatusCode)
		assert.Contains(t, body, `unroutable" aria-current="page"`, "the nav links the page")
		assert.Contains(t, body, `id="unroutable-total">2<`)
		assert.Contains(t, body, dbbus.UnroutableGroup)
		assert.Contains(t, table(body, "unroutable-by-type"), `data-type="late.event"`)
		assert.Contains(t, table(body, "unroutable-by-type"), `<td class="num">2</td>`)
		assert.Regexp(t, `data-oldest="(1h 5\dm|2h 0\dm)"`, table(body, "unroutable-by-type"), "the oldest event's age")
		assert.Contains(t, table(body, "unroutable-events"), `data-id="late-1"`)
		assert.Contains(t, table(body, "unroutable-events"), "order/late-2")

		tok := e.token(t, "/unroutable")
		replay := func() string {
			res, _ := e.post(t, "/unroutable/replay", url.Values{"csrf_token": {tok}, "event_type": {"late.event"}}, nil)
			require.Equal(t, http.StatusSeeOther, res.StatusCode)
			_, body := e.follow(t, res)
			return body
		}
		body = replay()
		assert.Contains(t, byID(body, "flash"), "Replayed 0 event(s) of type late.event; 2 stay kept")
		assert.Contains(t, body, `id="unroutable-total">2<`)

		require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing", "late.*"))
		require.NoError(t, dbbus.DeclarePartitions(ctx, db, "shipping", 2, "late.#"))
		body = replay()
		assert.Contains(t, byID(body, "flash"), "Replayed 2 event(s) of type late.event; 0 stay kept")
		assert.Contains(t, body, `id="unroutable-empty"`)
		assert.Equal(t, 2, depthOf(t, db, "billing"))
		assert.Equal(t, 2, depthOf(t, db, messaging.PartitionQueue("shipping", 0))+depthOf(t, db, messaging.PartitionQueue("shipping", 1)))
		assert.Zero(t, depthOf(t, db, dbbus.UnroutableGroup))
	})
}

// depthOf is dbbus.Depth, failing the test on error.
func depthOf(t *testing.T, db *gorm.DB, queue string) int {
	t.Helper()
	n, err := dbbus.Depth(t.Context(), db, queue)
	require.NoError(t, err)
	return n
}

// table returns the HTML of the table whose id is id ("" when absent).
func table(body, id string) string {
	i := strings.Index(body, `id="`+id+`"`)
	if i < 0 {
		return ""
	}
	body = body[i:]
	if j := strings.Index(body, "</table>"); j >= 0 {
		body = body[:j]
	}
	return body
}
