package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/deadfixture"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// TestConsumerDeadLettersThroughTheBinary: a consumer whose handler fails
// for good sends two events to its dead letters, on RabbitMQ and on the
// database bus (no AMQP_URL: the commands use the database bus); the
// bento binary lists them, shows one (payload hidden unless asked),
// replays it after the fix (a dry run first changes nothing) and the
// consumer applies it exactly once; discard asks first and then removes
// the other, which is never applied.
func TestConsumerDeadLettersThroughTheBinary(t *testing.T) {
	t.Parallel()
	for _, bus := range []string{"rabbitmq", "database"} {
		t.Run(bus, func(t *testing.T) {
			t.Parallel()
			db, dsn := testenv.Postgres(t)
			require.NoError(t, outbox.Migrate(context.Background(), db))
			var f *deadfixture.Fixture
			var env []string
			if bus == "rabbitmq" {
				ex := testenv.NewExchange(t)
				f = deadfixture.Start(t, db, ex, "cli")
				env = []string{"AMQP_URL=" + ex.URL, "BENTO_EXCHANGE=" + ex.Name}
			} else {
				f = deadfixture.StartDatabase(t, db, "cli")
				env = []string{"DATABASE_URL=" + dsn, "AMQP_URL="}
			}
			group, ids := f.Group, f.IDs
			list := func(args ...string) []deadLetterRow {
				t.Helper()
				r := bentoEnv(t, env, "", append([]string{"consumer", "dead", "list", "--group", group, "--json"}, args...)...)
				require.Equal(t, 0, r.code, r.stderr)
				var rows []deadLetterRow
				require.NoError(t, json.Unmarshal([]byte(r.stdout), &rows), r.stdout)
				return rows
			}
			testenv.Poll(30*time.Second, func() bool { return len(list()) >= 2 })
			rows := list()
			require.Len(t, rows, 2)
			assert.Equal(t, consumer.CausePermanent, rows[0].Cause)
			assert.Contains(t, rows[0].Error+rows[1].Error, "unknown sku kiwi")
			assert.Equal(t, 1, rows[0].Attempts)
			assert.NotNil(t, rows[0].DeadAt)
			assert.Len(t, list("--aggregate", "sku/fig"), 1)
			assert.Empty(t, list("--older-than", "1h"))

			r := bentoEnv(t, env, "", "consumer", "dead", "list", "--group", group)
			assert.Contains(t, r.stdout, "permanent")
			assert.Contains(t, r.stdout, ids[0])
			r = bentoEnv(t, env, "", "consumer", "dead", "show", ids[0], "--group", group)
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "unknown sku kiwi")
			assert.Contains(t, r.stdout, "payload: hidden")
			assert.NotContains(t, r.stdout, `"sku":"kiwi"`)
			r = bentoEnv(t, env, "", "consumer", "dead", "show", ids[0], "--group", group, "--show-payload")
			assert.Contains(t, r.stdout, `"sku":"kiwi"`)

			r = bentoEnv(t, env, "", "consumer", "dead", "replay", ids[0], "--group", group, "--dry-run")
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "would replay 1")
			assert.Len(t, list(), 2, "a dry run changes nothing")

			f.Fix()
			r = bentoEnv(t, env, "", "consumer", "dead", "replay", ids[0], "--group", group, "--yes")
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "replayed 1")
			countApplied := func() int64 { return f.Applied(t) }
			testenv.Poll(20*time.Second, func() bool { return countApplied() >= 1 })
			assert.Equal(t, int64(1), countApplied(), "the replayed event applied")

			r = bentoEnv(t, env, "n\n", "consumer", "dead", "discard", "--cause", "permanent", "--group", group)
			assert.Equal(t, 1, r.code, "declined at the prompt")
			assert.Len(t, list(), 1)
			r = bentoEnv(t, env, "", "consumer", "dead", "discard", "--cause", "permanent", "--group", group, "--yes")
			require.Equal(t, 0, r.code, r.stderr)
			assert.Contains(t, r.stdout, "discarded 1")
			assert.Empty(t, list())
			time.Sleep(300 * time.Millisecond)
			assert.Equal(t, int64(1), countApplied(), "applied once; the discarded one never")

			if bus == "rabbitmq" {
				r = bentoEnv(t, []string{"AMQP_URL="}, "", "consumer", "dead", "list", "--group", group)
				assert.Equal(t, 2, r.code)
				assert.Contains(t, r.stderr, "AMQP_URL")
			}
			r = bentoEnv(t, env, "", "consumer", "dead", "replay", "--group", group)
			assert.Equal(t, 2, r.code, "replay needs ids, a filter or --all")
		})
	}
}
