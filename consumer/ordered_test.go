package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/rabbitmq"
)

// Step is event n of an aggregate in the order tests.
type Step struct {
	N int64 `json:"n"`
}

func (Step) EventType() string { return "ordered.step" }

// Applied is what the order-checking handler records for each event it
// applies: whether its version was the aggregate's last applied plus one.
type Applied struct {
	ID          uint `gorm:"primaryKey"`
	AggregateID string
	Version     int64
	InOrder     bool
	Worker      string
}

// The environment of a worker process (see TestMain).
const (
	envWorker      = "BENTO_CONSUMER_TEST_WORKER"
	envWorkerDSN   = "BENTO_CONSUMER_TEST_DSN"
	envWorkerAMQP  = "BENTO_CONSUMER_TEST_AMQP"
	envWorkerEx    = "BENTO_CONSUMER_TEST_EXCHANGE"
	envWorkerGroup = "BENTO_CONSUMER_TEST_GROUP"
	// envWorkerDelay, a duration, makes the handler wait that long per
	// message, so that a batch takes long enough to be killed in.
	envWorkerDelay = "BENTO_CONSUMER_TEST_DELAY"
	// envWorkerCrash, a message id, makes the handler of that message crash
	// its process (a panic in a goroutine it starts), every time.
	envWorkerCrash = "BENTO_CONSUMER_TEST_CRASH"
	// envWorkerLimits, "DeliveryLimit,MaxCrashes", sets those two fields of
	// the worker's consumer.
	envWorkerLimits = "BENTO_CONSUMER_TEST_LIMITS"
	// envWorkerTakeover, a duration, replaces orderTakeover.
	envWorkerTakeover = "BENTO_CONSUMER_TEST_TAKEOVER"
)

const (
	orderPartitions  = 32
	orderConcurrency = 8
	orderTakeover    = 3 * time.Second
)

func TestMain(m *testing.M) {
	if name := os.Getenv(envWorker); name != "" {
		if err := orderWorker(name); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	consumer.SetMetricsEvery(200 * time.Millisecond)
	os.Exit(m.Run())
}

// orderWorker is one instance of the ordered group, in its own process: it
// applies Steps with an order-checking handler until it is killed.
func orderWorker(name string) error {
	db, err := gorm.Open(postgres.Open(os.Getenv(envWorkerDSN)), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg := consumer.DefaultConfig(os.Getenv(envWorkerGroup))
	cfg.Partitions, cfg.PartitionConcurrency, cfg.TakeoverTime = orderPartitions, orderConcurrency, orderTakeover
	cfg.CloseTimeout = 5 * time.Second
	if l := os.Getenv(envWorkerLimits); l != "" {
		if _, err := fmt.Sscanf(l, "%d,%d", &cfg.DeliveryLimit, &cfg.MaxCrashes); err != nil {
			return fmt.Errorf("%s: %w", envWorkerLimits, err)
		}
	}
	if d, err := time.ParseDuration(os.Getenv(envWorkerTakeover)); err == nil {
		cfg.TakeoverTime = d
	}
	cfg.Logger = log
	c, err := consumer.NewAMQP(context.Background(), db,
		&rabbitmq.Config{URL: os.Getenv(envWorkerAMQP), Exchange: os.Getenv(envWorkerEx), Logger: log}, cfg)
	if err != nil {
		return err
	}
	check := checkOrder(name)
	delay, _ := time.ParseDuration(os.Getenv(envWorkerDelay))
	crash := os.Getenv(envWorkerCrash)
	if err := consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e Step, env *messaging.Envelope) error {
		if crash != "" && env.ID == crash {
			go func() { panic("poison: " + env.ID) }()
			select {} // the panic ends the process
		}
		time.Sleep(delay)
		return check(ctx, tx, e, env)
	}); err != nil {
		return err
	}
	// SIGTERM stops it gracefully: it leaves the group, giving its
	// partitions back.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	return c.Run(ctx)
}

// checkOrder is the order-checking handler: it records each Step it
// applies, in the handler's transaction, with whether its version is the
// aggregate's last applied plus one.
func checkOrder(worker string) consumer.HandlerFunc[Step] {
	return func(ctx context.Context, tx *gorm.DB, e Step, env *messaging.Envelope) error {
		var last int64
		if err := tx.Raw(`SELECT COALESCE(MAX(version), 0) FROM applieds WHERE aggregate_id = ?`, env.AggregateID).
			Scan(&last).Error; err != nil {
			return err
		}
		return tx.Create(&Applied{AggregateID: env.AggregateID, Version: env.AggregateVersion,
			InOrder: env.AggregateVersion == last+1, Worker: worker}).Error
	}
}

