// Package housekeeping runs bento's retention and partition maintenance
// inside the application, on a schedule, so that no external cron is
// needed: [Run] purges sent outbox rows, old inbox records, expired
// idempotency keys and, for the state tables it is given, processes
// completed long ago, and maintains the partitions of partitioned outbox
// and inbox tables, every [Config].Every.
//
// Every instance of a service may call Run: each job runs once per period
// whatever the number of instances. An instance claims a job's period in
// the table bento_housekeeping (which Run creates) with one statement that
// succeeds only when the period has passed since the job last ran, so the
// others skip it; on PostgreSQL it also holds an advisory lock while the job
// runs, so a job that outlasts its period never runs twice at once.
// Each run of a job is logged, with what it removed, and counted in metrics
// (bento_housekeeping_runs_total, bento_housekeeping_rows_total,
// bento_housekeeping_last_success_timestamp_seconds), labelled by task, not
// job, which Prometheus gives the scrape target. The bento command's
// purge and maintain subcommands stay for manual use.
package housekeeping

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/migrate"
	"github.com/bentoevents/bento/internal/promreg"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/partition"
	"github.com/bentoevents/bento/process"
	"github.com/bentoevents/bento/rabbitmq"
)

// Defaults of Config.
const (
	DefaultEvery           = time.Hour
	DefaultOutboxRetention = 7 * 24 * time.Hour
	DefaultInboxRetention  = 30 * 24 * time.Hour
)

// The jobs, as they are named in logs, metrics and LockKey.
const (
	JobOutboxPurge      = "outbox-purge"
	JobInboxPurge       = "inbox-purge"
	JobIdempotencyPurge = "idempotency-purge"
	JobOutboxMaintain   = "outbox-maintain"
	JobInboxMaintain    = "inbox-maintain"
	JobUnroutableCount  = "unroutable-count"
	// JobBusUnroutablePurge deletes the database bus's unroutable
	// messages older than Config.UnroutableRetention.
	JobBusUnroutablePurge = "bus-unroutable-purge"
	// JobProcessPurge deletes the processes of Config.ProcessTables that
	// completed more than Config.ProcessRetention ago (process.Purge).
	JobProcessPurge = "process-purge"
)

// unroutableScan bounds how many parked events one count reads: the
// oldest ones.
const unroutableScan = 10_000

// ErrInvalidConfig is returned by Run for a bad configuration.
var ErrInvalidConfig = errors.New("housekeeping: invalid config")

// Config configures Run. A zero field means the field's default (DB has
// none and is required); a negative retention turns that job off. A
// negative Every is rejected with [ErrInvalidConfig].
type Config struct {
	// DB is the database of the outbox, inbox and idempotency tables. It
	// has no default: it is required.
	DB *gorm.DB
	// Every is how often each job runs. Defaults to DefaultEvery (1h).
	Every time.Duration
	// OutboxRetention is how long sent outbox rows are kept (and, for a
	// partitioned table, after how long a partition whose rows are all sent
	// is dropped). A negative value turns the outbox jobs off. Defaults to
	// DefaultOutboxRetention (7 days).
	OutboxRetention time.Duration
	// InboxRetention is how long inbox records are kept: the dedup window
	// by message id (see inbox.Purge). A negative value turns the inbox
	// jobs off. Defaults to DefaultInboxRetention (30 days).
	InboxRetention time.Duration
	// KeepIdempotencyKeys turns off the purge of expired idempotency keys.
	// Defaults to false: expired keys are purged.
	KeepIdempotencyKeys bool
	// Unroutable, when set, adds a task that counts the events parked in
	// the unroutable queue of this broker's exchange (relayed while no
	// queue was bound for their type), by event type, in the gauge
	// bento_unroutable_events (of the oldest 10,000), and logs each type
	// found, with how to replay them. Defaults to none.
	Unroutable *rabbitmq.Config
	// UnroutableRetention, when positive, adds a job that deletes the
	// messages the database bus in DB keeps in its unroutable group
	// (published while no group was bound to their topic) once they are
	// older than this (dbbus.PurgeUnroutable). Defaults to zero: off, the
	// database bus keeps them until an operator purges them (bento
	// unroutable purge).
	UnroutableRetention time.Duration
	// ProcessTables names the state tables of process managers whose
	// completed processes are purged once ProcessRetention has passed
	// since they completed (process.Purge). Defaults to none.
	ProcessTables []string
	// ProcessRetention is how long a completed process's row (its
	// tombstone, which makes late messages for it be dropped) is kept.
	// Keep it at least InboxRetention, the window in which a redelivery
	// can still arrive. Defaults to InboxRetention's value (its default
	// when the inbox jobs are off).
	ProcessRetention time.Duration
	// Logger receives a line per run of a job. Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer, when set, receives the metrics. Defaults to none.
	Registerer prometheus.Registerer
	// Clock is the clock the idempotency purge measures expiry from and
	// partition maintenance places partitions by (the outbox and inbox
	// purges use the database's). Defaults to aggregate.SystemClock.
	Clock aggregate.Clock
}

