package projector_test

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
)

// TestRelayDeliversEachEventOnce drains committed events through a custom
// publisher and checks the wire format and the rows left behind.
func TestRelayDeliversEachEventOnce(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db)
		ctx := context.Background()
		events := e.commit(t, counterIDs(7), 3)
		rec := &recorder{}
		reg := prometheus.NewRegistry()
		cfg := fastConfig()
		cfg.Registerer = reg
		p, err := projector.New(e.store, rec, cfg)
		require.NoError(t, err)

		res, err := p.Drain(ctx)
		require.NoError(t, err)
		assert.Equal(t, 21, res.Published)
		assert.Equal(t, 0, res.Failed)

		counts := rec.countByID()
		assert.Len(t, counts, len(events))
		for _, id := range events {
			assert.Equal(t, 1, counts[id], "event %s delivered once", id)
		}
		for _, d := range rec.all() {
			assert.Equal(t, "counter.ticked", d.topic)
			assert.Equal(t, "counter.ticked", d.env.EventType)
			assert.Equal(t, "counter", d.env.AggregateType)
			assert.Equal(t, "default", d.env.TenantID)
			assert.Equal(t, 1, d.env.SchemaVersion)
			assert.Equal(t, d.env.ID, d.env.CorrelationID, "a chain starts at its first event")
			assert.False(t, d.env.OccurredAt.IsZero())
			var tick Ticked
			require.NoError(t, json.Unmarshal(d.env.Payload, &tick))
			assert.Equal(t, d.env.AggregateID, tick.CounterID)
			assert.Equal(t, int(d.env.AggregateVersion), tick.N)
		}
		assert.Equal(t, int64(21), e.count(t, "status = 'sent' AND published_at IS NOT NULL AND locked_by IS NULL"))

		again, err := p.Drain(ctx)
		require.NoError(t, err)
		assert.Equal(t, projector.Result{}, again, "nothing is relayed twice")

		assert.Equal(t, 21.0, counterSum(t, reg, "bento_outbox_published_total"))
		assert.Equal(t, 0.0, gauge(t, reg, "bento_outbox_backlog", "status", "new"))
		assert.Equal(t, 0.0, gauge(t, reg, "bento_outbox_backlog", "status", "publishing"))
	})
}

func TestDeleteOnSuccess(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db)
		e.commit(t, counterIDs(3), 2)
		cfg := fastConfig()
		cfg.DeleteOnSuccess = true
		rec := &recorder{}
		p, err := projector.New(e.store, rec, cfg)
		require.NoError(t, err)
		res, err := p.Drain(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 6, res.Published)
		assert.Len(t, rec.all(), 6)
		assert.Equal(t, int64(0), e.count(t, ""))
	})
}

// TestPoisonEventGoesDead makes one event fail every time: it ends dead with
// its last error after MaxAttempts while the others flow, holds back only
// its own aggregate's later events, and comes back when requeued.
func TestPoisonEventGoesDead(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db)
		ctx := context.Background()
		e.commit(t, []string{"healthy-1", "poisoned", "healthy-2"}, 3)
		rec := &recorder{}
		rec.setFail(func(env *messaging.Envelope) error {
			if env.AggregateID == "poisoned" && env.AggregateVersion == 2 {
				return errBroker
			}
			return nil
		})
		cfg := fastConfig()
		cfg.MaxAttempts = 3
		p, err := projector.New(e.store, rec, cfg)
		require.NoError(t, err)

		var total projector.Result
		testenv.WaitFor(t, 10*time.Second, "the poisoned event to go dead", func() bool {
			r, err := p.Drain(ctx)
			require.NoError(t, err)
			total.Published += r.Published
			total.Failed += r.Failed
			total.Dead += r.Dead
			return e.count(t, "status = 'dead'") == 1
		})
		assert.Equal(t, 3, total.Failed)
		assert.Equal(t, 1, total.Dead)
		dead, err := e.store.ListDead(ctx, outbox.Filter{}, 10)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		assert.Equal(t, "poisoned", dead[0].AggregateID)
		assert.Equal(t, int64(2), dead[0].AggregateVersion)
		assert.Equal(t, 3, dead[0].Attempts)
		require.NotNil(t, dead[0].LastError)
		assert.Contains(t, *dead[0].LastError, errBroker.Error())

		// The others flowed; the dead event holds back poisoned v3 only.
		assert.Equal(t, int64(7), e.count(t, "status = 'sent'"))
		assert.Equal(t, int64(1), e.count(t, "status = 'new' AND aggregate_id = 'poisoned' AND aggregate_version = 3"))

		rec.setFail(nil)
		n, err := e.store.Requeue(ctx, outbox.Filter{AggregateID: "poisoned"}, false)
		require.NoError(t, err)
		require.Equal(t, int64(1), n)
		_, err = p.Drain(ctx)
		require.NoError(t, err)
		_, err = p.Drain(ctx) // v3 becomes due once v2 is sent
		require.NoError(t, err)
		assert.Equal(t, int64(9), e.count(t, "status = 'sent'"))
		assertFirstDeliveriesInOrder(t, rec.all())
	})
}

