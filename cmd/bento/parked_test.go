package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// aggregateMsg is version v of tenant's order/id, as the relay publishes it.
func aggregateMsg(t *testing.T, msgID, tenantID, id string, v int64) *message.Message {
	t.Helper()
	m, err := messaging.NewMessage(&outbox.Message{ID: msgID, TenantID: tenantID, Topic: "order.changed",
		AggregateType: "order", AggregateID: id, AggregateVersion: v, SchemaVersion: 1, Payload: []byte(`{}`),
		OccurredAt: time.Now().UTC()})
	require.NoError(t, err)
	return m
}

// TestConsumerParkedThroughTheBinary: with tenant acme's order o1 held
// behind its dead-lettered version 2 (versions 3 and 4 parked behind it)
// and tenant globex's o1 waiting for a lost version 2, the binary lists
// both, filtered by tenant and reason, shows each aggregate's hold and
// parked events, and releases: declined or in the wrong tenant's name it
// changes nothing; confirmed, acme's hold is gone and a second release is
// stale; globex's gap is skipped only under --versions contiguous.
func TestConsumerParkedThroughTheBinary(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	const group = "parked-cli"
	in, err := inbox.New(e.db, &inbox.Config{Consumer: group, Versions: inbox.VersionsContiguous})
	require.NoError(t, err)
	require.NoError(t, in.Hold(ctx, aggregateMsg(t, "acme-o1-2", "acme", "o1", 2)))
	require.NoError(t, in.Park(ctx, aggregateMsg(t, "acme-o1-3", "acme", "o1", 3), 1, inbox.ParkedHeld))
	require.NoError(t, in.Park(ctx, aggregateMsg(t, "acme-o1-4", "acme", "o1", 4), 1, inbox.ParkedHeld))
	require.NoError(t, in.Park(ctx, aggregateMsg(t, "globex-o1-3", "globex", "o1", 3), 2, inbox.ParkedWaiting))

	list := func(args ...string) parkedListJSON {
		t.Helper()
		r := bento(t, e.dsn, "", append([]string{"consumer", "parked", "list", "--group", group, "--json"}, args...)...)
		require.Equal(t, 0, r.code, r.stderr)
		var out parkedListJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
		return out
	}
	ids := func(l parkedListJSON) (parked, holds []string) {
		for _, p := range l.Parked {
			parked = append(parked, p.ID)
		}
		for _, h := range l.Holds {
			holds = append(holds, h.MessageID)
		}
		return parked, holds
	}
	parked, holds := ids(list())
	assert.ElementsMatch(t, []string{"acme-o1-3", "acme-o1-4", "globex-o1-3"}, parked)
	assert.Equal(t, []string{"acme-o1-2"}, holds)
	parked, holds = ids(list("--tenant", "acme"))
	assert.ElementsMatch(t, []string{"acme-o1-3", "acme-o1-4"}, parked)
	assert.Equal(t, []string{"acme-o1-2"}, holds)
	parked, holds = ids(list("--tenant", "globex"))
	assert.Equal(t, []string{"globex-o1-3"}, parked)
	assert.Empty(t, holds, "acme's hold is not globex's")
	parked, holds = ids(list("--reason", "waiting"))
	assert.Equal(t, []string{"globex-o1-3"}, parked)
	assert.Empty(t, holds, "holds list with held only")
	l := list("--tenant", "acme", "--aggregate", "order/o1", "--limit", "1")
	require.Len(t, l.Parked, 1)
	assert.Equal(t, inbox.ParkedHeld, l.Parked[0].Reason)
	assert.Equal(t, 1, l.Parked[0].Partition)
	assert.Equal(t, "order.changed", l.Parked[0].EventType)

	r := bento(t, e.dsn, "", "consumer", "parked", "list", "--group", group)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `(?m)^acme-o1-3\s+acme\s+order/o1\s+3\s+held\s+1\s+0\s`, r.stdout)
	assert.Regexp(t, `(?m)^globex-o1-3\s+globex\s+order/o1\s+3\s+waiting\s+2\s+0\s`, r.stdout)
	assert.Regexp(t, `(?m)^HELD BEHIND\s+TENANT\s+AGGREGATE\s+VERSION\s+SINCE$`, r.stdout)
	assert.Regexp(t, `(?m)^acme-o1-2\s+acme\s+order/o1\s+2\s+\d{4}-`, r.stdout)
	r = bento(t, e.dsn, "", "consumer", "parked", "list", "--group", group, "--tenant", "initech")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "no parked events or holds in parked-cli with tenant initech\n", r.stdout)
	r = bento(t, e.dsn, "", "consumer", "parked", "list", "--group", group, "--reason", "stuck")
	assert.Equal(t, 2, r.code)

	r = bento(t, e.dsn, "", "consumer", "parked", "show", "--group", group, "--tenant", "acme", "--aggregate", "order/o1")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `(?m)^held behind:\s+dead letter acme-o1-2 \(version 2\) since \d{4}-`, r.stdout)
	assert.Regexp(t, `(?m)^parked:\s+2$`, r.stdout)
	assert.Contains(t, r.stdout, "bento consumer parked release acme-o1-2 --group parked-cli --tenant acme --aggregate order/o1")
	assert.Regexp(t, `(?s)acme-o1-3 .*\nacme-o1-4 `, r.stdout, "in version order")
	r = bento(t, e.dsn, "", "consumer", "parked", "show", "--group", group, "--tenant", "acme", "--aggregate", "order/o1", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var show parkedShowJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &show), r.stdout)
	require.NotNil(t, show.Hold)
	assert.Equal(t, "acme-o1-2", show.Hold.MessageID)
	assert.Equal(t, "acme-o1-2", show.Release)
	require.Len(t, show.Parked, 2)
	assert.Equal(t, []int64{3, 4}, []int64{show.Parked[0].Version, show.Parked[1].Version})
	r = bento(t, e.dsn, "", "consumer", "parked", "show", "--group", group, "--aggregate", "order/o1")
	assert.Equal(t, 1, r.code, "the default tenant's order/o1 has nothing parked")
	assert.Contains(t, r.stderr, "no parked events and no hold")

	release := func(stdin string, args ...string) result {
		t.Helper()
		return bento(t, e.dsn, stdin, append([]string{"consumer", "parked", "release", "--group", group}, args...)...)
	}
	r = release("", "acme-o1-2", "--tenant", "acme", "--aggregate", "order/o1")
	assert.Equal(t, 2, r.code, "--versions is required")
	assert.Contains(t, r.stderr, "--versions is required")
	r = release("n\n", "acme-o1-2", "--tenant", "acme", "--aggregate", "order/o1", "--versions", "ignored")
	assert.Equal(t, 1, r.code, "declined")
	assert.Contains(t, r.stderr, "release order/o1 of tenant acme in parked-cli from dead letter acme-o1-2 (version 2)?")
	r = release("", "acme-o1-2", "--tenant", "globex", "--aggregate", "order/o1", "--versions", "ignored", "--yes")
	assert.Equal(t, 1, r.code, "globex's order/o1 is not held behind acme's dead letter")
	assert.Contains(t, r.stderr, "stale release")
	_, holds = ids(list("--tenant", "acme"))
	assert.Equal(t, []string{"acme-o1-2"}, holds, "nothing released yet")

	r = release("y\n", "acme-o1-2", "--tenant", "acme", "--aggregate", "order/o1", "--versions", "ignored")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "released order/o1 of tenant acme in parked-cli from acme-o1-2")
	parked, holds = ids(list("--tenant", "acme"))
	assert.Empty(t, holds, "the hold is gone")
	assert.ElementsMatch(t, []string{"acme-o1-3", "acme-o1-4"}, parked, "left for the group's consumer to apply")
	r = release("", "acme-o1-2", "--tenant", "acme", "--aggregate", "order/o1", "--versions", "ignored", "--yes")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "stale release")

	// globex's o1 waits for a lost version 2: only a release under the
	// group's contiguous versions skips it, moving the watermark to 2.
	watermark := func() int64 {
		var v []int64
		require.NoError(t, e.db.Raw(`SELECT version FROM inbox_watermarks WHERE consumer = ? AND tenant_id = 'globex'`,
			group).Scan(&v).Error)
		if len(v) == 0 {
			return 0
		}
		return v[0]
	}
	r = release("", "globex-o1-3", "--tenant", "globex", "--aggregate", "order/o1", "--versions", "ignored", "--yes")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "stale release")
	assert.Equal(t, int64(0), watermark())
	r = release("", "globex-o1-3", "--tenant", "globex", "--aggregate", "order/o1", "--versions", "contiguous", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, int64(2), watermark(), "version 2 is given up")
}