// job is one housekeeping job: run returns the rows (or partitions) it
// removed.
type job struct {
	name string
	run  func(ctx context.Context) (int64, error)
}

// skip is returned by a job that does not apply (a table that is not
// partitioned).
var errSkip = errors.New("not applicable")

// Run runs the jobs cfg enables at once, then every cfg.Every, until ctx
// ends; it returns nil then. A job that fails is logged and counted, and
// runs again at the next round.
//
// Errors: ErrInvalidConfig.
func Run(ctx context.Context, cfg *Config) error {
	var reg prometheus.Registerer
	if cfg != nil {
		reg = cfg.Registerer
	}
	m, err := newMetrics(reg)
	if err != nil {
		return fmt.Errorf("housekeeping: metrics: %w", err)
	}
	c, jobs, err := prepare(cfg, m)
	if err != nil {
		return err
	}
	if err := migrate.Up(ctx, c.DB, "housekeeping", migrate.Folder(migrationFiles)); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("housekeeping: create its table: %w", err)
	}
	tick := time.NewTicker(c.Every)
	defer tick.Stop()
	for {
		for _, j := range jobs {
			if ctx.Err() != nil {
				return nil
			}
			runJob(ctx, c, m, j)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// prepare validates cfg, fills its defaults and lists its jobs.
func prepare(cfg *Config, m metrics) (Config, []job, error) {
	if cfg == nil || cfg.DB == nil {
		return Config{}, nil, fmt.Errorf("%w: DB is required", ErrInvalidConfig)
	}
	c := *cfg
	if _, err := dialect.Of(c.DB); err != nil {
		return c, nil, fmt.Errorf("%w: DB: %w", ErrInvalidConfig, err)
	}
	if c.Every < 0 {
		return c, nil, fmt.Errorf("%w: Every: %v is negative", ErrInvalidConfig, c.Every)
	}
	if c.Every == 0 {
		c.Every = DefaultEvery
	}
	if c.OutboxRetention == 0 {
		c.OutboxRetention = DefaultOutboxRetention
	}
	if c.InboxRetention == 0 {
		c.InboxRetention = DefaultInboxRetention
	}
	if c.ProcessRetention < 0 {
		return c, nil, fmt.Errorf("%w: ProcessRetention: %v is negative", ErrInvalidConfig, c.ProcessRetention)
	}
	if c.ProcessRetention == 0 {
		c.ProcessRetention = c.InboxRetention
		if c.ProcessRetention < 0 {
			c.ProcessRetention = DefaultInboxRetention
		}
	}
	for _, table := range c.ProcessTables {
		if err := process.ValidateTable(table); err != nil {
			return c, nil, fmt.Errorf("%w: ProcessTables: %w", ErrInvalidConfig, err)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = aggregate.SystemClock{}
	}
	db := c.DB
	var jobs []job
	if c.OutboxRetention > 0 {
		store, err := outbox.NewStore(db, nil)
		if err != nil {
			return c, nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		jobs = append(jobs,
			job{JobOutboxPurge, func(ctx context.Context) (int64, error) {
				return store.PurgeSent(ctx, c.OutboxRetention, nil)
			}},
			job{JobOutboxMaintain, func(ctx context.Context) (int64, error) {
				return maintained(outbox.Maintain(ctx, db, &partition.MaintainOpts{Retention: c.OutboxRetention, Clock: c.Clock}))
			}})
	}
	if c.InboxRetention > 0 {
		jobs = append(jobs,
			job{JobInboxPurge, func(ctx context.Context) (int64, error) {
				return inbox.Purge(ctx, db, c.InboxRetention, nil)
			}},
			job{JobInboxMaintain, func(ctx context.Context) (int64, error) {
				return maintained(inbox.Maintain(ctx, db, &partition.MaintainOpts{Retention: c.InboxRetention, Clock: c.Clock}))
			}})
	}
	if c.Unroutable != nil {
		jobs = append(jobs, job{JobUnroutableCount, func(ctx context.Context) (int64, error) {
			return 0, countUnroutable(ctx, c, m.unroutable)
		}})
	}
	if c.UnroutableRetention < 0 {
		return c, nil, fmt.Errorf("%w: UnroutableRetention: %v is negative", ErrInvalidConfig, c.UnroutableRetention)
	}
	if c.UnroutableRetention > 0 {
		jobs = append(jobs, job{JobBusUnroutablePurge, func(ctx context.Context) (int64, error) {
			n, err := dbbus.PurgeUnroutable(ctx, db, c.UnroutableRetention)
			return int64(n), err
		}})
	}
	if tables := c.ProcessTables; len(tables) > 0 {
		jobs = append(jobs, job{JobProcessPurge, func(ctx context.Context) (int64, error) {
			var total int64
			for _, table := range tables {
				n, err := process.Purge(ctx, db, table, c.ProcessRetention, &process.PurgeOpts{Now: c.Clock.Now})
				total += n
				if err != nil {
					return total, err
				}
			}
			return total, nil
		}})
	}
	if !c.KeepIdempotencyKeys {
		jobs = append(jobs, job{JobIdempotencyPurge, func(ctx context.Context) (int64, error) {
			return idempotency.Purge(ctx, db, 0, &idempotency.PurgeOpts{Clock: c.Clock})
		}})
	}
	return c, jobs, nil
}

// countUnroutable counts the parked events by type, sets the gauge and
// logs each type.
func countUnroutable(ctx context.Context, c Config, gauge *prometheus.GaugeVec) error {
	parked, err := rabbitmq.ListUnroutable(ctx, c.Unroutable, rabbitmq.UnroutableFilter{}, unroutableScan)
	if err != nil {
		return err
	}
	byType := map[string]int{}
	for _, m := range parked {
		byType[m.Metadata.Get(messaging.MetaEventType)]++
	}
	gauge.Reset()
	for t, n := range byType {
		gauge.WithLabelValues(t).Set(float64(n))
		c.Logger.Warn("housekeeping: events were relayed while no queue was bound for their type; "+
			"if a group consumes it, declare its queues and run: bento unroutable replay --event-type "+t,
			"event_type", t, "parked", n, "queue", rabbitmq.UnroutableQueue(c.Unroutable.ExchangeName()))
	}
	return nil
}

// maintained turns a maintenance result into the partitions it dropped, or
// errSkip for a table that is not partitioned.
func maintained(res *partition.MaintainResult, err error) (int64, error) {
	if errors.Is(err, partition.ErrNotPartitioned) || errors.Is(err, partition.ErrUnsupported) {
		return 0, errSkip
	}
	if res == nil {
		return 0, err
	}
	return int64(len(res.Dropped)), err
}

// runJob runs j once, under its lock on PostgreSQL, and logs and counts
// the outcome.
func runJob(ctx context.Context, c Config, m metrics, j job) {
	start := time.Now()
	release, held, err := lock(ctx, c.DB, j.name)
	if err != nil {
		if ctx.Err() == nil {
			m.runs.WithLabelValues(j.name, "error").Inc()
			c.Logger.Warn("housekeeping: cannot take the job's lock", "job", j.name, "err", err)
		}
		return
	}
	if !held {
		m.runs.WithLabelValues(j.name, "skipped").Inc()
		c.Logger.Debug("housekeeping: another instance runs the job", "job", j.name)
		return
	}
	defer release()
	claimed, err := claim(ctx, c, j.name)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			m.runs.WithLabelValues(j.name, "error").Inc()
			c.Logger.Warn("housekeeping: cannot claim the job's period", "job", j.name, "err", err)
		}
		return
	case !claimed:
		m.runs.WithLabelValues(j.name, "skipped").Inc()
		c.Logger.Debug("housekeeping: the job ran this period already", "job", j.name)
		return
	}
	n, err := j.run(ctx)
	switch {
	case errors.Is(err, errSkip):
		m.runs.WithLabelValues(j.name, "skipped").Inc()
	case err != nil:
		if ctx.Err() != nil {
			return
		}
		m.runs.WithLabelValues(j.name, "error").Inc()
		m.rows.WithLabelValues(j.name).Add(float64(n))
		c.Logger.Error("housekeeping: job failed", "job", j.name, "removed", n, "err", err)
	default:
		m.runs.WithLabelValues(j.name, "ok").Inc()
		m.rows.WithLabelValues(j.name).Add(float64(n))
		m.lastSuccess.WithLabelValues(j.name).SetToCurrentTime()
		c.Logger.Info("housekeeping: job done", "job", j.name, "removed", n, "took", time.Since(start).Round(time.Millisecond))
	}
}

//go:embed migrations
var migrationFiles embed.FS

// claim takes the current period of job for this instance: it records the
// run and reports true when the job last ran a period ago or more (a tenth
// of a period early, so instances whose rounds drift apart still run it
// once per period), in one statement.
func claim(ctx context.Context, c Config, job string) (bool, error) {
	db := c.DB.WithContext(ctx)
	now := c.Clock.Now().UTC()
	if err := db.Exec(`INSERT INTO bento_housekeeping (task, ran_at) VALUES (?, ?) ON CONFLICT DO NOTHING`,
		job, time.Unix(0, 0).UTC()).Error; err != nil {
		return false, err
	}
	res := db.Exec(`UPDATE bento_housekeeping SET ran_at = ? WHERE task = ? AND ran_at <= ?`,
		now, job, now.Add(-c.Every+c.Every/10))
	return res.RowsAffected == 1, res.Error
}

// LockKey is the PostgreSQL advisory lock key of a job: an instance holds
// it while it runs the job.
func LockKey(job string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("bento.housekeeping." + job))
	return int64(h.Sum64())
}

// lock takes the job's advisory lock on PostgreSQL, on a connection of its
// own, without waiting: held is false when another session holds it. On
// SQLite there is no lock to take.
func lock(ctx context.Context, db *gorm.DB, name string) (release func(), held bool, err error) {
	if d, _ := dialect.Of(db); d != dialect.Postgres {
		return func() {}, true, nil
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, false, err
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return nil, false, err
	}
	key := LockKey(name)
	if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&held); err != nil || !held {
		_ = conn.Close()
		return nil, false, err
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.ExecContext(uctx, "SELECT pg_advisory_unlock($1)", key)
		_ = conn.Close() // a lock left by a failed unlock ends with the session
	}, true, nil
}

