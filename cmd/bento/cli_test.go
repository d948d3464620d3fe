package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/fakeclock"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/partition"
)

// binary is the bento executable, built once for the package's tests.
var binary string

func TestMain(m *testing.M) { os.Exit(testenv.RunWithBinary(m, "bento", &binary)) }

// result is what one run of the binary did.
type result struct {
	code           int
	stdout, stderr string
}

// bento runs the binary with DATABASE_URL=dsn ("" leaves it unset), stdin
// as its standard input, and args.
func bento(t *testing.T, dsn, stdin string, args ...string) result {
	t.Helper()
	return bentoEnv(t, []string{"DATABASE_URL=" + dsn}, stdin, args...)
}

// bentoEnv runs the binary with env added to the test's environment.
func bentoEnv(t *testing.T, env []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	t.Logf("bento %s -> %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out.String(), errb.String())
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// env is a migrated PostgreSQL schema with an outbox store whose clock the
// test moves.
type env struct {
	db    *gorm.DB
	dsn   string
	store *outbox.Store
	clock *testenv.Clock
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db, dsn := testenv.Postgres(t)
	ctx := context.Background()
	require.NoError(t, outbox.Migrate(ctx, db))
	require.NoError(t, inbox.Migrate(ctx, db))
	require.NoError(t, idempotency.Migrate(ctx, db))
	clock := testenv.NewClock(time.Now().UTC())
	st, err := outbox.NewStore(db, &outbox.Config{Clock: clock, Test: outbox.TestConfig{Clock: clock}})
	require.NoError(t, err)
	return &env{db: db, dsn: dsn, store: st, clock: clock}
}

// event describes a row to seed and where to take it.
type event struct {
	tenant, topic, aggType, aggID string
	status                        outbox.Status
}

// seed writes each event and takes it to its status: sent (confirmed now),
// failed or dead (with an error naming the topic). It returns the ids in
// order.
func (e *env) seed(t *testing.T, events ...event) []string {
	t.Helper()
	ctx := context.Background()
	ids := make([]string, len(events))
	versions := map[[3]string]int64{}
	for i, ev := range events {
		var version int64
		if ev.aggID != "" {
			k := [3]string{ev.tenant, ev.aggType, ev.aggID}
			versions[k]++
			version = versions[k]
		}
		tx := e.db.Begin()
		m, err := e.store.Add(ctx, tx, ev.topic, map[string]any{"n": i}, &outbox.AddOpts{
			Tenant: ev.tenant, AggregateType: ev.aggType, AggregateID: ev.aggID, AggregateVersion: version,
		})
		require.NoError(t, err)
		require.NoError(t, tx.Commit().Error)
		ids[i] = m.ID
		if ev.status == outbox.StatusNew {
			continue
		}
		// Claim everything due, keep the new row and put the rest back.
		claimed, err := e.store.Claim(ctx, outbox.ClaimOpts{Worker: "seed", Limit: 1000, Lease: time.Minute})
		require.NoError(t, err)
		var others []string
		found := false
		for _, c := range claimed {
			if c.ID == m.ID {
				found = true
			} else {
				others = append(others, c.ID)
			}
		}
		require.True(t, found, "seed claims what it just added (seed heads of aggregates only)")
		if len(others) > 0 {
			_, err = e.store.Release(ctx, "seed", others)
			require.NoError(t, err)
		}
		switch ev.status {
		case outbox.StatusSent:
			_, err = e.store.MarkSent(ctx, "seed", []string{m.ID})
		case outbox.StatusFailed, outbox.StatusDead:
			_, err = e.store.MarkFailed(ctx, "seed", outbox.Failure{
				ID: m.ID, Err: errors.New("broker refused " + ev.topic), RetryAfter: time.Hour,
				Dead: ev.status == outbox.StatusDead,
			})
		}
		require.NoError(t, err)
	}
	return ids
}

// statusOf returns the status of each id ("" for a row that is gone).
func (e *env) statusOf(t *testing.T, ids ...string) []outbox.Status {
	t.Helper()
	out := make([]outbox.Status, len(ids))
	for i, id := range ids {
		var rows []outbox.Message
		require.NoError(t, e.db.Where("id = ?", id).Find(&rows).Error)
		if len(rows) == 1 {
			out[i] = rows[0].Status
		}
	}
	return out
}

func TestStatsMatchesTheTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seed(t,
		event{tenant: "default", topic: "order.placed", status: outbox.StatusNew},
		event{tenant: "default", topic: "order.placed", status: outbox.StatusSent},
		event{tenant: "default", topic: "order.paid", status: outbox.StatusSent},
		event{tenant: "default", topic: "order.paid", status: outbox.StatusFailed},
		event{tenant: "default", topic: "order.paid", status: outbox.StatusDead},
		event{tenant: "acme", topic: "order.paid", status: outbox.StatusNew},
		event{tenant: "acme", topic: "order.paid", status: outbox.StatusNew},
	)
	require.NoError(t, e.store.SetRelayIdle(context.Background(), "relay-1", false)) // a busy projector
	r := bento(t, e.dsn, "", "stats", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var rep statsReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep))

	// What the table says, counted independently.
	var rows []struct {
		TenantID string
		Status   outbox.Status
		N        int64
	}
	require.NoError(t, e.db.Raw(`SELECT tenant_id, status, count(*) AS n FROM outbox_events GROUP BY tenant_id, status`).Scan(&rows).Error)
	want := map[string]map[outbox.Status]int64{}
	for _, row := range rows {
		if want[row.TenantID] == nil {
			want[row.TenantID] = map[outbox.Status]int64{}
		}
		want[row.TenantID][row.Status] = row.N
	}
	require.Len(t, rep.Tenants, len(want))
	for _, ts := range rep.Tenants {
		for _, s := range outbox.UnsentStatuses {
			assert.Equal(t, want[ts.Tenant][s], ts.Counts[s], "%s %s", ts.Tenant, s)
		}
		_, counted := ts.Counts[outbox.StatusSent]
		assert.False(t, counted, "sent rows are not counted")
		var oldest time.Time
		require.NoError(t, e.db.Raw(`SELECT min(created_at) FROM outbox_events WHERE tenant_id = ? AND status IN ('new','publishing','failed')`,
			ts.Tenant).Scan(&oldest).Error)
		require.NotNil(t, ts.OldestPendingAt, ts.Tenant)
		assert.WithinDuration(t, oldest, *ts.OldestPendingAt, time.Millisecond, ts.Tenant)
		assert.Greater(t, ts.OldestPendingAgeSeconds, 0.0, ts.Tenant)
		assert.Less(t, ts.OldestPendingAgeSeconds, 60.0, ts.Tenant)
	}
	byName := map[string]tenantStats{}
	for _, ts := range rep.Tenants {
		byName[ts.Tenant] = ts
	}
	assert.Equal(t, int64(2), byName["default"].Pending, "new + failed")
	assert.Equal(t, int64(1), byName["default"].Dead)
	assert.Equal(t, int64(2), byName["default"].PublishedLastMinute)
	assert.Equal(t, int64(2), byName["default"].FailedLastMinute, "the failed and the dead row failed just now")
	assert.Equal(t, int64(2), byName["acme"].Pending)
	assert.Zero(t, byName["acme"].PublishedLastMinute)
	require.Len(t, rep.Projectors, 1)
	assert.Equal(t, "relay-1", rep.Projectors[0].WorkerID)
	assert.Equal(t, "busy", rep.Projectors[0].State)

	// The table for people: a header and one aligned line per tenant.
	r = bento(t, e.dsn, "", "stats")
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	require.Len(t, lines, 6, r.stdout)
	assert.Equal(t, []string{"PROJECTOR", "STATE", "SINCE"}, strings.Fields(lines[4]))
	assert.Equal(t, []string{"relay-1", "busy"}, strings.Fields(lines[5])[:2])
	lines = lines[:3]
	assert.Equal(t, []string{"TENANT", "NEW", "PUBLISHING", "FAILED", "DEAD", "OLDEST", "PENDING", "PUBLISHED/MIN", "FAILED/MIN"},
		strings.Fields(lines[0]), "sent rows are not counted")
	assert.Equal(t, []string{"acme", "2", "0", "0", "0"}, strings.Fields(lines[1])[:5])
	assert.Equal(t, []string{"default", "1", "0", "1", "1"}, strings.Fields(lines[2])[:5])
	assert.Equal(t, len(lines[0]), len(lines[1]), "columns are aligned")
	assert.Equal(t, len(lines[0]), len(lines[2]), "columns are aligned")

	r = bento(t, e.dsn, "", "stats", "--tenant", "acme", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep))
	require.Len(t, rep.Tenants, 1)
	assert.Equal(t, "acme", rep.Tenants[0].Tenant)
}

