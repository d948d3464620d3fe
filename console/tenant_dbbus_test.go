package console_test

import (
	"net/http"
	"net/url"
	"testing"

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

// TestTenantLockedConsoleOnTheDatabaseBus is the consumer dead-letter part
// of TestTenantLockedConsoleKeepsToItsTenant with the groups on the
// database bus, on PostgreSQL and SQLite: a console locked to tenant acme
// counts and lists acme's dead letter only, answers 404 to a page, replay
// or discard of globex's, and replays acme's own into the group; globex's
// dead letter stays in the dead-letter queue and never reaches the group.
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

		e := setup(t, db, &console.Config{Tenant: "acme", ShowPayloads: true,
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
	})
}