// TestFourProjectorsKeepAggregateOrder runs four projectors at once over
// 5,000 events of 50 aggregates through a publisher that fails 10% of the
// time: every event arrives, and each aggregate's first deliveries follow
// its versions.
func TestFourProjectorsKeepAggregateOrder(t *testing.T) {
	testenv.Stress(t)
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db)
		events := e.commit(t, counterIDs(50), 100)
		require.Len(t, events, 5000)

		rec := &recorder{}
		var mu sync.Mutex
		rng := rand.New(rand.NewPCG(1, 2))
		failures := 0
		rec.setFail(func(env *messaging.Envelope) error {
			mu.Lock()
			defer mu.Unlock()
			if rng.IntN(10) == 0 {
				failures++
				return errBroker
			}
			return nil
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		for i := 0; i < 4; i++ {
			cfg := fastConfig()
			cfg.MaxAttempts = 1000 // 10% random failures must never kill an event
			p, err := projector.New(e.store, rec, cfg)
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				assert.NoError(t, p.Run(ctx))
			}()
		}
		testenv.WaitFor(t, 90*time.Second, "all 5,000 events to be sent", func() bool {
			return e.count(t, "status = 'sent'") == 5000
		})
		cancel()
		wg.Wait()

		counts := rec.countByID()
		for _, id := range events {
			require.GreaterOrEqual(t, counts[id], 1, "event %s never arrived", id)
		}
		mu.Lock()
		assert.Greater(t, failures, 100, "the publisher really failed often")
		mu.Unlock()
		assertFirstDeliveriesInOrder(t, rec.all())
		t.Logf("%d deliveries for %d events, %d publish failures", len(rec.all()), len(events), failures)
	})
}

// assertFirstDeliveriesInOrder checks, per aggregate, that the first
// delivery of each version comes in version order with no gap.
func assertFirstDeliveriesInOrder(t *testing.T, ds []delivery) {
	t.Helper()
	next := map[string]int64{}
	seen := map[string]bool{}
	for _, d := range ds {
		if seen[d.env.ID] {
			continue
		}
		seen[d.env.ID] = true
		want := next[d.env.AggregateID] + 1
		require.Equal(t, want, d.env.AggregateVersion,
			"aggregate %s: first delivery of version %d came when %d was expected", d.env.AggregateID, d.env.AggregateVersion, want)
		next[d.env.AggregateID] = want
	}
}

// TestConfigDefaults checks the config convention: nil and a zero Config
// both take the documented defaults, a negative MaxBatchBytes means no
// bound, and impossible or contradictory values fail with ErrInvalidConfig
// naming each field.
func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	e := setup(t, db)
	for name, cfg := range map[string]*projector.Config{"nil": nil, "zero": {}} {
		p, err := projector.New(e.store, &recorder{}, cfg)
		require.NoError(t, err, name)
		c := p.Config()
		assert.Equal(t, 500, c.BatchSize, name)
		assert.Equal(t, 16, c.Concurrency, name)
		assert.Equal(t, 20, c.MaxAttempts, name)
		assert.Equal(t, time.Second, c.BackoffFloor, name)
		assert.Equal(t, 5*time.Minute, c.BackoffCeiling, name)
		assert.Equal(t, 30*time.Second, c.Lease, name)
		assert.Equal(t, 10*time.Second, c.PublishTimeout, name)
		assert.Equal(t, int64(64<<20), c.MaxBatchBytes, name)
		assert.Equal(t, 10*time.Millisecond, c.BusySleep, name)
		assert.Equal(t, 2*time.Second, c.IdleSleep, name)
		assert.NotEmpty(t, p.WorkerID(), name)
		c.WorkerID, c.Logger = "", nil
		assert.Equal(t, *projector.DefaultConfig(), c, "DefaultConfig spells out the defaults")
	}

	p, err := projector.New(e.store, &recorder{}, &projector.Config{MaxBatchBytes: -1, Lease: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, int64(-1), p.Config().MaxBatchBytes, "negative: no bound")
	assert.Equal(t, time.Minute, p.Config().Lease)
	assert.Equal(t, 500, p.Config().BatchSize, "the other fields keep their defaults")

	_, err = projector.New(e.store, &recorder{}, &projector.Config{
		BatchSize: -1, Lease: -time.Second, BackoffFloor: time.Minute, BackoffCeiling: time.Second, Tenant: "no spaces",
	})
	require.ErrorIs(t, err, projector.ErrInvalidConfig)
	for _, field := range []string{"BatchSize", "Lease", "BackoffCeiling", "Tenant"} {
		assert.Contains(t, err.Error(), field+":")
	}
	_, err = projector.New(e.store, &recorder{}, &projector.Config{Lease: 5 * time.Second})
	require.ErrorIs(t, err, projector.ErrInvalidConfig, "the default PublishTimeout is not shorter than this Lease")
	assert.Contains(t, err.Error(), "PublishTimeout:")

	_, err = projector.New(e.store, nil, nil)
	require.ErrorIs(t, err, projector.ErrInvalidConfig)
	_, err = projector.New(nil, &recorder{}, nil)
	require.ErrorIs(t, err, projector.ErrInvalidConfig)
}

// counterSum adds up every series of the counter name.
func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var total float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func gauge(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}
