package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/fakeclock"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/partition"
	"github.com/bentoevents/bento/rabbitmq"
)

// The golden tests keep docs/cli.md and the binary in agreement. Each
// block of the document marked <!-- golden: KEY --> on the line before its
// fence holds what bento prints: the usage of every command and group of
// commands (KEY "stats -h", "dead -h", "-h") and sample runs against a
// seeded test database (KEY "run: ..."). The test fails when a command of
// the commands table has no block, when a block names nothing the test
// produces, when a block's text differs from the output, and when a
// command has no sample run.
//
//	go test ./cmd/bento -run Golden -update
//
// rewrites the blocks with what bento prints now (add the marker, with an
// empty fenced block after it, where a new command's block belongs).
var update = flag.Bool("update", false, "rewrite the golden blocks of docs/cli.md with what bento prints")

// cliDoc is the document whose golden blocks the tests check.
const cliDoc = "../../docs/cli.md"

// goldenMarker is the line before a golden block's fence.
var goldenMarker = regexp.MustCompile(`^<!-- golden: (.+?) -->$`)

// goldenKeys returns the keys of doc's golden blocks, in order.
func goldenKeys(doc string) []string {
	var keys []string
	for _, line := range strings.Split(doc, "\n") {
		if m := goldenMarker.FindStringSubmatch(line); m != nil {
			keys = append(keys, m[1])
		}
	}
	return keys
}

// checkGolden compares the golden blocks of doc with want, which maps each
// key to the text its block must hold. It returns the problems (a block
// that differs, a key of want without a block, a block without a key in
// want, a marker without a fenced block after it) and doc with every
// marked block set to its text in want (a marker without a block gets
// one).
func checkGolden(doc string, want map[string]string) (updated string, problems []string) {
	lines := strings.Split(doc, "\n")
	var out []string
	seen := map[string]bool{}
	for i := 0; i < len(lines); i++ {
		out = append(out, lines[i])
		m := goldenMarker.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		key := m[1]
		text, known := want[key]
		switch {
		case seen[key]:
			problems = append(problems, fmt.Sprintf("<!-- golden: %s --> appears twice", key))
		case !known:
			problems = append(problems, fmt.Sprintf("<!-- golden: %s --> names no command or sample run the test knows", key))
		}
		seen[key] = true
		var got []string
		end := -1
		if i+1 < len(lines) && strings.HasPrefix(lines[i+1], "```") {
			for j := i + 2; j < len(lines); j++ {
				if strings.HasPrefix(lines[j], "```") {
					end = j
					break
				}
				got = append(got, lines[j])
			}
		}
		if end < 0 {
			problems = append(problems, fmt.Sprintf("<!-- golden: %s --> is not followed by a fenced block", key))
		} else if known && strings.Join(got, "\n")+"\n" != text {
			problems = append(problems, fmt.Sprintf("the block <!-- golden: %s --> differs from what bento prints\n--- docs/cli.md\n%s\n--- bento\n%s",
				key, strings.Join(got, "\n"), strings.TrimSuffix(text, "\n")))
		}
		if !known { // leave the block as it is
			continue
		}
		out = append(out, "```")
		out = append(out, strings.Split(strings.TrimSuffix(text, "\n"), "\n")...)
		out = append(out, "```")
		if end >= 0 {
			i = end
		}
	}
	for key := range want {
		if !seen[key] {
			problems = append(problems, fmt.Sprintf("docs/cli.md has no block for %q: add <!-- golden: %s --> and a fenced block, then run go test ./cmd/bento -run Golden -update", key, key))
		}
	}
	return strings.Join(out, "\n"), problems
}

// normalizer replaces what changes from run to run in bento's output with
// fixed text of the same width, so the output can be compared and columns
// stay aligned:
//   - spaces at the end of a line are dropped;
//   - each ULID (an event id) becomes 01J000000000000000000000N, numbered
//     in the order the ids first appear;
//   - each RFC 3339 UTC time becomes 2026-01-02T03:04:05Z;
//   - a JSON "..._age_seconds" value is rounded to whole minutes;
//   - the names of the test's exchange and group become bento.events and
//     billing.
type normalizer struct {
	ids, names map[string]string
	// today, when set, is the day the date of a daily partition's name
	// (outbox_events_p20260102) counts from: it becomes that many days
	// from 2026-01-02.
	today time.Time
}