// TestConsumerMembersThroughTheBinary: two live members of a group of 4
// partitions own 0,2 and 1,3, as they deal them; an expired row and
// another group's are not shown.
func TestConsumerMembersThroughTheBinary(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	now := time.Now()
	for _, m := range []struct {
		group, id string
		expires   time.Time
	}{
		{"members-cli", "host-b:2", now.Add(time.Hour)},
		{"members-cli", "host-a:1", now.Add(time.Hour)},
		{"members-cli", "host-c:3", now.Add(-time.Minute)},
		{"members-other", "host-d:4", now.Add(time.Hour)},
	} {
		require.NoError(t, e.db.Exec(`INSERT INTO consumer_members (consumer, member_id, partitions, expires_ms) VALUES (?, ?, 4, ?)`,
			m.group, m.id, m.expires.UnixMilli()).Error)
	}
	r := bento(t, e.dsn, "", "consumer", "members", "--group", "members-cli")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `(?m)^MEMBER\s+PARTITIONS\s+OWNS\s+LAST BEAT\s+EXPIRES$`, r.stdout)
	assert.Regexp(t, `(?m)^host-a:1\s+4\s+0,2\s+\d{4}-`, r.stdout)
	assert.Regexp(t, `(?m)^host-b:2\s+4\s+1,3\s+\d{4}-`, r.stdout)
	assert.NotContains(t, r.stdout, "host-c", "expired")
	assert.NotContains(t, r.stdout, "host-d", "another group's")

	r = bento(t, e.dsn, "", "consumer", "members", "--group", "members-cli", "--json", "--takeover-time", "4s")
	require.Equal(t, 0, r.code, r.stderr)
	var rows []memberJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rows), r.stdout)
	require.Len(t, rows, 2)
	assert.Equal(t, "host-a:1", rows[0].ID)
	assert.Equal(t, []int{0, 2}, rows[0].Owns)
	assert.Equal(t, []int{1, 3}, rows[1].Owns)
	assert.Equal(t, 3*time.Second, rows[0].Expires.Sub(rows[0].LastBeat), "three quarters of the takeover time")
	assert.WithinDuration(t, now.Add(time.Hour), rows[0].Expires, time.Second)

	r = bento(t, e.dsn, "", "consumer", "members", "--group", "members-none")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, fmt.Sprintf("no live members of %s (a group without partitions has none)\n", "members-none"), r.stdout)
	r = bento(t, e.dsn, "", "consumer", "members")
	assert.Equal(t, 2, r.code, "--group is required")
}

