package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

func TestPostgresClaimUsesReadyIndex(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	e := setup(t, db, nil)
	ctx := context.Background()

	// 20,000 sent rows of 2,000 aggregates and 100 ready ones, ids 26
	// characters like a ULID.
	const sent, ready = 20000, 100
	require.NoError(t, e.db.WithContext(ctx).Exec(`
		INSERT INTO outbox_events (id, topic, aggregate_type, aggregate_id, aggregate_version,
		                           payload, occurred_at, created_at, available_at, status, published_at)
		SELECT lpad(g::text, 26, '0'), 'order.paid', 'order', 'o-' || (g % 2000), g,
		       '{}', now(), now(), now(),
		       CASE WHEN g <= ? THEN 'sent' ELSE 'new' END,
		       CASE WHEN g <= ? THEN now() END
		FROM generate_series(1, ?) AS g`, sent, sent, sent+ready).Error)
	require.NoError(t, e.db.WithContext(ctx).Exec("ANALYZE outbox_events").Error)
	require.Equal(t, int64(ready), countRows(t, e.db, "status = ?", string(outbox.StatusNew)))

	rows, err := e.db.WithContext(ctx).Raw("EXPLAIN (FORMAT TEXT) "+outbox.PostgresClaimSQL(), outbox.PostgresClaimArgs(time.Now(), 100)).Rows()
	require.NoError(t, err)
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		lines = append(lines, line)
	}
	require.NoError(t, rows.Err())
	plan := strings.Join(lines, "\n")
	t.Logf("claim plan over %d sent and %d ready rows:\n%s", sent, ready, plan)

	assert.Contains(t, plan, "outbox_events_due", "the claim reads the partial index of due rows")
	assert.Contains(t, plan, "outbox_events_unsent_aggregate", "the per-aggregate check reads the partial unsent index")
	assert.NotContains(t, plan, "Seq Scan", "the claim does not scan the table")
}

func TestPostgresInsertNotifiesOnCommit(t *testing.T) {
	t.Parallel()
	db, dsn := testenv.Postgres(t)
	e := setup(t, db, nil)
	ctx := context.Background()

	var schema string
	require.NoError(t, db.Raw("SELECT current_schema()").Scan(&schema).Error)
	require.NotEmpty(t, schema)

	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, "LISTEN "+outbox.NotifyChannel)
	require.NoError(t, err)

	require.NoError(t, e.store.SetRelayIdle(ctx, "p1", true)) // a projector waits for commits

	rolledBack := begin(t, db)
	_, err = e.store.Add(ctx, rolledBack, "order.paid", orderPaid{OrderID: "o-1"}, &outbox.AddOpts{Tenant: "t-rollback"})
	require.NoError(t, err)
	require.NoError(t, rolledBack.Rollback().Error)

	e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-2"}, &outbox.AddOpts{Tenant: "t-commit"})

	// Other tests notify on the same channel from their own schemas.
	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var ours []string
	for len(ours) == 0 {
		n, err := conn.WaitForNotification(waitCtx)
		require.NoError(t, err, "no notification from schema %s", schema)
		require.Equal(t, outbox.NotifyChannel, n.Channel)
		if strings.HasPrefix(n.Payload, schema+":") {
			ours = append(ours, n.Payload)
		}
	}
	assert.True(t, strings.HasSuffix(ours[0], ":t-commit"), "first notification %q", ours[0])
	assert.Equal(t, schema+":t-commit", ours[0], "no notification for the rolled-back insert came first")
}
