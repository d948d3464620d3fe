package bentotest

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/dberr"
	"github.com/bentoevents/bento/internal/embeddb"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/uow"
)

// Options adjust New. A nil *Options means defaults.
type Options struct {
	// Start is where the clock starts. Defaults to DefaultStart.
	Start time.Time
	// Tenant is the units of work's default tenant. Defaults to "default".
	Tenant string
	// DrainTimeout bounds Drain. Defaults to 10s.
	DrainTimeout time.Duration
}

// UnroutableQueue is the env bus's alternate queue: it receives the events
// that no consumer group is bound to.
const UnroutableQueue = "bentotest.unroutable"

// Env is an in-memory bento for one test: SQLite in a temporary directory
// with the outbox, inbox and idempotency tables, the in-memory bus, a
// unit-of-work manager and a projector, on a fake clock. Close runs at the
// test's cleanup.
type Env struct {
	// DB is the database. Migrate your own models with Env.Migrate.
	DB *gorm.DB
	// Bus is the in-memory bus the projector publishes to.
	Bus *messaging.MemoryBus
	// Units is the unit-of-work manager (on Clock and Outbox).
	Units *uow.Manager
	// Outbox is the outbox store.
	Outbox *outbox.Store
	// Clock stamps events and rows.
	Clock *Clock
	// Projector relays the outbox; Drain runs it.
	Projector *projector.OutboxProjector

	drainTimeout time.Duration
	mu           sync.Mutex
	published    []*message.Message
}