func TestDeadRequeueMovesExactlyTheFilteredRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := e.seed(t,
		event{topic: "order.paid", aggType: "order", aggID: "a", status: outbox.StatusDead},
		event{topic: "order.paid", aggType: "order", aggID: "b", status: outbox.StatusDead},
		event{topic: "order.placed", aggType: "cart", aggID: "c", status: outbox.StatusDead},
		event{topic: "order.paid", aggType: "order", aggID: "d", status: outbox.StatusFailed},
		event{topic: "order.paid", aggType: "order", aggID: "e", status: outbox.StatusSent},
	)
	dead := outbox.StatusDead
	before := []outbox.Status{dead, dead, dead, outbox.StatusFailed, outbox.StatusSent}
	require.Equal(t, before, e.statusOf(t, ids...))

	r := bento(t, e.dsn, "", "dead", "list", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var listed []deadRow
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &listed))
	require.Len(t, listed, 3)
	assert.Equal(t, ids[:3], []string{listed[0].ID, listed[1].ID, listed[2].ID})
	assert.Equal(t, "broker refused order.placed", listed[2].LastError)

	r = bento(t, e.dsn, "", "dead", "list", "--topic", "order.placed")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, ids[2])
	assert.NotContains(t, r.stdout, ids[0])
	assert.Contains(t, r.stdout, "broker refused order.placed")

	r = bento(t, e.dsn, "", "dead", "requeue", "--topic", "order.paid", "--dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "would requeue 2 dead events with topic order.paid")
	assert.Equal(t, before, e.statusOf(t, ids...), "a dry run changes nothing")

	r = bento(t, e.dsn, "n\n", "dead", "requeue", "--topic", "order.paid")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "requeue 2 dead events with topic order.paid? [y/N]")
	assert.Contains(t, r.stderr, "not confirmed")
	assert.Equal(t, before, e.statusOf(t, ids...), "a declined requeue changes nothing")

	r = bento(t, e.dsn, "", "dead", "requeue", "--topic", "order.paid")
	assert.Equal(t, 1, r.code, "no answer on stdin is no")
	assert.Equal(t, before, e.statusOf(t, ids...))

	r = bento(t, e.dsn, "", "dead", "requeue", "--topic", "order.paid", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "requeued 2 dead events with topic order.paid")
	assert.Equal(t, []outbox.Status{outbox.StatusNew, outbox.StatusNew, dead, outbox.StatusFailed, outbox.StatusSent},
		e.statusOf(t, ids...), "only the dead order.paid rows move")

	r = bento(t, e.dsn, "y\n", "dead", "requeue", ids[2])
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "requeued 1 dead event with id "+ids[2])
	assert.Equal(t, outbox.StatusNew, e.statusOf(t, ids[2])[0])

	r = bento(t, e.dsn, "", "dead", "requeue", "--all", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "no dead events: nothing to requeue")
}

