package chaos

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/tcpproxy"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/rabbitmq"
	"github.com/bentoevents/bento/uow"
)

// campaign is one run of Run.
type campaign struct {
	t      testing.TB
	sys    *System
	cfg    Config
	runID  string
	dir    string
	db     *gorm.DB
	units  *uow.Manager
	clock  *skewClock
	amqp   *rabbitmq.Config // the broker, directly (nil off RabbitMQ)
	dead   *consumer.DeadLetters
	args   []string
	childT childSpec // what every process shares
	log    *slog.Logger
	start  time.Time

	mu       sync.Mutex
	slots    map[string]*slot
	churned  int
	timeline []string

	commands, commandErrors atomic.Int64
}

// Run attacks sys on cfg's stack: it starts the projectors and each
// group's instances as processes of their own (the test binary, running
// the calling test again: see IsChild), runs the writers' commands for
// cfg.Duration while the faults of a schedule drawn from cfg.Seed strike,
// heals every fault, waits up to cfg.Settle for the system to apply what
// was committed, and then checks the ledgers: what the writers and
// handlers committed against what each group applied and dead-lettered.
// Each violation fails t; the Report says what ran and what was found.
//
// In a process Run started, Run plays its part and exits the process
// instead of returning.
func Run(t testing.TB, sys *System, cfg *Config) *Report {
	if raw := os.Getenv(envChild); raw != "" {
		runChild(sys, raw)
	}
	t.Helper()
	c := cfg.withDefaults()
	if c.Seed == 0 {
		c.Seed = randomSeed()
	}
	if err := c.validate(sys); err != nil {
		t.Fatalf("%v", err)
	}
	if c.Dir == "" {
		c.Dir = t.TempDir()
	}
	k := &campaign{t: t, sys: sys, cfg: c, runID: randomHex(4), dir: c.Dir, slots: map[string]*slot{}, clock: &skewClock{},
		log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
	t.Logf("chaos: %s, seed %d, run %s, %v of faults, logs in %s", c.Stack, c.Seed, k.runID, c.Duration, k.dir)
	k.args = []string{os.Args[0], "-test.run=" + runPattern(t.Name()), "-test.timeout=0", "-test.count=1"}
	if err := k.setup(); err != nil {
		t.Fatalf("chaos: set up: %v", err)
	}
	report := k.run()
	t.Logf("chaos: %s", report)
	for i, v := range report.Violations {
		if i == 50 {
			t.Errorf("chaos: and %d more violations", len(report.Violations)-50)
			break
		}
		t.Errorf("chaos: %s", v)
	}
	if len(report.Violations) > 0 {
		t.Errorf("chaos: seed %d: %s; replay the schedule with Config.Seed = %d", c.Seed, summary(report.Violations), c.Seed)
	}
	return report
}

// runPattern is a -test.run pattern that selects exactly the test named.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])>>1 + 1
}

