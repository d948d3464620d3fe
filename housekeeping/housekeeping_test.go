package housekeeping_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/housekeeping"
	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/process"
	"github.com/bentoevents/bento/rabbitmq"
)

// seed writes, for each job, a row past its retention and one within it:
// sent outbox rows published 8 days and 1 minute ago (and a pending one),
// inbox records received 31 days and 1 minute ago, idempotency keys that
// expired an hour ago and expire in an hour.
func seed(t *testing.T, db *gorm.DB) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, outbox.Migrate(ctx, db))
	require.NoError(t, inbox.Migrate(ctx, db))
	require.NoError(t, idempotency.Migrate(ctx, db))
	store, err := outbox.NewStore(db, nil)
	require.NoError(t, err)
	now := time.Now().UTC()
	for _, age := range []time.Duration{8 * 24 * time.Hour, time.Minute, -1} {
		m, err := store.Add(ctx, db, "order.placed", map[string]string{"id": "o"}, nil)
		require.NoError(t, err)
		if age >= 0 {
			require.NoError(t, db.Exec(`UPDATE outbox_events SET status = 'sent', published_at = ? WHERE id = ?`,
				now.Add(-age), m.ID).Error)
		}
	}
	for i, age := range []time.Duration{31 * 24 * time.Hour, time.Minute} {
		require.NoError(t, db.Create(&inbox.Record{Consumer: "billing", MessageID: []string{"old", "new"}[i],
			TenantID: "default", ReceivedAt: now.Add(-age)}).Error)
	}
	for i, expires := range []time.Duration{-time.Hour, time.Hour} {
		require.NoError(t, db.Create(&idempotency.Record{TenantID: "default", Key: []string{"old", "new"}[i],
			RequestDigest: "0000000000000000000000000000000000000000000000000000000000000000", State: idempotency.StateCompleted,
			CreatedAt: now.Add(-24 * time.Hour), ExpiresAt: now.Add(expires)}).Error)
	}
}

// counts returns the rows left: sent outbox rows, all outbox rows, inbox
// records, idempotency keys.
func counts(t *testing.T, db *gorm.DB) [4]int64 {
	t.Helper()
	var c [4]int64
	require.NoError(t, db.Model(&outbox.Message{}).Where("status = 'sent'").Count(&c[0]).Error)
	require.NoError(t, db.Model(&outbox.Message{}).Count(&c[1]).Error)
	require.NoError(t, db.Model(&inbox.Record{}).Count(&c[2]).Error)
	require.NoError(t, db.Model(&idempotency.Record{}).Count(&c[3]).Error)
	return c
}

// start runs housekeeping until the test ends.
func start(t *testing.T, cfg *housekeeping.Config) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- housekeeping.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
}

// TestRunRemovesWhatRetentionAllows: one round removes the sent outbox row
// past its retention, the old inbox record and the expired idempotency
// key, and keeps the rest; each job's run and rows are counted.
func TestRunRemovesWhatRetentionAllows(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		seed(t, db)
		assert.Equal(t, [4]int64{2, 3, 2, 2}, counts(t, db))
		reg := prometheus.NewRegistry()
		start(t, &housekeeping.Config{DB: db, Every: 50 * time.Millisecond, Registerer: reg})
		testenv.WaitFor(t, 20*time.Second, "the old rows removed", func() bool { return counts(t, db) == [4]int64{1, 2, 1, 1} })
		ran := func(job, result string) float64 {
			return counter(t, reg, "bento_housekeeping_runs_total", runs(job, result))
		}
		testenv.WaitFor(t, 20*time.Second, "the jobs counted", func() bool {
			return ran(housekeeping.JobOutboxPurge, "ok") >= 1 && ran(housekeeping.JobIdempotencyPurge, "ok") >= 1
		})
		assert.GreaterOrEqual(t, ran(housekeeping.JobInboxPurge, "ok"), 1.0)
		assert.GreaterOrEqual(t, ran(housekeeping.JobOutboxMaintain, "skipped"), 1.0, "the outbox table is not partitioned")
		for _, j := range []string{housekeeping.JobOutboxPurge, housekeeping.JobInboxPurge, housekeeping.JobIdempotencyPurge} {
			assert.Equal(t, 1.0, counter(t, reg, "bento_housekeeping_rows_total", task(j)), j)
		}
		assert.Equal(t, [4]int64{1, 2, 1, 1}, counts(t, db), "later rounds keep what is within retention")
	})
}

// counter returns the value of the counter series of name with labels,
// 0 when there is none.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func runs(task, result string) map[string]string {
	return map[string]string{"task": task, "result": result}
}

func task(name string) map[string]string { return map[string]string{"task": name} }