func TestDeadRequeueByAggregateAndDiscard(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := e.seed(t,
		event{topic: "order.paid", aggType: "order", aggID: "a", status: outbox.StatusDead},
		event{topic: "order.paid", aggType: "order", aggID: "b", status: outbox.StatusDead},
		event{topic: "cart.closed", aggType: "cart", aggID: "c", status: outbox.StatusDead},
	)
	r := bento(t, e.dsn, "", "dead", "requeue", "--aggregate", "order/b", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, []outbox.Status{outbox.StatusDead, outbox.StatusNew, outbox.StatusDead}, e.statusOf(t, ids...))

	r = bento(t, e.dsn, "", "dead", "show", ids[2])
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, `payload: {"n": 2}`)
	assert.Contains(t, r.stdout, "cart/c@1")

	r = bento(t, e.dsn, "", "dead", "discard", "--aggregate", "cart", "--dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "would discard 1 dead event with aggregate cart")
	assert.Equal(t, outbox.StatusDead, e.statusOf(t, ids[2])[0])

	r = bento(t, e.dsn, "yes\n", "dead", "discard", "--aggregate", "cart")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stderr, "They are deleted for good.")
	assert.Equal(t, []outbox.Status{outbox.StatusDead, outbox.StatusNew, ""}, e.statusOf(t, ids...))

	r = bento(t, e.dsn, "", "dead", "show", ids[2])
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "no outbox event "+ids[2])
}

