package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
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

// TestSmokeSteady runs the steady scenario briefly, bento and the peer:
// every committed event must arrive, with a latency for each.
func TestSmokeSteady(t *testing.T) {
	t.Parallel()
	e := testEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := steadyConfig{Rates: []float64{200}, Duration: time.Second, Warmup: 200 * time.Millisecond, Writers: 4, Accounts: 40,
		Idle: 500 * time.Millisecond, PeerPolls: []time.Duration{10 * time.Millisecond}, PeerMaxRate: 200}
	res, err := runSteady(ctx, e, cfg, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Idle) != 2 || res.Idle[0].Key != "bento" || res.Idle[0].Seconds < 0.5 {
		t.Errorf("idle measurements %+v, want bento's and the peer's, 0.5 s each", res.Idle)
	}
	if len(res.Points) != 2 {
		t.Fatalf("%d points, want bento and the peer", len(res.Points))
	}
	for _, p := range res.Points {
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
	rep := &Report{Runs: 1, Steady: summarizeSteady([]steadyResult{res}, cfg)}
	if rep.Steady.Rows[1].PeerOverBentoP50 <= 0 || charts(rep)["steady"] == "" {
		t.Errorf("summary %+v", rep.Steady.Rows)
	}
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
	if len(res) != len(consumeModes) {
		t.Fatalf("%d measurements, want one per mode: %v", len(res), consumeModes)
	}
	for _, r := range res {
		if r.Rate <= 0 || r.Messages != 300 {
			t.Errorf("%s: %d messages at %v/s", consumeKey(r.Mode, r.Handler, r.Consumers), r.Messages, r.Rate)
		}
	}
	if c := summarizeConsume([]consumeResult{res}, cfg); c.Rows[0].Ratio <= 0 || c.Rows[0].Batched <= 0 || c.Rows[0].BareRatio <= 0 {
		t.Errorf("summary %+v", c.Rows)
	}
}