// loopback reports whether host:port names this machine.
func loopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// setup creates the run's schema (or SQLite file), tables, queues and
// processes.
func (k *campaign) setup() error {
	ctx := context.Background()
	c := k.cfg
	k.childT = childSpec{Stack: c.Stack, RunID: k.runID}
	var pgURL *url.URL
	switch {
	case c.Stack.postgres():
		u, _ := url.Parse(c.PostgresDSN)
		if !loopback(u.Host) {
			return fmt.Errorf("%w: PostgresDSN must reach a loopback address, not %s", ErrInvalidConfig, u.Host)
		}
		admin, err := gorm.Open(postgres.Open(c.PostgresDSN), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
		if err != nil {
			return err
		}
		schema := "chaos_" + k.runID
		if err := admin.Exec("CREATE SCHEMA " + schema).Error; err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
		k.t.Cleanup(func() {
			if c.Keep {
				k.t.Logf("chaos: kept schema %s", schema)
				return
			}
			if err := admin.Exec("DROP SCHEMA " + schema + " CASCADE").Error; err != nil {
				k.t.Errorf("chaos: drop schema %s: %v", schema, err)
			}
			if sqlDB, err := admin.DB(); err == nil {
				_ = sqlDB.Close()
			}
		})
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		pgURL = u
		k.childT.DSN = u.String()
	default:
		k.childT.DSN = filepath.Join(k.dir, "chaos.db")
	}
	db, err := openDB(c.Stack, k.childT.DSN)
	if err != nil {
		return err
	}
	k.db = db
	k.t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	for _, m := range []func(context.Context, *gorm.DB) error{outbox.Migrate, inbox.Migrate, dbbus.Migrate} {
		if err := m(ctx, db); err != nil {
			return err
		}
	}
	if err := migrateLedgers(db); err != nil {
		return err
	}
	if k.sys.Migrate != nil {
		if err := k.sys.Migrate(ctx, db); err != nil {
			return fmt.Errorf("System.Migrate: %w", err)
		}
	}
	if k.units, err = newUnits(db, k.sys, k.clock); err != nil {
		return err
	}
	if c.Stack == PostgresRabbitMQ {
		u, _ := url.Parse(c.AMQPURL)
		if !loopback(u.Host) {
			return fmt.Errorf("%w: AMQPURL must reach a loopback address, not %s", ErrInvalidConfig, u.Host)
		}
		k.amqp = &rabbitmq.Config{URL: c.AMQPURL, Exchange: "chaos." + k.runID, Logger: k.log}
		k.childT.AMQPURL, k.childT.Exchange = c.AMQPURL, k.amqp.Exchange
		k.dead = consumer.RabbitMQDeadLetters(k.amqp)
		if !c.Keep {
			k.t.Cleanup(k.deleteQueues)
		}
	} else {
		k.dead = consumer.DatabaseDeadLetters(db)
	}
	for _, g := range k.sys.Groups {
		cfg := consumerConfig(g, k.runID, k.log)
		switch {
		case k.amqp != nil:
			err = consumer.Declare(ctx, k.amqp, cfg, g.Topics...)
		case cfg.Partitions > 0:
			err = dbbus.DeclarePartitions(ctx, db, cfg.Group, cfg.Partitions, g.Topics...)
		default:
			err = dbbus.DeclareGroup(ctx, db, cfg.Group, g.Topics...)
		}
		if err != nil {
			return fmt.Errorf("declare group %s: %w", g.Name, err)
		}
	}
	k.t.Cleanup(k.stopAll)
	for _, p := range k.processes() {
		if err := k.addSlot(p.name, p.role, p.group, pgURL); err != nil {
			return err
		}
	}
	return nil
}

// addSlot starts a supervised process, with proxies of its own on its
// links.
func (k *campaign) addSlot(name, role, group string, pgURL *url.URL) error {
	spec := k.childT
	spec.Role, spec.Group = role, group
	s := newSlot(name, spec, k.args, k.dir)
	if pgURL != nil {
		p, err := tcpproxy.Start(pgURL.Host)
		if err != nil {
			return err
		}
		s.db = p
		u := *pgURL
		u.Host = p.Addr()
		s.spec.DSN = u.String()
	}
	if k.amqp != nil {
		u, _ := url.Parse(k.cfg.AMQPURL)
		p, err := tcpproxy.StartAMQP(u.Host)
		if err != nil {
			s.close()
			return err
		}
		s.mq = p
		u.Host = p.Addr()
		s.spec.AMQPURL = u.String()
	}
	k.mu.Lock()
	k.slots[name] = s
	k.mu.Unlock()
	go s.supervise()
	return nil
}

// process is one of the campaign's first slots.
type process struct{ name, role, group string }

// processes returns the campaign's first slots, the projectors then each
// group's instances: what setup starts and the targets the schedule draws
// from.
func (k *campaign) processes() []process {
	var out []process
	for i := range k.cfg.Projectors {
		out = append(out, process{fmt.Sprintf("projector-%d", i+1), roleProjector, ""})
	}
	for _, g := range k.sys.Groups {
		for i := range k.cfg.Instances {
			out = append(out, process{fmt.Sprintf("%s-%d", g.Name, i+1), roleConsumer, g.Name})
		}
	}
	return out
}

func (k *campaign) slot(name string) *slot {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.slots[name]
}

// note adds a line to the timeline of what happened.
func (k *campaign) note(format string, args ...any) {
	line := fmt.Sprintf("%7.1fs ", time.Since(k.start).Seconds()) + fmt.Sprintf(format, args...)
	k.mu.Lock()
	k.timeline = append(k.timeline, line)
	k.mu.Unlock()
}

// stopAll stops every process and closes the proxies.
func (k *campaign) stopAll() {
	k.mu.Lock()
	slots := make([]*slot, 0, len(k.slots))
	for _, s := range k.slots {
		slots = append(slots, s)
	}
	k.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range slots {
		wg.Go(func() {
			s.stop(20 * time.Second)
			s.close()
		})
	}
	wg.Wait()
}

// deleteQueues deletes the run's queues and exchanges on the broker.
func (k *campaign) deleteQueues() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, g := range k.sys.Groups {
		last := i == len(k.sys.Groups)-1
		if _, err := consumer.Delete(ctx, k.amqp, groupName(g.Name, k.runID), &consumer.DeleteOpts{Force: true, Topology: last}); err != nil && !errors.Is(err, messaging.ErrQueueNotFound) {
			k.t.Logf("chaos: delete group %s: %v", g.Name, err)
		}
	}
}