// partitionDayRE matches the date in a daily partition's name.
var partitionDayRE = regexp.MustCompile(`(_p)(\d{8})\b`)

var (
	ulidRE       = regexp.MustCompile(`\b[0-9A-HJKMNP-TV-Z]{26}\b`)
	timeRE       = regexp.MustCompile(`\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z\b`)
	ageSecondsRE = regexp.MustCompile(`("[a-z_]+_age_seconds": )([0-9.]+)`)
	trailingRE   = regexp.MustCompile(`(?m)[ \t]+$`)
)

func (n *normalizer) normalize(s string) string {
	s = trailingRE.ReplaceAllString(s, "")
	for name, fixed := range n.names {
		s = strings.ReplaceAll(s, name, fixed)
	}
	s = ulidRE.ReplaceAllStringFunc(s, func(id string) string {
		if n.ids[id] == "" {
			num := strconv.Itoa(len(n.ids) + 1)
			n.ids[id] = "01J" + strings.Repeat("0", 23-len(num)) + num
		}
		return n.ids[id]
	})
	s = timeRE.ReplaceAllString(s, "2026-01-02T03:04:05Z")
	if !n.today.IsZero() {
		s = partitionDayRE.ReplaceAllStringFunc(s, func(m string) string {
			parts := partitionDayRE.FindStringSubmatch(m)
			day, err := time.Parse("20060102", parts[2])
			if err != nil {
				return m
			}
			offset := int(day.Sub(n.today).Round(24*time.Hour) / (24 * time.Hour))
			return parts[1] + time.Date(2026, 1, 2+offset, 0, 0, 0, 0, time.UTC).Format("20060102")
		})
	}
	return ageSecondsRE.ReplaceAllStringFunc(s, func(m string) string {
		parts := ageSecondsRE.FindStringSubmatch(m)
		v, err := strconv.ParseFloat(parts[2], 64)
		if err != nil {
			return m
		}
		return parts[1] + strconv.FormatFloat(math.Round(v/60)*60, 'f', -1, 64)
	})
}