func TestPurgeRemovesOnlyWhatItSays(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	now := e.clock.Now()
	e.clock.Set(now.Add(-10 * 24 * time.Hour))
	old := e.seed(t,
		event{topic: "order.paid", status: outbox.StatusSent},
		event{topic: "order.paid", status: outbox.StatusSent},
		event{topic: "order.paid", tenant: "acme", status: outbox.StatusSent},
		event{topic: "order.paid", status: outbox.StatusNew},  // old but never sent
		event{topic: "order.paid", status: outbox.StatusDead}, // old but dead
	)
	e.clock.Set(now.Add(-time.Hour))
	recent := e.seed(t, event{topic: "order.paid", status: outbox.StatusSent})
	all := append(old, recent...)
	count := func() int64 {
		var n int64
		require.NoError(t, e.db.Model(&outbox.Message{}).Count(&n).Error)
		return n
	}

	r := bento(t, e.dsn, "", "purge", "--sent-older-than", "7d", "--dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "would delete 3 sent outbox rows published more than 7d ago")
	assert.Equal(t, int64(6), count(), "a dry run deletes nothing")

	r = bento(t, e.dsn, "", "purge", "--sent-older-than", "7d", "--tenant", "acme", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "deleted 1 ")
	assert.Equal(t, "", string(e.statusOf(t, old[2])[0]))

	r = bento(t, e.dsn, "", "purge", "--sent-older-than", "7d", "--batch", "1", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "deleted 2 ")
	assert.Equal(t, []outbox.Status{"", "", "", outbox.StatusNew, outbox.StatusDead, outbox.StatusSent}, e.statusOf(t, all...))
}

func TestInboxAndIdempotencyPurge(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	now := time.Now().UTC()
	for i, r := range []struct {
		consumer string
		age      time.Duration
	}{{"billing", 40 * 24 * time.Hour}, {"billing", 31 * 24 * time.Hour}, {"shipping", 40 * 24 * time.Hour}, {"billing", time.Hour}} {
		require.NoError(t, e.db.Exec(`INSERT INTO inbox_messages (consumer, message_id, received_at) VALUES (?, ?, ?)`,
			r.consumer, fmt.Sprint("m", i), now.Add(-r.age)).Error)
	}
	inboxLeft := func() []string {
		var ids []string
		require.NoError(t, e.db.Raw(`SELECT message_id FROM inbox_messages ORDER BY message_id`).Scan(&ids).Error)
		return ids
	}
	r := bento(t, e.dsn, "", "inbox", "purge", "--older-than", "30d", "--dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "would delete 3 inbox records")
	assert.Len(t, inboxLeft(), 4)
	r = bento(t, e.dsn, "", "inbox", "purge", "--older-than", "30d", "--consumer", "billing", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "deleted 2 inbox records")
	assert.Equal(t, []string{"m2", "m3"}, inboxLeft())

	for i, exp := range []time.Duration{-time.Hour, -time.Minute, time.Hour} {
		require.NoError(t, e.db.Exec(`INSERT INTO idempotency_keys (idem_key, request_digest, state, created_at, expires_at)
VALUES (?, ?, 'completed', ?, ?)`, fmt.Sprint("k", i), strings.Repeat("0", 64), now.Add(-25*time.Hour), now.Add(exp)).Error)
	}
	keys := func() []string {
		var ks []string
		require.NoError(t, e.db.Raw(`SELECT idem_key FROM idempotency_keys ORDER BY idem_key`).Scan(&ks).Error)
		return ks
	}
	r = bento(t, e.dsn, "", "idempotency", "purge", "--dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "would delete 2 expired idempotency keys")
	assert.Len(t, keys(), 3)
	r = bento(t, e.dsn, "y\n", "idempotency", "purge")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, []string{"k2"}, keys())
}

func TestMigrateUpStatusAndSQL(t *testing.T) {
	t.Parallel()
	db, dsn := testenv.Postgres(t)
	r := bento(t, dsn, "", "migrate", "status")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, fieldLines(r.stdout), "outbox 001 outbox_events pending")
	assert.Contains(t, r.stdout, "migration(s) pending: run bento migrate up")

	r = bento(t, dsn, "", "migrate", "up")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "outbox: applied ")
	assert.Contains(t, r.stdout, "idempotency: applied 2 migration(s)")
	for _, table := range []string{"outbox_events", "inbox_messages", "idempotency_keys"} {
		assert.True(t, db.Migrator().HasTable(table), table)
	}
	r = bento(t, dsn, "", "migrate", "up")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "outbox: applied 0 migration(s)")

	r = bento(t, dsn, "", "migrate", "status")
	require.Equal(t, 0, r.code, r.stderr)
	assert.NotContains(t, r.stdout, "pending")

	r = bento(t, "", "", "migrate", "sql")
	require.Equal(t, 0, r.code, r.stderr)
	for _, s := range []string{"-- outbox 001_outbox_events.sql", "CREATE TABLE IF NOT EXISTS outbox_events", "JSONB",
		"CREATE TABLE IF NOT EXISTS inbox_messages", "CREATE TABLE IF NOT EXISTS idempotency_keys"} {
		assert.Contains(t, r.stdout, s)
	}
	r = bento(t, "", "", "migrate", "sql", "--dialect", "sqlite", "--component", "inbox")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "CREATE TABLE IF NOT EXISTS inbox_messages")
	assert.NotContains(t, r.stdout, "outbox_events")
}