// New returns a ready Env, removed at the end of the test.
func New(t TB, opts *Options) *Env {
	t.Helper()
	if opts == nil {
		opts = &Options{}
	}
	start := opts.Start
	if start.IsZero() {
		start = DefaultStart
	}
	dir, err := os.MkdirTemp("", "bentotest")
	if err != nil {
		t.Fatalf("bentotest: temp dir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	db, err := embeddb.Open(filepath.Join(dir, "bento.db"), nil)
	if err != nil {
		t.Fatalf("bentotest: %v", err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	ctx := context.Background()
	for _, m := range []func(context.Context, *gorm.DB) error{outbox.Migrate, inbox.Migrate, idempotency.Migrate} {
		if err := m(ctx, db); err != nil {
			t.Fatalf("bentotest: migrate: %v", err)
		}
	}
	clock := NewClock(start)
	store, err := outbox.NewStore(db, &outbox.Config{Stamper: clock})
	if err != nil {
		t.Fatalf("bentotest: %v", err)
	}
	units, err := uow.New(db, &uow.Config{Outbox: store, Tenant: opts.Tenant})
	if err != nil {
		t.Fatalf("bentotest: %v", err)
	}
	e := &Env{DB: db, Bus: messaging.NewMemoryBus(), Units: units, Outbox: store, Clock: clock, drainTimeout: opts.DrainTimeout}
	if e.drainTimeout <= 0 {
		e.drainTimeout = 10 * time.Second
	}
	t.Cleanup(func() { _ = e.Bus.Close() })
	// Events no started consumer is bound to are published to an alternate
	// queue, as RabbitMQ's alternate exchange does in production.
	if err := e.Bus.DeclareAlternate(UnroutableQueue); err != nil {
		t.Fatalf("bentotest: %v", err)
	}
	// The projector judges what is due by the later of the fake clock and
	// the real one, so rows written by code with its own unit-of-work
	// manager (on the system clock) are relayed too.
	relayStore, err := outbox.NewStore(db, &outbox.Config{Stamper: dueClock{clock}})
	if err != nil {
		t.Fatalf("bentotest: %v", err)
	}
	cfg := projector.DefaultConfig()
	cfg.Logger = quiet
	cfg.DisableNotify = true
	cfg.WorkerID = "bentotest"
	cfg.MaxAttempts = 3
	e.Projector, err = projector.New(relayStore, recordingPublisher{e}, cfg)
	if err != nil {
		t.Fatalf("bentotest: %v", err)
	}
	return e
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Migrate creates the tables of your models.
func (e *Env) Migrate(t TB, models ...any) {
	t.Helper()
	if err := e.DB.AutoMigrate(models...); err != nil {
		t.Fatalf("bentotest: migrate models: %v", err)
	}
}

// dueClock is the projector's clock: the later of the fake and real times.
type dueClock struct{ c *Clock }

func (d dueClock) Now() time.Time {
	if real := time.Now().UTC(); real.After(d.c.Now()) {
		return real
	}
	return d.c.Now()
}

func (d dueClock) NewID(t time.Time) string { return d.c.NewID(t) }

// recordingPublisher publishes to the bus and remembers what it accepted.
type recordingPublisher struct{ e *Env }

func (r recordingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := r.e.Bus.Publish(topic, msgs...); err != nil {
		return err
	}
	r.e.mu.Lock()
	defer r.e.mu.Unlock()
	for _, m := range msgs {
		r.e.published = append(r.e.published, m.Copy())
	}
	return nil
}

func (recordingPublisher) Close() error { return nil }

// Consumer returns a consumer of group on the env's bus, with fast retries
// (3, from 1ms) so failing handlers settle quickly. Register handlers with
// consumer.Handle, then Start it.
func (e *Env) Consumer(group string) (*consumer.Consumer, error) {
	cfg := consumer.DefaultConfig(group)
	cfg.MaxRetries = 3
	cfg.RetryInitialInterval = time.Millisecond
	cfg.RetryMaxInterval = 5 * time.Millisecond
	cfg.Logger = quiet
	return consumer.NewMemory(e.DB, e.Bus, cfg)
}

// MustConsumer is Consumer for tests: it fails t on error.
func (e *Env) MustConsumer(t TB, group string) *consumer.Consumer {
	t.Helper()
	c, err := e.Consumer(group)
	if err != nil {
		t.Fatalf("bentotest: consumer %s: %v", group, err)
	}
	return c
}

// Start runs c until the end of the test and returns once it is
// subscribed, so events relayed from now on reach it.
func (e *Env) Start(t TB, c *consumer.Consumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-c.Running():
	case err := <-done:
		cancel()
		t.Fatalf("bentotest: consumer %s stopped: %v", c.Group(), err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatalf("bentotest: consumer %s did not start", c.Group())
	}
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// busyHint is what Drain's failure says when consumers stay busy past
// Options.DrainTimeout: the likely cause, and its fix.
const busyHint = "a handler may be writing through a *gorm.DB outside its message's transaction " +
	"(on SQLite such a write waits for the lock that transaction holds); write through the tx the handler receives"

// DrainResult counts what Drain relayed.
type DrainResult struct {
	// Published is how many events the projector published.
	Published int
	// Failed is how many publishes failed (for example no consumer group is
	// bound to the event's topic, so the bus refused it).
	Failed int
}

// Drain relays everything committed and waits until every started consumer
// has handled what reached it; events the handlers commit are relayed and
// handled too, until nothing moves. It fails t after Options.DrainTimeout.
// Consumers that stay busy that long are most often a handler writing
// through a *gorm.DB of its own (Env.DB captured in a closure) instead of
// the transaction it receives: on SQLite that write waits for the lock its
// message's transaction holds (and the relay, marking events sent, waits
// for it too), and the failure says so.
func (e *Env) Drain(t TB) DrainResult {
	t.Helper()
	var total DrainResult
	deadline := time.Now().Add(e.drainTimeout)
	for {
		res, err := e.Projector.Drain(context.Background())
		if err != nil && dberr.IsTransient(err) && !e.Bus.Idle() {
			// The relay waited for a lock while consumers were busy.
			t.Fatalf("bentotest: drain: %v, with consumers busy: %s", err, busyHint)
		}
		if err != nil {
			t.Fatalf("bentotest: drain: %v", err)
		}
		total.Published += res.Published
		total.Failed += res.Failed
		for !e.Bus.Idle() {
			if time.Now().After(deadline) {
				t.Fatalf("bentotest: consumers still busy after %v: %s", e.drainTimeout, busyHint)
			}
			time.Sleep(time.Millisecond)
		}
		if res.Claimed == 0 {
			return total
		}
		if time.Now().After(deadline) {
			t.Fatalf("bentotest: outbox still relaying after %v", e.drainTimeout)
		}
	}
}

// Published returns the messages the projector published, in order.
func (e *Env) Published() []*message.Message {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*message.Message, len(e.published))
	for i, m := range e.published {
		out[i] = m.Copy()
	}
	return out
}