// runInProcess runs bento's run with args, the environment env (nothing
// else is set) and stdin, and returns the exit code and what it printed.
func runInProcess(env map[string]string, stdin string, args ...string) result {
	var out, errb bytes.Buffer
	getenv := func(k string) string { return env[k] }
	code := run(context.Background(), args, strings.NewReader(stdin), &out, &errb, getenv)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// helpKeys returns the args of every -h the golden blocks show: bento's,
// each group's ("dead -h") and each command's ("dead list -h"), all from
// the commands table.
func helpKeys() [][]string {
	keys := [][]string{{"-h"}}
	groups := map[string]bool{}
	for _, c := range commands {
		words := strings.Fields(c.name)
		for n := 1; n < len(words); n++ {
			g := strings.Join(words[:n], " ")
			if !groups[g] {
				groups[g] = true
				keys = append(keys, append(strings.Fields(g), "-h"))
			}
		}
		keys = append(keys, append(words, "-h"))
	}
	return keys
}

// goldenHelp runs every -h and returns its golden text by key.
func goldenHelp(t *testing.T) map[string]string {
	t.Helper()
	want := map[string]string{}
	for _, args := range helpKeys() {
		r := runInProcess(nil, "", args...)
		key := strings.Join(args, " ")
		require.Equal(t, exitOK, r.code, "bento %s exits 0", key)
		require.Empty(t, r.stderr, "bento %s prints its usage on stdout", key)
		require.Equal(t, 1, strings.Count(r.stdout, "usage: "), "bento %s prints its usage once:\n%s", key, r.stdout)
		want[key] = "$ bento " + key + "\n" + trailingRE.ReplaceAllString(r.stdout, "")
	}
	return want
}

// goldenRuns runs the sample commands on a seeded PostgreSQL schema and
// returns their golden text by key ("run: ...").
func goldenRuns(t *testing.T) map[string]string {
	t.Helper()
	db, dsn := testenv.Postgres(t)
	return sampler(t, map[string]string{"DATABASE_URL": dsn}, &normalizer{ids: map[string]string{}}, func(sample sampleFunc) {
		seededRuns(t, db, dsn, sample)
	})
}

// sampleFunc runs bento with args and stdin as the sample run key.
type sampleFunc func(key, stdin string, args ...string)

// sampler calls runs with a sampleFunc that runs bento in env, and returns
// the golden text of each sample run by key ("run: KEY").
func sampler(t *testing.T, env map[string]string, norm *normalizer, runs func(sampleFunc)) map[string]string {
	t.Helper()
	want := map[string]string{}
	runs(func(key, stdin string, args ...string) {
		t.Helper()
		r := runInProcess(env, stdin, args...)
		require.Equal(t, exitOK, r.code, "bento %v: %s", args, r.stderr)
		// As a terminal shows it: the question on stderr with the
		// answer typed, then the output.
		text := "$ bento " + strings.Join(args, " ") + "\n" + r.stderr + stdin + r.stdout
		if !strings.HasSuffix(text, "\n") {
			text += "\n"
		}
		want["run: "+key] = norm.normalize(text)
	})
	return want
}

// seededRuns runs the samples of the database commands on the schema of
// db.
func seededRuns(t *testing.T, db *gorm.DB, dsn string, sample sampleFunc) {
	t.Helper()
	sample("migrate up", "", "migrate", "up")
	sample("migrate status", "", "migrate", "status")

	// Rows written three hours ago, so that the ages rounded to minutes
	// are the same on every run.
	now := time.Now().UTC()
	clock := testenv.NewClock(now.Add(-3 * time.Hour))
	st, err := outbox.NewStore(db, &outbox.Config{Clock: clock, Test: outbox.TestConfig{Clock: clock}})
	require.NoError(t, err)
	e := &env{db: db, dsn: dsn, store: st, clock: clock}
	e.seed(t,
		event{tenant: "default", topic: "order.placed", status: outbox.StatusSent},
		event{tenant: "default", topic: "order.paid", status: outbox.StatusSent},
		event{tenant: "acme", topic: "order.placed", status: outbox.StatusSent},
	)
	sample("stats, drained", "", "stats")
	sample("stats --tenant, drained", "", "stats", "--tenant", "acme")
	sample("dead list, none", "", "dead", "list")

	ids := e.seed(t,
		event{tenant: "default", topic: "order.paid", aggType: "order", aggID: "1001", status: outbox.StatusDead},
		event{tenant: "default", topic: "order.paid", aggType: "order", aggID: "1002", status: outbox.StatusDead},
		event{tenant: "default", topic: "cart.closed", aggType: "cart", aggID: "77", status: outbox.StatusDead},
		event{tenant: "default", topic: "order.placed", aggType: "order", aggID: "1003", status: outbox.StatusFailed},
		event{tenant: "default", topic: "order.placed", aggType: "order", aggID: "1004", status: outbox.StatusNew},
		event{tenant: "acme", topic: "order.placed", aggType: "order", aggID: "9", status: outbox.StatusNew},
	)
	clock.Set(now) // published just now: the last minute's rate
	e.seed(t,
		event{tenant: "default", topic: "order.placed", status: outbox.StatusSent},
		event{tenant: "default", topic: "order.placed", status: outbox.StatusSent},
	)
	sample("stats", "", "stats")
	sample("stats --json", "", "stats", "--tenant", "acme", "--json")
	sample("dead list", "", "dead", "list")
	sample("dead list --topic", "", "dead", "list", "--topic", "order.shipped")
	sample("dead show", "", "dead", "show", ids[2])
	sample("dead requeue --dry-run", "", "dead", "requeue", "--topic", "order.paid", "--dry-run")
	sample("dead requeue", "y\n", "dead", "requeue", ids[0])
	sample("dead discard", "", "dead", "discard", "--aggregate", "cart", "--yes")

	sample("purge --dry-run", "", "purge", "--sent-older-than", "1h", "--dry-run")
	sample("purge any age --dry-run", "", "purge", "--sent-older-than", "0s", "--dry-run")
	sample("purge", "", "purge", "--sent-older-than", "1h", "--yes")
	sample("purge, nothing", "", "purge", "--sent-older-than", "7d", "--yes")

	for i, age := range []time.Duration{40 * 24 * time.Hour, 31 * 24 * time.Hour, time.Hour} {
		require.NoError(t, db.Exec(`INSERT INTO inbox_messages (consumer, message_id, received_at) VALUES (?, ?, ?)`,
			"billing", fmt.Sprint("m", i), now.Add(-age)).Error)
	}
	sample("inbox purge --dry-run", "", "inbox", "purge", "--older-than", "30d", "--dry-run")
	sample("idempotency purge", "", "idempotency", "purge", "--yes")

	// Group billing: acme's order o1 held behind its dead-lettered
	// version 2, version 3 parked behind it; globex's o1 waiting for its
	// version 2. Two live instances.
	in, err := inbox.New(db, &inbox.Config{Consumer: "billing"})
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, in.Hold(ctx, aggregateMsg(t, "acme-o1-2", "acme", "o1", 2)))
	require.NoError(t, in.Park(ctx, aggregateMsg(t, "acme-o1-3", "acme", "o1", 3), 1, inbox.ParkedHeld))
	require.NoError(t, in.Park(ctx, aggregateMsg(t, "globex-o1-3", "globex", "o1", 3), 2, inbox.ParkedWaiting))
	sample("consumer parked list", "", "consumer", "parked", "list", "--group", "billing")
	sample("consumer parked show", "", "consumer", "parked", "show", "--group", "billing", "--tenant", "acme", "--aggregate", "order/o1")
	sample("consumer parked release", "y\n", "consumer", "parked", "release", "acme-o1-2", "--group", "billing",
		"--tenant", "acme", "--aggregate", "order/o1", "--versions", "ignored")
	for _, id := range []string{"host-a:1", "host-b:2"} {
		require.NoError(t, db.Exec(`INSERT INTO consumer_members (consumer, member_id, partitions, expires_ms) VALUES (?, ?, 4, ?)`,
			"billing", id, now.Add(time.Hour).UnixMilli()).Error)
	}
	sample("consumer members", "", "consumer", "members", "--group", "billing")

	// Group billing's two dead letters on the database bus, given up two
	// hours ago: DATABASE_URL alone chooses it.
	require.NoError(t, dbbus.Migrate(ctx, db))
	require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing", "order.paid"))
	require.NoError(t, dbbus.DeclareGroup(ctx, db, consumer.DeadLetterQueue("billing"), consumer.DeadLetterTopic("billing")))
	bus, err := dbbus.New(db, &dbbus.Config{NoListen: true})
	require.NoError(t, err)
	defer func() { _ = bus.Close() }()
	var dead []string
	for i, d := range []struct{ id, cause, reason string }{
		{"1001", consumer.CausePermanent, "card 4111 declined"},
		{"1002", consumer.CauseFailed, "ledger unavailable: connection refused"},
	} {
		m := message.NewMessage(aggregate.NewID(), []byte(`{"order_id":"`+d.id+`","amount":"12.50"}`))
		m.Metadata.Set(messaging.MetaEventType, "order.paid")
		m.Metadata.Set(messaging.MetaTenantID, "acme")
		m.Metadata.Set(messaging.MetaAggregateType, "order")
		m.Metadata.Set(messaging.MetaAggregateID, d.id)
		m.Metadata.Set(messaging.MetaAggregateVersion, "2")
		m.Metadata.Set(consumer.MetaDeadCause, d.cause)
		m.Metadata.Set(consumer.MetaDeadReason, d.reason)
		m.Metadata.Set(consumer.MetaDeadAttempts, fmt.Sprint(1+5*i))
		m.Metadata.Set(consumer.MetaDeadAt, now.Add(-2*time.Hour).Format(time.RFC3339Nano))
		require.NoError(t, bus.Publish(consumer.DeadLetterTopic("billing"), m))
		dead = append(dead, m.UUID)
	}
	sample("consumer dead list", "", "consumer", "dead", "list", "--group", "billing")
	sample("consumer dead show", "", "consumer", "dead", "show", dead[0], "--group", "billing")
	sample("consumer dead replay", "y\n", "consumer", "dead", "replay", dead[1], "--group", "billing")
	sample("consumer dead discard --dry-run", "", "consumer", "dead", "discard", "--cause", "permanent", "--group", "billing", "--dry-run")

	// Two shipment events and an invoice, published two hours ago while
	// no group was bound to them: the bus keeps them. Once group shipping
	// is bound to shipment.*, a replay delivers the shipments to it; the
	// invoice stays kept.
	for i, topic := range []string{"shipment.created", "shipment.created", "invoice.sent"} {
		m := message.NewMessage(aggregate.NewID(), []byte(`{}`))
		m.Metadata.Set(messaging.MetaEventType, topic)
		m.Metadata.Set(messaging.MetaAggregateType, "order")
		m.Metadata.Set(messaging.MetaAggregateID, fmt.Sprint(1001+i))
		require.NoError(t, bus.Publish(topic, m))
	}
	require.NoError(t, db.Exec(`UPDATE dbbus_messages SET created_at = now() - interval '2 hours' WHERE topic IN ('shipment.created', 'invoice.sent')`).Error)
	sample("unroutable list --bus database", "", "unroutable", "list", "--bus", "database")
	require.NoError(t, dbbus.DeclareGroup(ctx, db, "shipping", "shipment.*"))
	sample("unroutable replay --bus database", "", "unroutable", "replay", "--bus", "database", "--yes")

	// Two stock events no group is bound to: the bus keeps them as
	// unroutable.
	for range 2 {
		require.NoError(t, bus.Publish("stock.reserved", message.NewMessage(aggregate.NewID(), []byte(`{}`))))
	}
	sample("unroutable purge --dry-run", "", "unroutable", "purge", "--all", "--dry-run")
	sample("unroutable purge", "", "unroutable", "purge", "--all", "--yes")

	// Messages scheduled for the coming hours: two reminders of acme's
	// under one key, and a default tenant's message without a key.
	for i, s := range []struct{ tenant, topic, key string }{
		{"acme", "invoice.remind", "invoice-7"}, {"acme", "invoice.remind", "invoice-7"}, {"default", "cart.abandoned", ""},
	} {
		scheduleOne(t, db, st, s.tenant, s.topic, s.key, now.Add(time.Duration(i+1)*time.Hour))
	}
	sample("scheduled list", "", "scheduled", "list")
	sample("scheduled cancel --dry-run", "", "scheduled", "cancel", "--key", "invoice-7", "--tenant", "acme", "--dry-run")
	sample("scheduled cancel", "y\n", "scheduled", "cancel", "--key", "invoice-7", "--tenant", "acme")

	// A process manager's checkouts: acme's waits for its payment with two
	// live timeouts, the default tenant's has none.
	require.NoError(t, db.AutoMigrate(&checkoutState{}))
	seedCheckout(t, db, st, "acme", "order-1001", now.Add(-2*time.Hour), false, "payment", "reminder")
	seedCheckout(t, db, st, "default", "order-1002", now.Add(-time.Hour), false)
	sample("process list", "", "process", "list", "--table", "checkouts")
	sample("process abandon --dry-run", "", "process", "abandon", "--table", "checkouts", "--key", "order-1001", "--tenant", "acme", "--dry-run")
	sample("process abandon", "y\n", "process", "abandon", "--table", "checkouts", "--key", "order-1001", "--tenant", "acme")
	// A checkout completed 40 days ago: past the 30 days the purge keeps,
	// where the one just abandoned is not.
	seedCheckout(t, db, st, "acme", "order-0999", now.Add(-41*24*time.Hour), true)
	require.NoError(t, db.Model(&checkoutState{}).Where("process_key = ?", "order-0999").
		Update("completed_at", now.Add(-40*24*time.Hour)).Error)
	sample("process purge --dry-run", "", "process", "purge", "--table", "checkouts", "--completed-before", "30d", "--dry-run")
	sample("process purge", "y\n", "process", "purge", "--table", "checkouts", "--completed-before", "30d")
}