// TestConsoleShowsTheGroupsNamed: bento console --group shows that group's
// pages, its parked events among them, and answers 404 for a group it was
// not given.
func TestConsoleShowsTheGroupsNamed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b := newBroker(t)
	const group = "console-cli"
	in, err := inbox.New(e.db, &inbox.Config{Consumer: group})
	require.NoError(t, err)
	require.NoError(t, in.Hold(t.Context(), aggregateMsg(t, "acme-o7-2", "acme", "o7", 2)))
	require.NoError(t, in.Park(t.Context(), aggregateMsg(t, "acme-o7-3", "acme", "o7", 3), 0, inbox.ParkedHeld))
	base, stop := startConsoleEnv(t, append(b.env, "DATABASE_URL="+e.dsn), "--addr", "127.0.0.1:0", "--group", group)
	defer stop()
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	code, body := get("consumers/" + group + "/parked")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "acme-o7-3", "the parked event")
	assert.Contains(t, body, "acme-o7-2", "the dead letter it is held behind")
	code, _ = get("consumers/another-group/parked")
	assert.Equal(t, http.StatusNotFound, code)

	r := bento(t, e.dsn, "", "console", "--addr", "127.0.0.1:0", "--group", group)
	assert.Equal(t, 2, r.code, "no AMQP_URL, and no database bus")
	assert.Contains(t, r.stderr, "dbbus_deliveries")
	assert.Contains(t, r.stderr, "AMQP_URL")
	r = bento(t, e.dsn, "", "console", "--addr", "127.0.0.1:0", "--group", group, "--bus", "rabbitmq")
	assert.Equal(t, 2, r.code, "no AMQP_URL")
	assert.Contains(t, r.stderr, "AMQP_URL is not set")
}
