package bentotest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/internal/conf"
	"github.com/bentoevents/bento/internal/dberr"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/tenant"
	"github.com/bentoevents/bento/uow"
)

// ErrInvalidOptions is what New fails its test with for bad Options; the
// failure names every bad field.
var ErrInvalidOptions = errors.New("bentotest: invalid options")

// DefaultDrainTimeout is Options.DrainTimeout's default.
const DefaultDrainTimeout = 10 * time.Second

// Options adjust New. A nil *Options or a zero field means the field's
// default; a negative DrainTimeout or a malformed Tenant fails the test
// with [ErrInvalidOptions].
type Options struct {
	// Start is where the clock starts. Defaults to DefaultStart.
	Start time.Time
	// Tenant is the units of work's default tenant. Defaults to "default".
	Tenant string
	// DrainTimeout bounds Drain. Defaults to DefaultDrainTimeout (10s).
	DrainTimeout time.Duration
}

// withDefaults returns a copy of o (nil means zero Options) with its
// defaults filled in, and names every bad field.
func (o *Options) withDefaults() (Options, error) {
	out := conf.Value(o)
	var p conf.Problems
	if out.Start.IsZero() {
		out.Start = DefaultStart
	}
	if out.Tenant == "" {
		out.Tenant = tenant.Default
	} else if err := tenant.Validate(out.Tenant); err != nil {
		p.Add("Tenant", err)
	}
	conf.Default(&p, "DrainTimeout", &out.DrainTimeout, DefaultDrainTimeout)
	return out, p.Err(ErrInvalidOptions)
}

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
	// Clock gives committed events their ids and times (it is the
	// outbox store's Clock).
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
	o, err := opts.withDefaults()
	if err != nil {
		t.Fatalf("%v", err)
	}
	start := o.Start
	dir, err := os.MkdirTemp("", "bentotest")
	if err != nil {
		t.Fatalf("bentotest: temp dir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	clock := NewClock(start)
	// The bus parks events no started consumer is bound to in
	// messaging.MemoryUnroutableQueue, as RabbitMQ's alternate exchange
	// does in production.
	bus := messaging.NewMemoryBus()
	t.Cleanup(func() { _ = bus.Close() })
	e := &Env{Bus: bus, Clock: clock, drainTimeout: o.DrainTimeout}
	stack, err := embedded.Open(context.Background(), &embedded.Config{
		Path:      filepath.Join(dir, "bento.db"),
		Publisher: recordingPublisher{e},
		Outbox:    &outbox.Config{Clock: clock, Test: outbox.TestConfig{ScheduleClock: clock}},
		Units:     &uow.Config{Tenant: o.Tenant},
		Projector: &projector.Config{Logger: quiet, DisableNotify: true, WorkerID: "bentotest", MaxAttempts: 3},
	})
	if err != nil {
		t.Fatalf("bentotest: %v", err)
	}
	t.Cleanup(func() { _ = stack.Close() })
	e.DB, e.Units, e.Outbox, e.Projector = stack.DB, stack.Units, stack.Outbox, stack.Projector
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
	return consumer.NewMemory(e.DB, e.Bus, &consumer.Config{
		Group: group, MaxRetries: 3, RetryInitialInterval: time.Millisecond, RetryMaxInterval: 5 * time.Millisecond, Logger: quiet,
	})
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

// waitIdle waits until every started consumer has handled what reached
// it, and fails t at deadline.
func (e *Env) waitIdle(t TB, deadline time.Time) {
	t.Helper()
	for !e.Bus.Idle() {
		if time.Now().After(deadline) {
			t.Fatalf("bentotest: consumers still busy after %v: %s", e.drainTimeout, busyHint)
		}
		time.Sleep(time.Millisecond)
	}
}

// DrainResult counts what Drain relayed.
type DrainResult struct {
	// Published is how many events the projector published.
	Published int
	// Failed is how many publishes failed. An event no consumer group is
	// bound to does not fail: the bus parks it in
	// messaging.MemoryUnroutableQueue.
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
		e.waitIdle(t, deadline)
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

// Advance moves the clock on by d, stopping at each due time on the way:
// at each it releases the scheduled messages due then and drains (see
// Drain), so they are relayed and handled in due order, and so is
// everything their handlers commit, including messages they schedule that
// fall due before the end. Then it drains once more at the end time. Time
// moves only when the test moves it, so what fires, and in which order, is
// the same on every run. It returns what all the drains relayed.
func (e *Env) Advance(t TB, d time.Duration) DrainResult {
	t.Helper()
	end := e.Clock.Now().Add(d)
	var total DrainResult
	for {
		r := e.Drain(t)
		total.Published += r.Published
		total.Failed += r.Failed
		next, err := e.Outbox.ListScheduled(context.Background(), outbox.ScheduledFilter{Limit: 1})
		if err != nil {
			t.Fatalf("bentotest: advance: %v", err)
		}
		if len(next) == 0 || next[0].DueAt.After(end) {
			break
		}
		if !next[0].DueAt.After(e.Clock.Now()) {
			t.Fatalf("bentotest: advance: scheduled message %s is due but the drain did not release it", next[0].ID)
		}
		e.Clock.Set(next[0].DueAt)
	}
	if end.After(e.Clock.Now()) {
		e.Clock.Set(end)
		r := e.Drain(t)
		total.Published += r.Published
		total.Failed += r.Failed
	}
	return total
}

// Scheduled returns the scheduled messages still waiting, first due
// first (see outbox.Store.ListScheduled), up to 1,000.
func (e *Env) Scheduled(t TB) []outbox.ScheduledMessage {
	t.Helper()
	got, err := e.Outbox.ListScheduled(context.Background(), outbox.ScheduledFilter{Limit: 1000})
	if err != nil {
		t.Fatalf("bentotest: scheduled: %v", err)
	}
	return got
}