func TestSQLiteDatabaseURL(t *testing.T) {
	t.Parallel()
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "ops.db")
	r := bento(t, dsn, "", "migrate", "up")
	require.Equal(t, 0, r.code, r.stderr)
	r = bento(t, dsn, "", "stats")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, nothingPending("")+"\n", r.stdout, "the rows may all be sent: it says nothing is pending, not that the outbox is empty")
}

func TestBadArgumentsExitTwo(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, dsn string
		args      []string
		want      string
	}{
		{"no command", "", nil, "usage: bento <command>"},
		{"unknown command", "", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"group without a command", "", []string{"dead"}, "usage: bento dead <command>"},
		{"unknown command of a group", "", []string{"consumer", "dead", "frob"}, `bento consumer dead: unknown command "frob"`},
		{"inbox without purge", "", []string{"inbox", "--older-than", "1d"}, `bento inbox: unknown command "--older-than"`},
		{"unknown flag", "", []string{"stats", "--bogus"}, "flag provided but not defined: -bogus"},
		{"missing required flag", "", []string{"purge", "--dry-run"}, "--sent-older-than is required"},
		{"bad age", "", []string{"purge", "--sent-older-than", "7x"}, `bad age "7x"`},
		{"negative age", "", []string{"inbox", "purge", "--older-than", "-5h"}, "must not be negative"},
		{"requeue without a filter", "", []string{"dead", "requeue", "--dry-run"}, "say which dead events to requeue"},
		{"all with a topic", "", []string{"dead", "discard", "--all", "--topic", "x"}, "--all does not go with"},
		{"bad aggregate", "", []string{"dead", "list", "--aggregate", "/x"}, `bad --aggregate "/x"`},
		{"unknown dialect", "", []string{"migrate", "sql", "--dialect", "oracle"}, `unknown dialect "oracle"`},
		{"bad refresh", "", []string{"console", "--refresh", "-1s"}, "--refresh must not be negative"},
		{"no loopback, no host", "", []string{"console", "--exclude-loopback"}, "--exclude-loopback needs a --host"},
		{"no DATABASE_URL", "", []string{"stats"}, "DATABASE_URL is not set"},
		{"unsupported database", "mysql://root@127.0.0.1/test", []string{"stats"}, "unsupported database"},
		{"unreachable database", "postgres://postgres:s3cret@127.0.0.1:1/test?connect_timeout=2", []string{"dead", "list"},
			"cannot connect to DATABASE_URL postgres://postgres:xxxxx@127.0.0.1:1/test"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := bento(t, c.dsn, "", c.args...)
			assert.Equal(t, 2, r.code)
			assert.Contains(t, r.stderr, c.want)
			assert.NotContains(t, r.stderr, "s3cret", "the password is never printed")
		})
	}
}

func TestMissingTablesSayWhatToDo(t *testing.T) {
	t.Parallel()
	_, dsn := testenv.Postgres(t)
	r := bento(t, dsn, "", "stats")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "run bento migrate up")
}

func TestParseAge(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"7d": 7 * 24 * time.Hour, "36h": 36 * time.Hour, "1d12h": 36 * time.Hour, "90m": 90 * time.Minute, "0d": 0,
	} {
		got, err := parseAge(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "d", "7", "x7d", "7d-1h", "-1h", "1.5d"} {
		_, err := parseAge(in)
		assert.Error(t, err, in)
	}
}

