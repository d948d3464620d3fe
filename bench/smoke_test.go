package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// testEnv returns an env on the test servers (BENTO_TEST_POSTGRES_DSN,
// BENTO_TEST_AMQP_URL, else the defaults), skipping the test when one is
// unreachable, or failing it when CI is set.
func testEnv(t *testing.T) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("a smoke run against PostgreSQL and RabbitMQ; skipped with -short")
	}
	unavailable := func(what, how string, err error) {
		t.Helper()
		msg := fmt.Sprintf("%s unreachable (%v); %s", what, err, how)
		if os.Getenv("CI") != "" {
			t.Fatalf("%s (CI is set, so this is a failure)", msg)
		}
		t.Skip(msg)
	}
	dsn := os.Getenv("BENTO_TEST_POSTGRES_DSN")
	if dsn == "" {
		dsn = "host=127.0.0.1 port=5432 user=postgres dbname=test sslmode=disable"
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("BENTO_TEST_POSTGRES_DSN: %v", err)
	}
	// The program appends search_path to a keyword/value DSN.
	kv := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, cfg.User, cfg.Database)
	if cfg.Password != "" {
		kv += " password='" + strings.ReplaceAll(cfg.Password, "'", `\'`) + "'"
	}
	e := &env{pgDSN: kv, amqpURL: os.Getenv("BENTO_TEST_AMQP_URL"),
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if e.amqpURL == "" {
		e.amqpURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	db, err := sql.Open("pgx", e.pgDSN)
	if err == nil {
		err = db.Ping()
		db.Close()
	}
	if err != nil {
		unavailable("PostgreSQL", "start it (scripts/services.sh) or set BENTO_TEST_POSTGRES_DSN", err)
	}
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		unavailable("RabbitMQ", "start it (scripts/services.sh) or set BENTO_TEST_AMQP_URL", err)
	}
	conn.Close()
	return e
}

// smokeSteadyConfig is the steady scenario as the smoke tests run it,
// measuring idle CPU when idle is set.
func smokeSteadyConfig(idle bool) steadyConfig {
	cfg := steadyConfig{Rates: []float64{200}, Duration: time.Second, Warmup: 200 * time.Millisecond, Writers: 4, Accounts: 40,
		PeerPolls: []time.Duration{10 * time.Millisecond}, PeerMaxRate: 200}
	if idle {
		cfg.Idle = 500 * time.Millisecond
	}
	return cfg
}

// TestSmokeSteady runs the steady scenario briefly, bento (through
// RabbitMQ and through the database bus) and the peer: every committed
// event must arrive, with a latency for each.
func TestSmokeSteady(t *testing.T) {
	t.Parallel()
	e := testEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := smokeSteadyConfig(true)
	res, err := runSteady(ctx, e, cfg, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Idle) != 2 || res.Idle[0].Key != "bento" || res.Idle[0].Seconds < 0.5 {
		t.Errorf("idle measurements %+v, want bento's and the peer's, 0.5 s each", res.Idle)
	}
	checkSteady(t, res, cfg)
}