// goldenMaintainRuns runs bento maintain on a schema of daily partitions,
// the outbox's created from three days ago, with a sent row in the
// oldest and a pending one in the next. The output shows today as
// 2026-01-02 (see normalizer.today). Its ages are whole days, so that it
// plans the same at any time of day.
func goldenMaintainRuns(t *testing.T) map[string]string {
	t.Helper()
	db, dsn := testenv.Postgres(t)
	now := time.Now().UTC()
	today := now.Truncate(24 * time.Hour)
	past := today.AddDate(0, 0, -3)
	require.NoError(t, outbox.MigrateWith(t.Context(), db, &partition.MigrateOpts{
		Partitioning: partition.Daily, Ahead: 10, Clock: fakeclock.New(past),
	}))
	vars := map[string]string{"DATABASE_URL": dsn}
	r := runInProcess(vars, "", "migrate", "up", "--partition", "daily")
	require.Equal(t, exitOK, r.code, r.stderr)
	clock := testenv.NewClock(past.Add(time.Hour))
	st, err := outbox.NewStore(db, &outbox.Config{Clock: clock, Test: outbox.TestConfig{Clock: clock}})
	require.NoError(t, err)
	e := &env{db: db, dsn: dsn, store: st, clock: clock}
	e.seed(t, event{topic: "order.paid", status: outbox.StatusSent})
	clock.Set(past.AddDate(0, 0, 1).Add(time.Hour))
	e.seed(t, event{topic: "order.paid", status: outbox.StatusNew})
	norm := &normalizer{ids: map[string]string{}, today: today}
	return sampler(t, vars, norm, func(sample sampleFunc) {
		sample("maintain --dry-run", "", "maintain", "--dry-run", "--outbox-retention", "1d", "--inbox-retention", "2d", "--seal-after", "1d", "--ahead", "8")
	})
}