// TestOneInstanceAtATime: on PostgreSQL a job runs only under its advisory
// lock; while another session holds it, every instance skips the job, and
// once it is free the job runs.
func TestOneInstanceAtATime(t *testing.T) {
	db, _ := testenv.Postgres(t)
	seed(t, db)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	holder, err := sqlDB.Conn(context.Background())
	require.NoError(t, err)
	defer holder.Close()
	_, err = holder.ExecContext(context.Background(), "SELECT pg_advisory_lock($1)", housekeeping.LockKey(housekeeping.JobInboxPurge))
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	start(t, &housekeeping.Config{DB: db, Every: 50 * time.Millisecond, Registerer: reg})
	start(t, &housekeeping.Config{DB: db, Every: 50 * time.Millisecond, Registerer: reg}) // a second instance
	skipped := func() float64 {
		return counter(t, reg, "bento_housekeeping_runs_total", runs(housekeeping.JobInboxPurge, "skipped"))
	}
	testenv.WaitFor(t, 20*time.Second, "the inbox purge skipped by both instances", func() bool { return skipped() >= 4 })
	assert.Equal(t, int64(2), counts(t, db)[2], "the old inbox record is still there")
	assert.Equal(t, int64(1), counts(t, db)[3], "the other jobs ran")

	_, err = holder.ExecContext(context.Background(), "SELECT pg_advisory_unlock($1)", housekeeping.LockKey(housekeeping.JobInboxPurge))
	require.NoError(t, err)
	removed := func() float64 {
		return counter(t, reg, "bento_housekeeping_rows_total", task(housekeeping.JobInboxPurge))
	}
	// The row goes at the purge's commit and the counter moves just after it,
	// so wait for both before comparing.
	testenv.WaitFor(t, 20*time.Second, "the inbox purge once the lock is free", func() bool {
		return counts(t, db)[2] == 1 && removed() >= 1
	})
	time.Sleep(200 * time.Millisecond) // a few more rounds of both instances
	assert.Equal(t, 1.0, removed(), "one instance removed the record")
	assert.Equal(t, int64(1), counts(t, db)[2], "the recent inbox record stays")
}

func TestRunRejectsBadConfig(t *testing.T) {
	err := housekeeping.Run(context.Background(), nil)
	require.ErrorIs(t, err, housekeeping.ErrInvalidConfig)
	err = housekeeping.Run(context.Background(), &housekeeping.Config{DB: testenv.SQLite(t), Every: -time.Second})
	require.ErrorIs(t, err, housekeeping.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "Every")
}

// TestConfigDefaults checks the config convention: zero fields take the
// documented defaults and enable every job, and a negative retention turns
// its jobs off.
func TestConfigDefaults(t *testing.T) {
	db := testenv.SQLite(t)
	require.NoError(t, outbox.Migrate(context.Background(), db))
	c, jobs, err := housekeeping.Prepare(&housekeeping.Config{DB: db})
	require.NoError(t, err)
	assert.Equal(t, time.Hour, c.Every)
	assert.Equal(t, 7*24*time.Hour, c.OutboxRetention)
	assert.Equal(t, 30*24*time.Hour, c.InboxRetention)
	assert.NotNil(t, c.Logger)
	assert.ElementsMatch(t, []string{housekeeping.JobOutboxPurge, housekeeping.JobOutboxMaintain, housekeeping.JobInboxPurge,
		housekeeping.JobInboxMaintain, housekeeping.JobIdempotencyPurge}, jobs)

	_, jobs, err = housekeeping.Prepare(&housekeeping.Config{DB: db, OutboxRetention: -1, InboxRetention: -1, KeepIdempotencyKeys: true})
	require.NoError(t, err)
	assert.Empty(t, jobs, "negative retentions turn their jobs off")

	_, _, err = housekeeping.Prepare(nil)
	require.ErrorIs(t, err, housekeeping.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "DB")
}

// TestThreeInstancesRunEachJobOncePerPeriod: three instances with a period
// of 300 ms on PostgreSQL: each job runs once per period in all (not once
// per instance), and the others' rounds are skipped. A loaded machine only
// delays the rounds, so the test waits for four runs of each job and then
// bounds them by the periods that have begun.
func TestThreeInstancesRunEachJobOncePerPeriod(t *testing.T) {
	db, _ := testenv.Postgres(t)
	seed(t, db)
	const every, want = 300 * time.Millisecond, 4
	reg := prometheus.NewRegistry()
	began := time.Now()
	for range 3 {
		start(t, &housekeeping.Config{DB: db, Every: every, Registerer: reg})
	}
	jobs := []string{housekeeping.JobOutboxPurge, housekeeping.JobInboxPurge, housekeeping.JobIdempotencyPurge}
	ok := func(job string) float64 { return counter(t, reg, "bento_housekeeping_runs_total", runs(job, "ok")) }
	skipped := func(job string) float64 {
		return counter(t, reg, "bento_housekeeping_runs_total", runs(job, "skipped"))
	}
	testenv.WaitFor(t, 30*time.Second, "every job run 4 times, the others' rounds skipped", func() bool {
		return !slices.ContainsFunc(jobs, func(job string) bool { return ok(job) < want || skipped(job) < 2*(want-1) })
	})
	for _, job := range jobs {
		n, skips := ok(job), skipped(job)
		periods := float64(time.Since(began)/every) + 1 // begun by now, the first at start
		assert.LessOrEqual(t, n, periods+1, "%s ran once per period, not once per instance", job)
		t.Logf("%s: %v runs, %v skipped, %v periods begun", job, n, skips, periods)
	}
}