// TestSmokeSteadyUnderOpenTransaction runs the steady smoke run while an
// unrelated session holds a transaction open: bento must deliver every
// event as in TestSmokeSteady; the peer, whose watermill-sql subscriber
// reads only below the cluster's oldest open transaction, stalls, and that
// is reported, not a failure. Not parallel: the open transaction would
// stall the peer of the other smoke runs too.
func TestSmokeSteadyUnderOpenTransaction(t *testing.T) {
	e := testEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	holdTransactionOpen(ctx, t, e)
	cfg := smokeSteadyConfig(false)
	res, err := runSteady(ctx, e, cfg, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	if !checkSteady(t, res, cfg) {
		t.Errorf("the peer did not report a stall behind the open transaction")
	}
}

// checkSteady checks a steady smoke run. Bento strictly: some events
// committed, every committed one received, with a latency each. The peer
// as strictly, unless its run reports a stall behind a transaction open
// since before it: watermill-sql's subscriber then receives nothing
// committed after that transaction began, which is the peer's property,
// logged and returned (peerStalled), not a failure of bento's suite.
func checkSteady(t *testing.T, res steadyResult, cfg steadyConfig) (peerStalled bool) {
	t.Helper()
	if len(res.Points) != 3 {
		t.Fatalf("%d points, want bento, bento on the database bus and the peer", len(res.Points))
	}
	for _, p := range res.Points {
		if p.Family == "peer" && p.Stalled != nil && p.Stalled.OpenTransactions > 0 {
			peerStalled = true
			t.Logf("%s: received %d of %d committed events; %s (the peer's subscriber reads only below the oldest open transaction): reported, not checked",
				p.Key, p.Received, p.Committed, p.Stalled)
			continue
		}
		// How many commit depends on the machine's load; that some do,
		// and that each arrives, does not.
		if p.Committed == 0 || p.Scheduled != 200 {
			t.Errorf("%s: %d of %d committed, want 200 scheduled, some committed", p.Key, p.Committed, p.Scheduled)
		}
		if p.Received != p.Committed || p.Latency.Count != p.Received || p.Unknown != 0 {
			t.Errorf("%s: %d committed, %d received, %d latencies, %d unknown", p.Key, p.Committed, p.Received,
				p.Latency.Count, p.Unknown)
		}
		if p.Latency.P50 <= 0 || p.Latency.P50 > p.Latency.P99 {
			t.Errorf("%s: p50 %v ms, p99 %v ms", p.Key, p.Latency.P50, p.Latency.P99)
		}
	}
	if res.Points[0].Family != "bento" {
		t.Errorf("first point %s, want bento's", res.Points[0].Key)
	}
	rep := &Report{Runs: 1, Steady: summarizeSteady([]steadyResult{res}, cfg)}
	peer := slices.IndexFunc(rep.Steady.Rows, func(r SteadyRow) bool { return r.Family == "peer" })
	if charts(rep)["steady"] == "" || peer < 0 || !peerStalled && rep.Steady.Rows[peer].PeerOverBentoP50 <= 0 {
		t.Errorf("summary %+v", rep.Steady.Rows)
	}
	return peerStalled
}

// TestSmokeConsume runs the consumer scenario briefly: every mode must
// apply every message once (runConsume checks the tables).
func TestSmokeConsume(t *testing.T) {
	t.Parallel()
	e := testEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := consumeConfig{Messages: 300, Concurrency: []int{2}, Handlers: []string{"write"}, Modes: consumeModes}
	res, err := runConsumeScenario(ctx, e, cfg, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	checkConsume(t, res, cfg)
	if c := summarizeConsume([]consumeResult{res}, cfg); c.Rows[0].Ratio <= 0 || c.Rows[0].Batched <= 0 || c.Rows[0].BareRatio <= 0 {
		t.Errorf("summary %+v", c.Rows)
	}
}

// TestSmokeConsumeUnderOpenTransaction runs the database modes of the
// consumer scenario while an unrelated session holds a transaction open:
// bento's consumer on the database bus must apply every message once, as
// in TestSmokeConsume; the peer, watermill-sql's subscriber, which reads
// only below the cluster's oldest open transaction, stalls, and that is
// reported, not a failure. (Without the report it waited for the
// messages until the test's deadline and failed.) Not parallel: the open
// transaction would stall the peer of the other smoke runs too.
func TestSmokeConsumeUnderOpenTransaction(t *testing.T) {
	e := testEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	holdTransactionOpen(ctx, t, e)
	cfg := consumeConfig{Messages: 300, Concurrency: []int{2}, Handlers: []string{"write"}, Modes: []string{"dbbus", "wmsql"}}
	res, err := runConsumeScenario(ctx, e, cfg, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	if !checkConsume(t, res, cfg) {
		t.Errorf("the peer did not report a stall behind the open transaction")
	}
	if c := summarizeConsume([]consumeResult{res}, cfg); c.Rows[0].Database <= 0 || c.Rows[0].WatermillSQL != 0 {
		t.Errorf("summary %+v: want the database bus's rate, and none for the stalled peer", c.Rows)
	}
}

// checkConsume checks a consume smoke run: one measurement per mode, each
// with every message handled at some rate. The "wmsql" mode as strictly,
// unless it reports a stall behind a transaction open since before its
// messages were published, which is the peer's property, logged and
// returned (peerStalled), not a failure of bento's suite.
func checkConsume(t *testing.T, res consumeResult, cfg consumeConfig) (peerStalled bool) {
	t.Helper()
	if len(res) != len(cfg.Modes) {
		t.Fatalf("%d measurements, want one per mode: %v", len(res), cfg.Modes)
	}
	for _, r := range res {
		key := consumeKey(r.Mode, r.Handler, r.Consumers)
		if r.Mode == "wmsql" && r.Stalled != nil && r.Stalled.OpenTransactions > 0 {
			peerStalled = true
			t.Logf("%s: %s (the peer's subscriber reads only below the oldest open transaction): reported, not checked", key, r.Stalled)
			continue
		}
		if r.Rate <= 0 || r.Messages != cfg.Messages || r.Stalled != nil {
			t.Errorf("%s: %d messages at %v/s, stalled %v", key, r.Messages, r.Rate, r.Stalled)
		}
	}
	return peerStalled
}

// holdTransactionOpen opens a transaction with an id in another session
// and keeps it open until the test ends.
func holdTransactionOpen(ctx context.Context, t *testing.T, e *env) {
	t.Helper()
	db, err := sql.Open("pgx", e.pgDSN+" application_name=bench-open-transaction")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	var xid int64
	if err := tx.QueryRowContext(ctx, "SELECT txid_current()").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	t.Logf("transaction %d open in another session for the whole run", xid)
}

// TestSmokeScheduled runs the scheduled scenario briefly: bento's
// projector and the bare poller must each deliver every scheduled message,
// none before its due time by more than the clocks' rounding, and the
// cancellation, whose first cancels start after their messages fell due
// and so race the release, must lose none, deliver none whose cancel
// committed, and deliver none twice.
func TestSmokeScheduled(t *testing.T) {
	t.Parallel()
	e := testEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := scheduledConfig{Messages: 300, Spread: time.Second, Lead: 3 * time.Second, Writers: 2,
		PeerPoll: 10 * time.Millisecond, CancelMessages: 400, CancelSpread: 500 * time.Millisecond, CancelRate: 1000, Cancellers: 4,
		CancelAhead:  -200 * time.Millisecond, // the first cancels race the release
		CancelsPerTx: 3, CancelPeer: true}     // 67 transactions, the last of two
	res, err := runScheduled(ctx, e, cfg, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Relays) != 2 || res.Relays[0].Key != "bento" || res.Relays[1].Key != "bare-poller" {
		t.Fatalf("relays %+v, want bento's and the bare poller's", res.Relays)
	}
	for _, r := range res.Relays {
		if r.Received != cfg.Messages || r.Lag.Count != cfg.Messages || r.Unknown != 0 || r.Duplicates != 0 {
			t.Errorf("%s: %d of %d received, %d lags, %d unknown, %d duplicates", r.Key, r.Received, cfg.Messages,
				r.Lag.Count, r.Unknown, r.Duplicates)
		}
		// Lag is the consumer's clock minus the due time, which bento
		// stamps at microseconds: a message may appear a microsecond early.
		if r.Lag.P50 > r.Lag.P99 || r.Lag.P50 < -0.01 {
			t.Errorf("%s: lag p50 %v ms, p99 %v ms", r.Key, r.Lag.P50, r.Lag.P99)
		}
	}
	c := res.Cancel
	if c == nil {
		t.Fatal("no cancellation measurement")
	}
	if c.Attempted != cfg.CancelMessages/2 || c.Cancelled+c.TooLate != c.Attempted || c.Failed != 0 || c.Achieved <= 0 {
		t.Errorf("cancel: %+v", c)
	}
	t.Logf("cancel: %d cancelled, %d too late (released first, so delivered)", c.Cancelled, c.TooLate)
	if groups := (c.Attempted + 2) / 3; c.PerTransaction != 3 || c.Cancel.Count != groups || c.PeerCancel.Count != groups || c.PeerAchieved <= 0 {
		t.Errorf("cancel: %d per transaction, %d transactions, the peer's %d at %v/s; want 3 per transaction, %d transactions each",
			c.PerTransaction, c.Cancel.Count, c.PeerCancel.Count, c.PeerAchieved, groups)
	}
	if c.Lost != 0 || c.CancelledDelivered != 0 || c.Duplicates != 0 || c.Unknown != 0 || c.Received != c.Expected {
		t.Errorf("cancel: %d lost, %d cancelled but delivered, %d duplicates, %d unknown, %d of %d expected received",
			c.Lost, c.CancelledDelivered, c.Duplicates, c.Unknown, c.Received, c.Expected)
	}
	rep := &Report{Runs: 1, Scheduled: summarizeScheduled([]scheduledResult{res}, cfg)}
	if s := rep.Scheduled; len(s.Rows) != 2 || s.BentoOverPeerP50 <= 0 || s.CancelOverPeer <= 0 || len(rep.targets()) != 5 {
		t.Errorf("summary %+v, targets %+v", s, rep.targets())
	}
	printReport(io.Discard, rep)
}
