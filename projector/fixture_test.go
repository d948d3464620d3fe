package projector_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/uow"
)

// Counter is the aggregate whose events the suite relays.
type Counter struct {
	aggregate.Base
	N int
}

func (*Counter) AggregateType() string { return "counter" }

type Ticked struct {
	CounterID string `json:"counter_id"`
	N         int    `json:"n"`
}

func (Ticked) EventType() string { return "counter.ticked" }

func (c *Counter) Tick() {
	c.N++
	c.Record(Ticked{CounterID: c.ID, N: c.N})
}

// delivery is one message a publisher accepted.
type delivery struct {
	topic string
	env   *messaging.Envelope
}

// recorder is a custom Watermill publisher: any message.Publisher can carry
// the outbox. It records what it accepted, in order, and fails on demand.
type recorder struct {
	mu         sync.Mutex
	deliveries []delivery
	// fail, when set, decides per message whether the publish fails.
	fail func(env *messaging.Envelope) error
	// notify receives each accepted event id, when set.
	notify chan string
}

func (r *recorder) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		env, err := messaging.Decode(msg)
		if err != nil {
			return err
		}
		r.mu.Lock()
		fail := r.fail
		r.mu.Unlock()
		if fail != nil {
			if err := fail(env); err != nil {
				return err
			}
		}
		r.mu.Lock()
		r.deliveries = append(r.deliveries, delivery{topic: topic, env: env})
		r.mu.Unlock()
		if r.notify != nil {
			r.notify <- env.ID
		}
	}
	return nil
}

func (r *recorder) Close() error { return nil }

func (r *recorder) setFail(f func(env *messaging.Envelope) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = f
}

func (r *recorder) all() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.deliveries...)
}

// countByID returns how often each event id was accepted.
func (r *recorder) countByID() map[string]int {
	out := map[string]int{}
	for _, d := range r.all() {
		out[d.env.ID]++
	}
	return out
}

// env is a migrated database with a unit-of-work manager and outbox store.
type env struct {
	db    *gorm.DB
	store *outbox.Store
	units *uow.Manager
}

func setup(t testing.TB, db *gorm.DB) *env {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, outbox.Migrate(ctx, db))
	require.NoError(t, db.AutoMigrate(&Counter{}))
	store, err := outbox.NewStore(db, nil)
	require.NoError(t, err)
	units, err := uow.New(db, &uow.Config{Outbox: store})
	require.NoError(t, err)
	return &env{db: db, store: store, units: units}
}

// commit creates counters ids[i] with ticks events each, in one unit per
// counter, and returns every committed event id (stamped by the unit of
// work), counter by counter in version order.
func (e *env) commit(t testing.TB, ids []string, ticks int) []string {
	t.Helper()
	var events []string
	for _, id := range ids {
		c := &Counter{}
		c.ID = id
		for i := 0; i < ticks; i++ {
			c.Tick()
		}
		require.NoError(t, e.units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error {
			return u.Add(c)
		}))
		var ids []string
		require.NoError(t, e.db.Model(&outbox.Message{}).Where("aggregate_id = ?", id).
			Order("aggregate_version").Pluck("id", &ids).Error)
		require.Len(t, ids, ticks)
		events = append(events, ids...)
	}
	return events
}

func (e *env) count(t testing.TB, where string, args ...any) int64 {
	t.Helper()
	var n int64
	q := e.db.Model(&outbox.Message{})
	if where != "" {
		q = q.Where(where, args...)
	}
	require.NoError(t, q.Count(&n).Error)
	return n
}

// fastConfig is a projector config for tests: small batches, quick retries.
func fastConfig() *projector.Config {
	cfg := projector.DefaultConfig()
	cfg.BatchSize = 50
	cfg.MaxAttempts = 5
	cfg.BackoffFloor = time.Millisecond
	cfg.BackoffCeiling = 5 * time.Millisecond
	cfg.Lease = 5 * time.Second
	cfg.PublishTimeout = time.Second
	cfg.BusySleep = time.Millisecond
	cfg.IdleSleep = 20 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return cfg
}

var errBroker = errors.New("broker said no")

func counterIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("c-%03d", i)
	}
	return ids
}

var _ = testenv.Backends