// stepMsg is version v of aggregate a's Step, as the relay publishes it.
func stepMsg(t testing.TB, a int, v int64) *message.Message {
	t.Helper()
	body, err := json.Marshal(Step{N: v})
	require.NoError(t, err)
	m, err := messaging.NewMessage(&outbox.Message{ID: fmt.Sprintf("a%03d-%03d", a, v), TenantID: "default",
		Topic: Step{}.EventType(), AggregateType: "thing", AggregateID: fmt.Sprintf("a%03d", a),
		AggregateVersion: v, SchemaVersion: 1, Payload: body, OccurredAt: time.Now().UTC()})
	require.NoError(t, err)
	return m
}

// workers starts and kills worker processes of one test.
type workers struct {
	t     *testing.T
	env   []string
	dir   string
	procs map[string]*exec.Cmd
}

func (w *workers) start(name string) {
	w.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(w.env, envWorker+"="+name)...)
	out, err := os.Create(filepath.Join(w.dir, name+".log"))
	require.NoError(w.t, err)
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(w.t, cmd.Start())
	w.procs[name] = cmd
	w.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = out.Close()
		if w.t.Failed() {
			b, _ := os.ReadFile(out.Name())
			w.t.Logf("log of %s:\n%s", name, tail(b, 4000))
		}
	})
}

func (w *workers) kill(name string) {
	w.t.Helper()
	require.NoError(w.t, w.procs[name].Process.Signal(syscall.SIGKILL))
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// TestPartitionsKeepOrderAcrossKilledWorkersAndADatabaseOutage is the
// order guarantee under attack: 4 worker processes (32 partitions,
// concurrency 8 each) apply 200 aggregates x 50 events with a handler that
// checks each version is the last applied plus one; while the events flow
// one worker is SIGKILLed and another started, then the database is cut
// off for 60 seconds through a TCP proxy. Every event must be applied
// exactly once, in order, and nothing dead-lettered.
func TestPartitionsKeepOrderAcrossKilledWorkersAndADatabaseOutage(t *testing.T) {
	testenv.Stress(t)
	const aggregates, events = 200, 50
	outage := 60 * time.Second
	b := newOrderedBed(t)
	db, group := b.db, b.group

	via, proxy := testenv.Proxied(t, b.dsn)
	w := b.workers(t, via)
	for i := range 4 {
		w.start(fmt.Sprintf("w%d", i))
	}
	members := func() int64 {
		var n int64
		db.Raw(`SELECT count(*) FROM consumer_members WHERE consumer = ?`, group).Scan(&n)
		return n
	}
	testenv.WaitFor(t, 60*time.Second, "4 workers joined", func() bool { return members() == 4 })

	pub, err := rabbitmq.NewPublisher(t.Context(), b.amqp)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	applied := func() int64 { return b.applied(t) }
	for v := int64(1); v <= events; v++ {
		for a := range aggregates {
			require.NoError(t, pub.Publish(Step{}.EventType(), stepMsg(t, a, v)))
		}
		switch v {
		case 15:
			w.kill("w0")
			w.start("w4")
		case 30:
			testenv.WaitFor(t, 60*time.Second, "events applied before the outage", func() bool { return applied() > 0 })
			proxy.Cut()
			t.Logf("database cut off after %d of %d events were applied", applied(), aggregates*events)
			time.AfterFunc(outage, proxy.Restore)
		}
	}
	testenv.WaitFor(t, outage+3*time.Minute, "every event applied", func() bool { return applied() >= aggregates*events })
	b.check(t, aggregates*events)
	var workersSeen int64
	db.Raw(`SELECT count(DISTINCT worker) FROM applieds`).Scan(&workersSeen)
	assert.GreaterOrEqual(t, workersSeen, int64(4), "the work was spread over the workers")
}

// orderedBed is the database and the partitioned topology of a group whose
// instances run as worker processes (see TestMain).
type orderedBed struct {
	db    *gorm.DB
	dsn   string
	ex    *testenv.Exchange
	group string
	amqp  *rabbitmq.Config
}

func newOrderedBed(t *testing.T, configure ...func(*consumer.Config)) *orderedBed {
	t.Helper()
	db, dsn := testenv.Postgres(t)
	ctx := t.Context()
	require.NoError(t, inbox.Migrate(ctx, db))
	require.NoError(t, outbox.Migrate(ctx, db))
	require.NoError(t, db.AutoMigrate(&Applied{}))
	ex := testenv.NewExchange(t)
	group := "ordered" + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)
	ex.Partitioned(group, orderPartitions)
	amqpCfg := &rabbitmq.Config{URL: ex.URL, Exchange: ex.Name, Logger: quiet}
	ccfg := consumer.DefaultConfig(group)
	ccfg.Partitions = orderPartitions
	for _, f := range configure {
		f(ccfg)
	}
	spec := consumer.PartitionSpec(ex.Name, ccfg)
	spec.Patterns = []string{Step{}.EventType()}
	require.NoError(t, rabbitmq.DeclarePartitions(ctx, amqpCfg, spec))
	return &orderedBed{db: db, dsn: dsn, ex: ex, group: group, amqp: amqpCfg}
}