// goldenConsoleRun runs bento console on a migrated SQLite file until it
// serves, then ends its context, as SIGTERM does, and returns what it
// printed, the free port it picked written as 38211.
func goldenConsoleRun(t *testing.T) map[string]string {
	t.Helper()
	vars := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "console.db")}
	r := runInProcess(vars, "", "migrate", "up")
	require.Equal(t, exitOK, r.code, r.stderr)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var out, errb lockedBuffer
	args := []string{"console", "--addr", "127.0.0.1:0"}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, args, strings.NewReader(""), &out, &errb, func(k string) string { return vars[k] })
	}()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "serving on") }, 10*time.Second, 10*time.Millisecond,
		"bento console serves; stderr: %s", errb.String())
	cancel()
	require.Equal(t, exitOK, <-done, errb.String())
	require.Empty(t, errb.String())
	text := "$ bento " + strings.Join(args, " ") + "\n" + out.String()
	return map[string]string{"run: console": regexp.MustCompile(`127\.0\.0\.1:\d+/`).ReplaceAllString(text, "127.0.0.1:38211/")}
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// goldenBrokerRuns runs the samples of the RabbitMQ commands on a fresh
// exchange, named bento.events in the output, with a group named billing.
func goldenBrokerRuns(t *testing.T) map[string]string {
	t.Helper()
	b := newBroker(t)
	group := "gold" + aggregate.NewID()[18:]
	b.ex.Partitioned(group, 2)
	env := map[string]string{"AMQP_URL": b.ex.URL, "BENTO_EXCHANGE": b.ex.Name}
	norm := &normalizer{ids: map[string]string{}, names: map[string]string{b.ex.Name: rabbitmq.DefaultExchange, group: "billing"}}
	return sampler(t, env, norm, func(sample sampleFunc) {
		b.publish(t, "invoice.sent")
		require.Eventually(t, func() bool { return b.depth(t, rabbitmq.UnroutableQueue(b.ex.Name)) == 1 },
			10*time.Second, 20*time.Millisecond)
		sample("unroutable list", "", "unroutable", "list")
		sample("consumer declare", "", "consumer", "declare", "--group", group, "--event-type", "invoice.*", "--partitions", "2")
		sample("unroutable replay", "", "unroutable", "replay", "--yes")
		sample("consumer delete --dry-run", "", "consumer", "delete", "--group", group, "--dry-run")
	})
}