func TestHumanAge(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "-", -time.Second: "-", 850 * time.Millisecond: "850ms", 10 * time.Second: "10s", 4*time.Minute + 3*time.Second: "4m3s",
		4 * time.Minute: "4m", time.Hour: "1h", 5*time.Hour + 12*time.Minute: "5h12m", 7 * 24 * time.Hour: "7d",
		3*24*time.Hour + 4*time.Hour: "3d4h", 30 * 24 * time.Hour: "30d",
	} {
		assert.Equal(t, want, humanAge(d), "%v", d)
		if d > time.Second {
			back, err := parseAge(want)
			require.NoError(t, err, want)
			assert.Equal(t, d, back, "%s parses back", want)
		}
	}
}

func TestThingsCount(t *testing.T) {
	t.Parallel()
	what := things{noun: "dead event", qualifier: " with topic x"}
	assert.Equal(t, "no dead events with topic x", what.n(0))
	assert.Equal(t, "1 dead event with topic x", what.n(1))
	assert.Equal(t, "2 dead events with topic x", what.n(2))
	assert.Equal(t, "no dead events", describe(outbox.Filter{}).n(0), "no filter: no qualifier")
	assert.Equal(t, "2 dead events with ids a, b and topic x", describe(outbox.Filter{IDs: []string{"a", "b"}, Topic: "x"}).n(2))
	assert.Equal(t, "", olderThan("published", 0), "a zero age selects every age")
	assert.Equal(t, " published more than 7d ago", olderThan("published", 7*24*time.Hour))
}

// fieldLines returns the lines of s with their fields joined by one space,
// so a test reads a table without caring about column widths.
func fieldLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		out = append(out, strings.Join(strings.Fields(l), " "))
	}
	return out
}

func TestConsoleServesTheDashboard(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seed(t, event{topic: "order.paid", aggType: "order", aggID: "a", status: outbox.StatusDead})

	base, stop := startConsole(t, e.dsn, "--addr", "127.0.0.1:0", "--read-only", "--host", "ops.internal")

	resp, err := http.Get(base + "dead")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), "broker refused order.paid", "the dead letter is listed")
	assert.NotContains(t, string(body), "<button", "read-only: no buttons")

	resp, err = http.PostForm(base+"dead/requeue", url.Values{"topic": {"order.paid"}})
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "read-only refuses every POST")

	for host, want := range map[string]int{"ops.internal": http.StatusOK, "rebind.attacker.test": http.StatusMisdirectedRequest,
		strings.TrimSuffix(strings.TrimPrefix(base, "http://"), "/"): http.StatusOK} {
		assert.Equal(t, want, getHost(t, base, host), "Host %s", host)
	}
	stop()

	// Behind a reverse proxy on the same machine: the loopback names, the
	// host of --addr included, are refused.
	base, stop = startConsole(t, e.dsn, "--addr", "127.0.0.1:0", "--host", "ops.internal", "--exclude-loopback")
	for host, want := range map[string]int{"ops.internal": http.StatusOK, "localhost": http.StatusMisdirectedRequest,
		strings.TrimSuffix(strings.TrimPrefix(base, "http://"), "/"): http.StatusMisdirectedRequest} {
		assert.Equal(t, want, getHost(t, base, host), "--exclude-loopback, Host %s", host)
	}
	stop()
}

// startConsole runs bento console with args on the database dsn and
// returns the URL it serves and a function that stops it with SIGTERM,
// expecting a clean exit.
func startConsole(t *testing.T, dsn string, args ...string) (string, func()) {
	t.Helper()
	return startConsoleEnv(t, []string{"DATABASE_URL=" + dsn}, args...)
}