// workers returns the worker processes of the bed, reaching the database
// at dsn, with env added to theirs.
func (b *orderedBed) workers(t *testing.T, dsn string, env ...string) *workers {
	return &workers{t: t, dir: t.TempDir(), procs: map[string]*exec.Cmd{}, env: append([]string{
		envWorkerDSN + "=" + dsn, envWorkerAMQP + "=" + b.ex.URL, envWorkerEx + "=" + b.ex.Name, envWorkerGroup + "=" + b.group,
	}, env...)}
}

// applied returns how many Steps were applied.
func (b *orderedBed) applied(t *testing.T) int64 {
	var n int64
	require.NoError(t, b.db.Model(&Applied{}).Count(&n).Error)
	return n
}

// check asserts that want events were applied, each once, every
// aggregate's in version order, and that nothing was dead-lettered.
func (b *orderedBed) check(t *testing.T, want int) {
	t.Helper()
	time.Sleep(time.Second) // anything applied twice would show up now
	var stats struct{ Total, Distinct, OutOfOrder int64 }
	require.NoError(t, b.db.Raw(`SELECT count(*) AS total,
  count(DISTINCT (aggregate_id, version)) AS distinct,
  count(*) FILTER (WHERE NOT in_order) AS out_of_order FROM applieds`).Scan(&stats).Error)
	dead := deadDepth(t, b.ex.URL, b.group+".dead")
	t.Logf("counted: %d of %d events applied (%d never, %d twice), %d out of order, %d dead-lettered (all healthy)",
		stats.Distinct, want, int64(want)-stats.Distinct, stats.Total-stats.Distinct, stats.OutOfOrder, dead)
	assert.EqualValues(t, want, stats.Total, "applied")
	assert.EqualValues(t, want, stats.Distinct, "each event applied once")
	if !assert.Zero(t, stats.OutOfOrder, "events applied out of version order") {
		var aggs []string
		b.db.Raw(`SELECT DISTINCT aggregate_id FROM applieds WHERE NOT in_order LIMIT 3`).Scan(&aggs)
		for _, a := range aggs {
			var rows []Applied
			b.db.Where("aggregate_id = ?", a).Order("id").Find(&rows)
			var seq []string
			for _, r := range rows {
				seq = append(seq, fmt.Sprintf("%d@%s", r.Version, r.Worker))
			}
			t.Logf("%s applied as %v", a, seq)
		}
	}
	if !assert.Zero(t, dead, "healthy messages dead-lettered") {
		conn, _ := amqp.Dial(b.ex.URL)
		ch, _ := conn.Channel()
		for range 3 {
			d, _, _ := ch.Get(b.group+".dead", true)
			t.Logf("dead letter %s: %v", d.MessageId, d.Headers)
		}
		conn.Close()
	}
}

// TestBatchesSurviveRepeatedKills: one worker process at a time applies a
// backlog of 100 aggregates x 30 events in batches of up to 100, with a
// handler that takes 1 ms per event, and is SIGKILLed 6 times, each time
// in the middle of its batches, and replaced. Every event must be applied
// exactly once, in order, and nothing dead-lettered.
func TestBatchesSurviveRepeatedKills(t *testing.T) {
	testenv.Stress(t)
	const aggregates, events, kills = 100, 30, 6
	b := newOrderedBed(t)
	pub, err := rabbitmq.NewPublisher(t.Context(), b.amqp)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	for v := int64(1); v <= events; v++ {
		for a := range aggregates {
			require.NoError(t, pub.Publish(Step{}.EventType(), stepMsg(t, a, v)))
		}
	}
	w := b.workers(t, b.dsn, envWorkerDelay+"=1ms")
	for i := range kills {
		name := fmt.Sprintf("w%d", i)
		w.start(name)
		before := b.applied(t)
		testenv.WaitFor(t, time.Minute, "the worker applying", func() bool { return b.applied(t) > before+100 })
		w.kill(name)
		t.Logf("killed %s after %d of %d events were applied", name, b.applied(t), aggregates*events)
	}
	w.start("last")
	testenv.WaitFor(t, 3*time.Minute, "every event applied", func() bool { return b.applied(t) >= aggregates*events })
	b.check(t, aggregates*events)
}

// deadDepth returns how many messages wait in the dead-letter queue, 0 if
// it does not exist.
func deadDepth(t *testing.T, amqpURL, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0
	}
	return q.Messages
}