// run writes, strikes, heals, settles and checks.
func (k *campaign) run() *Report {
	c := k.cfg
	r := &Report{Stack: c.Stack, Seed: c.Seed, Duration: c.Duration, Groups: map[string]GroupCounts{}}
	var groups []string
	for _, g := range k.sys.Groups {
		groups = append(groups, g.Name)
	}
	var names []string
	for _, p := range k.processes() {
		names = append(names, p.name)
	}
	r.Schedule = schedule(c.Seed, c.Faults, c.Duration, c.MeanGap, names, groups, c.Stack.postgres())
	r.Faults = countFaults(r.Schedule)
	k.start = time.Now()

	ctx, stop := context.WithTimeout(context.Background(), c.Duration)
	var wg sync.WaitGroup
	k.write(ctx, &wg)
	for _, e := range r.Schedule {
		wg.Go(func() {
			select {
			case <-time.After(e.At - time.Since(k.start)):
			case <-ctx.Done():
				return
			}
			k.strike(ctx, e)
		})
	}
	<-ctx.Done()
	wg.Wait()
	stop()
	k.mu.Lock()
	for _, s := range k.slots {
		s.heal()
	}
	k.mu.Unlock()
	k.note("every fault healed; writers stopped")
	healed := time.Now()

	views := k.views(false)
	deadline := healed.Add(c.Settle)
	for {
		l, err := readLedger(context.Background(), k.db)
		if err == nil {
			complete := true
			for _, v := range views {
				if _, ok, _ := check(l, v, false); !ok {
					complete = false
				}
			}
			if complete {
				r.Complete = true
				break
			}
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
		views = k.views(false)
	}
	r.Quiet = time.Since(healed)
	k.note("settled: complete=%v", r.Complete)

	views = k.views(true)
	l, err := readLedger(context.Background(), k.db)
	if err != nil {
		k.t.Fatalf("chaos: %v", err)
	}
	r.Commits = len(l.commits)
	for _, v := range views {
		counts, _, vs := check(l, v, true)
		r.Groups[v.name] = counts
		r.Violations = append(r.Violations, vs...)
	}
	r.Commands, r.CommandErrors = int(k.commands.Load()), int(k.commandErrors.Load())
	k.mu.Lock()
	for _, s := range k.slots {
		s.mu.Lock()
		r.Starts += s.starts
		s.mu.Unlock()
	}
	r.Timeline = k.timeline
	k.mu.Unlock()
	return r
}

// views reads each group's dead letters (and, when final, its holds and
// parked events).
func (k *campaign) views(final bool) []*groupView {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []*groupView
	for _, g := range k.sys.Groups {
		v := &groupView{name: g.Name, run: groupName(g.Name, k.runID), topics: g.Topics, ordered: g.Partitions > 0, maxLag: k.cfg.MaxLag}
		dead, err := k.dead.List(ctx, v.run, consumer.DeadFilter{}, 1_000_000)
		if err != nil && !errors.Is(err, messaging.ErrQueueNotFound) {
			v.inspectErr = fmt.Errorf("list dead letters: %w", err)
		}
		v.dead = dead
		if final {
			in, err := consumer.Inspect(k.db, v.run, nil)
			if err == nil {
				v.held, err = in.Holds(ctx, inbox.ParkedFilter{}, 100_000)
			}
			if err == nil {
				v.parked, err = in.Parked(ctx, inbox.ParkedFilter{}, 100_000)
			}
			if err != nil {
				v.inspectErr = err
			}
		}
		out = append(out, v)
	}
	return out
}

// write runs the writers until ctx ends.
func (k *campaign) write(ctx context.Context, wg *sync.WaitGroup) {
	c := k.cfg
	tokens := make(chan struct{})
	wg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(c.Rate))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				select {
				case tokens <- struct{}{}:
				default: // the writers are behind: the rate is a ceiling
				}
			}
		}
	})
	for i := range c.Writers {
		rng := mrand.New(mrand.NewPCG(c.Seed, uint64(i)+1))
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-tokens:
				}
				k.command(context.WithoutCancel(ctx), rng, 0)
			}
		})
	}
}

