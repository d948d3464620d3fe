package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/messaging"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// env is what every scenario needs: where the servers are and a logger.
type env struct {
	pgDSN   string // keyword/value DSN without search_path
	amqpURL string
	log     *slog.Logger
}

// randomHex returns n random bytes as lowercase hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// pgSchema is a fresh PostgreSQL schema that a run works in.
type pgSchema struct {
	Name string
	DSN  string // e.DSN with search_path set to Name
	env  *env
}

// newSchema creates the schema bench_<random>.
func (e *env) newSchema(ctx context.Context) (*pgSchema, error) {
	name := "bench_" + randomHex(5)
	if err := e.adminExec(ctx, "CREATE SCHEMA "+name); err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}
	return &pgSchema{Name: name, DSN: e.pgDSN + " search_path=" + name, env: e}, nil
}

// drop drops the schema and everything in it.
func (s *pgSchema) drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return s.env.adminExec(ctx, "DROP SCHEMA IF EXISTS "+s.Name+" CASCADE")
}

// gorm opens a GORM handle on the schema, with a pool of at most maxConns.
func (s *pgSchema) gorm(maxConns int) (*gorm.DB, error) {
	return s.gormAs("", maxConns)
}

// gormAs is gorm whose connections set application_name to app (none
// when empty), so their backends can be found in pg_stat_activity.
func (s *pgSchema) gormAs(app string, maxConns int) (*gorm.DB, error) {
	dsn := s.DSN
	if app != "" {
		dsn += " application_name=" + app
	}
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("open gorm: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(maxConns)
	sqlDB.SetMaxIdleConns(maxConns)
	return db, nil
}

// emptyOutboxSQL empties outbox_events and the tables whose rows stand
// for its rows: the partitioned layout reserves dedup keys and aggregate
// versions in side tables that TRUNCATE's lack of row triggers would
// leave full.
const emptyOutboxSQL = `DO $$
BEGIN
    TRUNCATE outbox_events;
    IF to_regclass('outbox_aggregate_versions') IS NOT NULL THEN
        TRUNCATE outbox_aggregate_versions;
    END IF;
    IF to_regclass('outbox_dedup_keys') IS NOT NULL THEN
        TRUNCATE outbox_dedup_keys;
    END IF;
END
$$`

// closeGorm closes the pool behind db.
func closeGorm(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

func (e *env) adminExec(ctx context.Context, q string) error {
	db, err := sql.Open("pgx", e.pgDSN)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, q)
	return err
}

// amqpNames are a fresh exchange and queue ("bench.<random>" and
// "bench.<random>.q") for one measurement.
type amqpNames struct {
	Exchange string
	Queue    string
}

func newAMQPNames() amqpNames {
	x := "bench." + randomHex(5)
	return amqpNames{Exchange: x, Queue: x + ".q"}
}

// withChannel dials the broker and runs fn on a channel.
func (e *env) withChannel(fn func(*amqp.Channel) error) error {
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		return fmt.Errorf("dial AMQP: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	return fn(ch)
}

// deleteTopology deletes the queue and exchange of n, and the alternate
// exchange and queue bento declares beside them ("<exchange>.unroutable").
// Names that do not exist are fine.
func (e *env) deleteTopology(n amqpNames) error {
	var errs []error
	del := func(what string, f func(*amqp.Channel) error) {
		// A failed delete closes the channel, so each gets its own.
		if err := e.withChannel(f); err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.NotFound {
				return
			}
			errs = append(errs, fmt.Errorf("delete %s: %w", what, err))
		}
	}
	for _, q := range []string{n.Queue, n.Exchange + ".unroutable"} {
		del("queue "+q, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(q, false, false, false); return err })
	}
	for _, x := range []string{n.Exchange, n.Exchange + ".unroutable"} {
		del("exchange "+x, func(ch *amqp.Channel) error { return ch.ExchangeDelete(x, false, false) })
	}
	return errors.Join(errs...)
}

// deletePartitions deletes the partition queues of group and its
// consistent-hash exchange on exchange, logging what it could not delete.
func (e *env) deletePartitions(exchange, group string, n int) {
	for p := range n {
		q := messaging.PartitionQueue(group, p)
		if err := e.withChannel(func(ch *amqp.Channel) error { _, err := ch.QueueDelete(q, false, false, false); return err }); err != nil {
			e.log.Warn("cleanup", "queue", q, "err", err)
		}
	}
	x := exchange + ".hash." + group
	if err := e.withChannel(func(ch *amqp.Channel) error { return ch.ExchangeDelete(x, false, false) }); err != nil {
		e.log.Warn("cleanup", "exchange", x, "err", err)
	}
}

// queueDepth returns how many messages the queue holds.
func queueDepth(ch *amqp.Channel, queue string) (int, error) {
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// waitDepth polls the queue until it holds at least want messages or the
// timeout passes, and returns the last depth seen.
func (e *env) waitDepth(ctx context.Context, queue string, want int, timeout time.Duration) (int, error) {
	var depth int
	err := e.withChannel(func(ch *amqp.Channel) error {
		deadline := time.Now().Add(timeout)
		for {
			var err error
			if depth, err = queueDepth(ch, queue); err != nil {
				return err
			}
			if depth >= want {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("queue %s holds %d messages after %v, want %d", queue, depth, timeout, want)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	return depth, err
}

// Machine describes where the figures were measured.
type Machine struct {
	CPU        string `json:"cpu"`
	Cores      int    `json:"cores"`
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	Go         string `json:"go"`
	PostgreSQL string `json:"postgresql"`
	RabbitMQ   string `json:"rabbitmq"`
}

func (e *env) machine(ctx context.Context) (Machine, error) {
	m := Machine{
		CPU:    cpuModel(),
		Cores:  runtime.NumCPU(),
		GOOS:   runtime.GOOS,
		GOARCH: runtime.GOARCH,
		Go:     runtime.Version(),
	}
	db, err := sql.Open("pgx", e.pgDSN)
	if err != nil {
		return m, err
	}
	defer db.Close()
	if err := db.QueryRowContext(ctx, "SHOW server_version").Scan(&m.PostgreSQL); err != nil {
		return m, fmt.Errorf("PostgreSQL version: %w", err)
	}
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		return m, fmt.Errorf("dial AMQP: %w", err)
	}
	defer conn.Close()
	product, _ := conn.Properties["product"].(string)
	version, _ := conn.Properties["version"].(string)
	m.RabbitMQ = strings.TrimSpace(product + " " + version)
	return m, nil
}

// cpuModel reads the first "model name" of /proc/cpuinfo.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// loadAverage returns the 1, 5 and 15 minute load averages of
// /proc/loadavg, or nil where there is none.
func loadAverage() []float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	return parseLoadAvg(string(b))
}

// parseLoadAvg reads the three load averages at the start of the contents
// of /proc/loadavg, or returns nil.
func parseLoadAvg(s string) []float64 {
	f := strings.Fields(s)
	if len(f) < 3 {
		return nil
	}
	out := make([]float64, 3)
	for i := range out {
		x, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return nil
		}
		out[i] = x
	}
	return out
}

// loadText is a load average as /proc/loadavg and uptime print it.
func loadText(l []float64) string {
	if len(l) == 0 {
		return "unknown"
	}
	s := make([]string, len(l))
	for i, x := range l {
		s[i] = strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strings.Join(s, " ")
}