// TestUnroutableEventsAreCounted: with Config.Unroutable, a round counts
// the events parked in the exchange's unroutable queue by event type.
func TestUnroutableEventsAreCounted(t *testing.T) {
	ex := testenv.NewExchange(t)
	amqpCfg := &rabbitmq.Config{URL: ex.URL, Exchange: ex.Name}
	pub, err := rabbitmq.NewPublisher(t.Context(), amqpCfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	for i, typ := range []string{"late.event", "late.event", "other.event"} {
		m := message.NewMessage(fmt.Sprintf("m%d", i), []byte(`{}`))
		m.Metadata.Set(messaging.MetaEventType, typ)
		require.NoError(t, pub.Publish(typ, m))
	}
	testenv.WaitFor(t, 20*time.Second, "the events parked", func() bool {
		n, err := rabbitmq.QueueDepth(t.Context(), amqpCfg, rabbitmq.UnroutableQueue(ex.Name))
		return err == nil && n == 3
	})
	db := testenv.SQLite(t)
	seed(t, db)
	reg := prometheus.NewRegistry()
	start(t, &housekeeping.Config{DB: db, Every: time.Hour, Unroutable: amqpCfg, Registerer: reg})
	gauge := func(typ string) float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "bento_unroutable_events" {
				for _, m := range mf.GetMetric() {
					if m.GetLabel()[0].GetValue() == typ {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		return 0
	}
	testenv.WaitFor(t, 20*time.Second, "the counts", func() bool { return gauge("late.event") == 2 && gauge("other.event") == 1 })
	n, err := rabbitmq.QueueDepth(t.Context(), amqpCfg, rabbitmq.UnroutableQueue(ex.Name))
	require.NoError(t, err)
	assert.Equal(t, 3, n, "counting leaves them parked")
}

// processRow is a process manager's state model, for the process purge.
type processRow struct {
	process.Base
	Status string
}

func (processRow) TableName() string { return "hk_processes" }

// TestRunPurgesCompletedProcesses: with ProcessTables set, a round deletes
// the processes that completed more than ProcessRetention ago (by the
// configured clock) and keeps running and recently completed ones; a bad
// table name or a negative retention is refused at start.
func TestRunPurgesCompletedProcesses(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		require.NoError(t, db.AutoMigrate(&processRow{}))
		now := time.Now().UTC()
		old, recent := now.Add(-40*24*time.Hour), now.Add(-time.Hour)
		rows := []processRow{
			{Base: process.Base{TenantID: "default", Key: "running", StartedAt: old, UpdatedAt: old}},
			{Base: process.Base{TenantID: "default", Key: "done-long-ago", Completed: true, CompletedAt: &old, StartedAt: old, UpdatedAt: old}},
			{Base: process.Base{TenantID: "t2", Key: "done-long-ago", Completed: true, CompletedAt: &old, StartedAt: old, UpdatedAt: old}},
			{Base: process.Base{TenantID: "default", Key: "done-lately", Completed: true, CompletedAt: &recent, StartedAt: old, UpdatedAt: recent}},
		}
		require.NoError(t, db.Create(&rows).Error)
		reg := prometheus.NewRegistry()
		start(t, &housekeeping.Config{DB: db, Every: 50 * time.Millisecond, Registerer: reg, ProcessTables: []string{"hk_processes"},
			OutboxRetention: -1, InboxRetention: -1, KeepIdempotencyKeys: true}) // only the process purge: 30 days
		left := func() []string {
			var keys []string
			require.NoError(t, db.Model(&processRow{}).Order("process_key").Pluck("process_key", &keys).Error)
			return keys
		}
		testenv.WaitFor(t, 20*time.Second, "the old tombstones removed", func() bool { return len(left()) == 2 })
		assert.Equal(t, []string{"done-lately", "running"}, left())
		testenv.WaitFor(t, 20*time.Second, "the job counted", func() bool {
			return counter(t, reg, "bento_housekeeping_rows_total", task(housekeeping.JobProcessPurge)) == 2
		})
	})

	db := testenv.SQLite(t)
	_, _, err := housekeeping.Prepare(&housekeeping.Config{DB: db, ProcessTables: []string{"bad-name"}})
	require.ErrorIs(t, err, housekeeping.ErrInvalidConfig)
	require.ErrorIs(t, err, process.ErrInvalidTable)
	_, _, err = housekeeping.Prepare(&housekeeping.Config{DB: db, ProcessTables: []string{"p"}, ProcessRetention: -time.Hour})
	require.ErrorIs(t, err, housekeeping.ErrInvalidConfig)
	c, jobs, err := housekeeping.Prepare(&housekeeping.Config{DB: db, ProcessTables: []string{"p"}, OutboxRetention: -1,
		InboxRetention: 90 * 24 * time.Hour})
	require.NoError(t, err)
	assert.Contains(t, jobs, housekeeping.JobProcessPurge)
	assert.Equal(t, 90*24*time.Hour, c.ProcessRetention, "defaults to the inbox's retention")
}