// metrics are the housekeeping metrics, by job.
type metrics struct {
	runs        *prometheus.CounterVec
	rows        *prometheus.CounterVec
	lastSuccess *prometheus.GaugeVec
	unroutable  *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bento_housekeeping_runs_total",
			Help: "Runs of a housekeeping job, by task (the job) and result (ok, error, skipped: another instance holds it, or the table is not partitioned).",
		}, []string{"task", "result"}),
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bento_housekeeping_rows_total",
			Help: "Rows (partitions, for the maintain jobs) a housekeeping job removed, by task (the job).",
		}, []string{"task"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "bento_housekeeping_last_success_timestamp_seconds",
			Help: "When a housekeeping job last ran to the end in this process, by task (the job).",
		}, []string{"task"}),
		unroutable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "bento_unroutable_events",
			Help: "Events parked in the exchange's unroutable queue (relayed while no queue was bound for their type), by event type, of the oldest 10,000.",
		}, []string{"event_type"}),
	}
	var err error
	if m.runs, err = promreg.Register(reg, m.runs); err != nil {
		return m, err
	}
	if m.rows, err = promreg.Register(reg, m.rows); err != nil {
		return m, err
	}
	if m.lastSuccess, err = promreg.Register(reg, m.lastSuccess); err != nil {
		return m, err
	}
	if m.unroutable, err = promreg.Register(reg, m.unroutable); err != nil {
		return m, err
	}
	return m, nil
}