// TestGoldenDocs checks every golden block of docs/cli.md against what
// bento prints, and with -update rewrites them.
func TestGoldenDocs(t *testing.T) {
	want := goldenHelp(t)
	for k, v := range goldenRuns(t) {
		want[k] = v
	}
	for k, v := range goldenConsoleRun(t) {
		want[k] = v
	}
	for k, v := range goldenMaintainRuns(t) {
		want[k] = v
	}
	for k, v := range goldenBrokerRuns(t) {
		want[k] = v
	}
	// Every command has a sample run as well as its -h.
	for _, c := range commands {
		sampled := false
		for key := range want {
			sampled = sampled || key == "run: "+c.name || strings.HasPrefix(key, "run: "+c.name+" ") ||
				strings.HasPrefix(key, "run: "+c.name+",")
		}
		assert.True(t, sampled, "bento %s has no sample run (a \"run: %s ...\" key): add one to the golden runs", c.name, c.name)
	}
	raw, err := os.ReadFile(cliDoc)
	require.NoError(t, err)
	doc := string(raw)
	updated, problems := checkGolden(doc, want)
	if *update {
		if updated != doc {
			require.NoError(t, os.WriteFile(cliDoc, []byte(updated), 0o644))
			t.Logf("rewrote the golden blocks of %s", cliDoc)
		}
		_, problems = checkGolden(updated, want)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if len(problems) > 0 {
		t.Log("if the new output is right, run: go test ./cmd/bento -run Golden -update")
	}

	// The check fails on a block edited by hand.
	keys := goldenKeys(updated)
	require.NotEmpty(t, keys)
	altered := strings.Replace(updated, "usage: bento stats", "usage: bento statz", 1)
	require.NotEqual(t, updated, altered, "the stats -h block is in the document")
	_, problems = checkGolden(altered, want)
	require.Len(t, problems, 1, "an altered block fails the check")
	assert.Contains(t, problems[0], "<!-- golden: stats -h --> differs")
}

// TestGoldenCheckCatchesDrift shows checkGolden failing each kind of drift
// and accepting the document it rewrote.
func TestGoldenCheckCatchesDrift(t *testing.T) {
	t.Parallel()
	want := map[string]string{"a -h": "$ bento a -h\nusage: bento a\n", "b -h": "usage: bento b\n"}
	good := "# Doc\n\n<!-- golden: a -h -->\n```\n$ bento a -h\nusage: bento a\n```\n\ntext\n<!-- golden: b -h -->\n```text\nusage: bento b\n```\n"
	updated, problems := checkGolden(good, want)
	assert.Empty(t, problems)
	assert.Equal(t, strings.Replace(good, "```text", "```", 1), updated, "only the fence's language changes")

	for name, c := range map[string]struct{ doc, want string }{
		"a block differs": {strings.Replace(good, "usage: bento a\n", "usage: bento A\n", 1), "<!-- golden: a -h --> differs"},
		"a line too many": {strings.Replace(good, "usage: bento b\n", "usage: bento b\n  -x\n", 1), "<!-- golden: b -h --> differs"},
		"a block missing": {strings.Replace(good, "<!-- golden: b -h -->", "", 1), `has no block for "b -h"`},
		"a stale block":   {good + "\n<!-- golden: c -h -->\n```\nusage: bento c\n```\n", "<!-- golden: c -h --> names no command"},
		"no fence":        {strings.Replace(good, "```text\nusage: bento b\n```\n", "usage: bento b\n", 1), "<!-- golden: b -h --> is not followed"},
		"a duplicate":     {good + "\n<!-- golden: a -h -->\n```\n$ bento a -h\nusage: bento a\n```\n", "<!-- golden: a -h --> appears twice"},
	} {
		updated, problems := checkGolden(c.doc, want)
		require.NotEmpty(t, problems, name)
		assert.Contains(t, strings.Join(problems, "\n"), c.want, name)
		if name == "a block differs" || name == "a line too many" || name == "no fence" {
			_, again := checkGolden(updated, want)
			assert.Empty(t, again, "%s: the rewritten document passes", name)
		}
	}
}

// TestNormalizerKeepsWidths shows the replacements keep ids and times at
// their width, so the columns of a table stay aligned.
func TestNormalizerKeepsWidths(t *testing.T) {
	t.Parallel()
	n := &normalizer{ids: map[string]string{}}
	in := "01KB2ZQ1X4M8T1S9V0C6N3P7RD  2026-11-28T00:19:27Z  x   \n01KB2ZQ1X4M8T1S9V0C6N3P7RE  01KB2ZQ1X4M8T1S9V0C6N3P7RD\n" +
		`"oldest_pending_age_seconds": 10812.25` + "\n"
	id1, id2 := "01J"+strings.Repeat("0", 22)+"1", "01J"+strings.Repeat("0", 22)+"2"
	want := id1 + "  2026-01-02T03:04:05Z  x\n" + id2 + "  " + id1 + "\n" + `"oldest_pending_age_seconds": 10800` + "\n"
	require.Len(t, id1, 26)
	assert.Equal(t, want, n.normalize(in))

	// Partition dates count from today, which becomes 2026-01-02.
	days := &normalizer{today: time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)}
	assert.Equal(t, "outbox_events_p20251230 inbox_messages_p20260102 outbox_events_p20260110",
		days.normalize("outbox_events_p20261125 inbox_messages_p20261128 outbox_events_p20261206"))
	assert.Equal(t, "outbox_events_p20261125", n.normalize("outbox_events_p20261125"), "without today: as it is")
}