// startConsoleEnv is startConsole with env added to the process's.
func startConsoleEnv(t *testing.T, env []string, args ...string) (string, func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	cmd := exec.CommandContext(ctx, binary, append([]string{"console"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		_ = cmd.Wait() // stderr is complete only once the process has ended
		cancel()
		t.Fatalf("no output; stderr: %s", errb.String())
	}
	first := lines.Text()
	require.True(t, strings.HasPrefix(first, "bento console: serving on http://127.0.0.1:"), first)
	return strings.TrimPrefix(first, "bento console: serving on "), func() {
		defer cancel()
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		go func() { _, _ = io.Copy(io.Discard, stdout) }()
		err := cmd.Wait()
		assert.NoError(t, err, "SIGTERM shuts the console down cleanly; stderr: %s", errb.String())
	}
}

// getHost fetches base with the Host header host and returns the status.
func getHost(t *testing.T, base, host string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base, nil)
	require.NoError(t, err)
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

func TestMaintainPartitions(t *testing.T) {
	t.Parallel()
	db, dsn := testenv.Postgres(t)
	ctx := context.Background()
	r := bento(t, dsn, "", "migrate", "up", "--partition", "weekly")
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, `unknown --partition "weekly"`)

	// Partitions from 20 days ago, so that old ones exist to drop; from
	// midnight, so that the rows seeded an hour later land in the day's
	// partition at any time of day.
	now := time.Now().UTC()
	past := now.Truncate(24*time.Hour).AddDate(0, 0, -20)
	require.NoError(t, outbox.MigrateWith(ctx, db, &partition.MigrateOpts{
		Partitioning: partition.Daily, Ahead: 25, Clock: fakeclock.New(past),
	}))
	r = bento(t, dsn, "", "migrate", "up", "--partition", "daily")
	require.Equal(t, 0, r.code, r.stderr)
	var kinds []string
	require.NoError(t, db.Raw(`SELECT relkind::text FROM pg_class WHERE oid IN ('outbox_events'::regclass, 'inbox_messages'::regclass)`).
		Scan(&kinds).Error)
	assert.Equal(t, []string{"p", "p"}, kinds, "both tables are partitioned")

	clock := testenv.NewClock(past.Add(time.Hour))
	st, err := outbox.NewStore(db, &outbox.Config{Clock: clock, Test: outbox.TestConfig{Clock: clock}})
	require.NoError(t, err)
	e := &env{db: db, dsn: dsn, store: st, clock: clock}
	sent := e.seed(t, event{topic: "order.paid", status: outbox.StatusSent})
	clock.Set(past.AddDate(0, 0, 1).Add(time.Hour))
	pending := e.seed(t, event{topic: "order.paid", status: outbox.StatusNew})
	name := func(t time.Time) string { return "outbox_events_p" + t.Format("20060102") }
	exists := func(table string) bool {
		var ok bool
		require.NoError(t, db.Raw("SELECT to_regclass(?) IS NOT NULL", table).Scan(&ok).Error)
		return ok
	}
	oldSent, oldPending := name(past), name(past.AddDate(0, 0, 1))

	r = bento(t, dsn, "", "maintain", "--dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	lines := fieldLines(r.stdout)
	assert.Contains(t, lines, "outbox drop "+oldSent)
	assert.Contains(t, lines, "outbox keep (holds rows not sent) "+oldPending)
	assert.True(t, exists(oldSent), "a dry run drops nothing")

	r = bento(t, dsn, "no\n", "maintain")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "partition(s) past retention, with their rows? [y/N]")
	assert.True(t, exists(oldSent), "declined: nothing dropped")

	r = bento(t, dsn, "", "maintain", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, fieldLines(r.stdout), "outbox drop "+oldSent)
	assert.False(t, exists(oldSent))
	assert.True(t, exists(oldPending), "a partition with a pending row stays")
	assert.Equal(t, []outbox.Status{"", outbox.StatusNew}, e.statusOf(t, sent[0], pending[0]))

	r = bento(t, dsn, "", "maintain", "--dry-run", "--component", "outbox")
	require.Equal(t, 0, r.code, r.stderr)
	assert.NotContains(t, r.stdout, " drop ", "nothing left to drop")
}

func TestMaintainWithoutPartitionedTables(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := bento(t, e.dsn, "", "maintain", "--dry-run")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stdout, "outbox: outbox_events is not partitioned")
	assert.Contains(t, r.stderr, "no partitioned table to maintain")
}

func TestConsoleRejectsAShortSecret(t *testing.T) { // not parallel: Setenv
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "ops.db")
	require.Equal(t, 0, bento(t, dsn, "", "migrate", "up").code)
	t.Setenv("BENTO_CONSOLE_SECRET", "too-short")
	r := bento(t, dsn, "", "console", "--addr", "127.0.0.1:0")
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, "Secret: 9 bytes, want at least 32")
}
