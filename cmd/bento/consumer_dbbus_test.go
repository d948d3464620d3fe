package main

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// TestConsumerDeadLettersOnTheDatabaseBus runs bento consumer dead on a
// deployment with no broker, on PostgreSQL and on SQLite: with no
// AMQP_URL the commands use the database bus in DATABASE_URL. They list
// the group's two dead letters, show one, replay it to the group (its
// replay counted, its dead-letter headers gone) and discard the other;
// --bus rabbitmq without AMQP_URL, and a bad --bus, are usage errors.
func TestConsumerDeadLettersOnTheDatabaseBus(t *testing.T) {
	t.Parallel()
	onBusDatabases(t, func(t *testing.T, db *gorm.DB, dsn string) {
		ctx := t.Context()
		group := "billing"
		require.NoError(t, dbbus.Migrate(ctx, db))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, group, "sku.ordered"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, consumer.DeadLetterQueue(group), consumer.DeadLetterTopic(group)))
		bus, err := dbbus.New(db, &dbbus.Config{NoListen: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = bus.Close() })
		var ids []string
		for _, sku := range []string{"kiwi", "fig"} {
			m := message.NewMessage("dead-"+sku, []byte(`{"sku":"`+sku+`"}`))
			m.Metadata.Set(messaging.MetaEventType, "sku.ordered")
			m.Metadata.Set(messaging.MetaAggregateType, "sku")
			m.Metadata.Set(messaging.MetaAggregateID, sku)
			m.Metadata.Set(consumer.MetaDeadCause, consumer.CausePermanent)
			m.Metadata.Set(consumer.MetaDeadReason, "unknown sku "+sku)
			m.Metadata.Set(consumer.MetaDeadAttempts, "1")
			m.Metadata.Set(consumer.MetaDeadAt, time.Now().UTC().Format(time.RFC3339Nano))
			require.NoError(t, bus.Publish(consumer.DeadLetterTopic(group), m))
			ids = append(ids, m.UUID)
		}

		env := []string{"DATABASE_URL=" + dsn, "AMQP_URL="}
		list := func() []deadLetterRow {
			t.Helper()
			r := bentoEnv(t, env, "", "consumer", "dead", "list", "--group", group, "--json")
			require.Equal(t, 0, r.code, r.stderr)
			var rows []deadLetterRow
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &rows), r.stdout)
			return rows
		}
		rows := list()
		require.Len(t, rows, 2)
		assert.Equal(t, ids[0], rows[0].ID)
		assert.Equal(t, consumer.CausePermanent, rows[0].Cause)
		assert.Equal(t, "unknown sku kiwi", rows[0].Error)
		r := bentoEnv(t, env, "", "consumer", "dead", "show", ids[0], "--group", group, "--show-payload")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, `"sku":"kiwi"`)

		r = bentoEnv(t, env, "", "consumer", "dead", "replay", ids[0], "--group", group, "--yes")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "replayed 1")
		var back []*message.Message
		require.NoError(t, dbbus.Peek(ctx, db, group, 10, func(b dbbus.Browsed) bool {
			back = append(back, b.Message)
			return true
		}))
		require.Len(t, back, 1, "the replayed dead letter is not in the group's queue")
		assert.Equal(t, ids[0], back[0].UUID)
		assert.Equal(t, "1", back[0].Metadata.Get(consumer.MetaReplays))
		assert.Empty(t, back[0].Metadata.Get(consumer.MetaDeadCause))

		r = bentoEnv(t, env, "", "consumer", "dead", "discard", "--all", "--group", group, "--bus", "database", "--yes")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "discarded 1")
		assert.Empty(t, list())

		r = bentoEnv(t, env, "", "consumer", "dead", "list", "--group", group, "--bus", "rabbitmq")
		assert.Equal(t, 2, r.code)
		assert.Contains(t, r.stderr, "AMQP_URL is not set")
		r = bentoEnv(t, env, "", "consumer", "dead", "list", "--group", group, "--bus", "kafka")
		assert.Equal(t, 2, r.code)
		assert.Contains(t, r.stderr, "--bus")
	})
}

// TestConsoleOnTheEmbeddedDefault: bento console --group on the embedded
// default (a SQLite file opened by embedded.Open, no broker) shows the
// group's pages: the menu links to them, the group's dead letter on the
// database bus is listed and shown, and its parked events and members
// pages answer. Without --group there are no consumer pages.
func TestConsoleOnTheEmbeddedDefault(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "app.db")
	stack, err := embedded.Open(ctx, &embedded.Config{Path: path})
	require.NoError(t, err)
	t.Cleanup(func() { _ = stack.Close() })
	const group = "billing"
	require.NoError(t, dbbus.DeclareGroup(ctx, stack.DB, consumer.DeadLetterQueue(group), consumer.DeadLetterTopic(group)))
	m := message.NewMessage("dead-embedded-1", []byte(`{"sku":"kiwi"}`))
	m.Metadata.Set(messaging.MetaEventType, "sku.ordered")
	m.Metadata.Set(consumer.MetaDeadCause, consumer.CausePermanent)
	m.Metadata.Set(consumer.MetaDeadReason, "unknown sku kiwi")
	require.NoError(t, stack.Bus.Publish(consumer.DeadLetterTopic(group), m))

	get := func(base, p string) (int, string) {
		t.Helper()
		res, err := http.Get(base + p)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(body)
	}
	env := []string{"DATABASE_URL=sqlite:" + path, "AMQP_URL="}
	base, stop := startConsoleEnv(t, env, "--addr", "127.0.0.1:0", "--group", group)
	code, body := get(base, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `href="./consumers"`, "the overview's menu links to the consumer pages")
	code, body = get(base, "consumers/"+group)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-id="dead-embedded-1"`, "the group's dead letter on the database bus")
	code, body = get(base, "consumers/"+group+"/dead-embedded-1")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "unknown sku kiwi")
	for _, p := range []string{"consumers/" + group + "/parked", "consumers/" + group + "/members"} {
		code, body = get(base, p)
		assert.Equal(t, http.StatusOK, code, "%s: %s", p, body)
	}
	stop()

	base, stop = startConsoleEnv(t, env, "--addr", "127.0.0.1:0")
	defer stop()
	code, body = get(base, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, `href="./consumers"`, "no group named: no consumer pages")
	code, _ = get(base, "consumers")
	assert.Equal(t, http.StatusNotFound, code)
}

// onBusDatabases runs fn in parallel subtests on a PostgreSQL schema and
// on a SQLite file, with the DATABASE_URL that reaches each.
func onBusDatabases(t *testing.T, fn func(t *testing.T, db *gorm.DB, dsn string)) {
	t.Helper()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		db, dsn := testenv.Postgres(t)
		fn(t, db, dsn)
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "bus.db")
		db, err := embedded.OpenSQLite(path, nil)
		require.NoError(t, err)
		t.Cleanup(func() { closeAll(db) })
		fn(t, db, "sqlite:"+path)
	})
}