// aggregateID picks the aggregate of a command.
func (k *campaign) aggregateID(rng *mrand.Rand) string {
	n := rng.IntN(k.cfg.Aggregates)
	if k.cfg.Hot > 0 && rng.IntN(5) == 0 {
		n = rng.IntN(k.cfg.Hot)
	}
	return fmt.Sprintf("a%05d", n)
}

// command runs one of the System's commands, holding its transaction
// open for hold before it commits.
func (k *campaign) command(ctx context.Context, rng *mrand.Rand, hold time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, hold+30*time.Second)
	defer cancel()
	id := k.aggregateID(rng)
	err := k.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
		if err := k.sys.Command(ctx, u, id, rng); err != nil {
			return err
		}
		if hold > 0 {
			time.Sleep(hold)
		}
		return nil
	})
	k.commands.Add(1)
	if err != nil {
		k.commandErrors.Add(1)
	}
}

// strike applies one fault and heals it when it is over (or when ctx
// ends, at the end of the campaign).
func (k *campaign) strike(ctx context.Context, e Event) {
	wait := func(d time.Duration) {
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	s := k.slot(e.Target)
	k.note("%s", e.String()[9:])
	switch e.Fault {
	case Kill:
		s.signal(syscall.SIGKILL)
	case Pause:
		s.signal(syscall.SIGSTOP)
		wait(e.For)
		s.signal(syscall.SIGCONT)
	case CrashLoop:
		rng := mrand.New(mrand.NewPCG(uint64(e.At), 1))
		for range e.Times {
			next := s.nextStart()
			s.signal(syscall.SIGKILL)
			select {
			case <-next:
			case <-ctx.Done():
				return
			}
			wait(time.Duration(100+rng.IntN(900)) * time.Millisecond)
		}
	case Churn:
		k.mu.Lock()
		k.churned++
		name := fmt.Sprintf("%s-c%d", e.Target, k.churned)
		k.mu.Unlock()
		var pgURL *url.URL
		if k.cfg.Stack.postgres() {
			pgURL, _ = url.Parse(k.childT.DSN)
		}
		if err := k.addSlot(name, roleConsumer, e.Target, pgURL); err != nil {
			k.note("churn %s: %v", name, err)
			return
		}
		wait(e.For)
		added := k.slot(name)
		added.stop(20 * time.Second)
		added.close()
		k.mu.Lock()
		delete(k.slots, name)
		k.mu.Unlock()
	case DBCut, BrokerCut, DBHang, BrokerHang, DBSlow, BrokerSlow:
		p := s.db
		if strings.HasPrefix(string(e.Fault), "broker") {
			p = s.mq
		}
		switch e.Fault {
		case DBCut, BrokerCut:
			p.Cut()
			wait(e.For)
			p.Restore()
		case DBHang, BrokerHang:
			p.Stall()
			wait(e.For)
			p.Resume()
		default:
			p.Slow(e.Skew)
			wait(e.For)
			p.Slow(0)
		}
	case LongTx:
		k.command(context.Background(), mrand.New(mrand.NewPCG(uint64(e.At), 2)), e.For)
	case ClockSkew:
		k.clock.offset.Store(int64(e.Skew))
		wait(e.For)
		k.clock.offset.Store(0)
	case Analyze:
		var tables []string
		k.db.Raw(`SELECT tablename FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables)
		for _, tb := range tables {
			k.db.Exec(`ANALYZE "` + tb + `"`)
		}
	}
}
