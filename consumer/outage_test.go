package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// TestTransientFailuresOutlastMaxRetries: a handler whose provider is busy
// (a failure it marks consumer.Transient), then in a serialization
// failure, fails 8 times in a row with MaxRetries 1. Those failures pass
// with time, so the message keeps its place and is applied once they
// pass, never dead-lettered.
func TestTransientFailuresOutlastMaxRetries(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		cfg := s.config()
		cfg.MaxRetries = 1
		var calls atomic.Int32
		c := s.newConsumer(t, cfg)
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			switch n := calls.Add(1); {
			case n <= 4:
				return consumer.Transient(fmt.Errorf("provider: %w", syscall.ECONNREFUSED))
			case n <= 8:
				return &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
			}
			return tx.Create(&Effect{MessageID: env.ID}).Error
		}))
		run(t, c)
		s.publish(t, "order.placed", eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o1"}, nil))
		testenv.WaitFor(t, 20*time.Second, "the message applied after the outage", func() bool { return s.effects(t) == 1 })
		assert.EqualValues(t, 9, calls.Load())
		assert.Empty(t, s.peekDead(t), "nothing dead-lettered")
	})
}

// TestOutageWindowEnds: a failure marked transient that stays so past OutageWindow
// counts as a failure like any other, and the message is dead-lettered
// with the cause "failed".
func TestOutageWindowEnds(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		cfg := s.config()
		cfg.MaxRetries = 1
		cfg.OutageWindow = 200 * time.Millisecond
		c := s.newConsumer(t, cfg)
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			return consumer.Transient(fmt.Errorf("provider: %w", syscall.ECONNREFUSED))
		}))
		run(t, c)
		msg := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o1"}, nil)
		s.publish(t, "order.placed", msg)
		dead := s.deadLetters(t, s.group, 1)
		assert.Equal(t, msg.UUID, dead[0].UUID)
		assert.Equal(t, consumer.CauseFailed, dead[0].Metadata.Get(consumer.MetaDeadCause))
	})
}

// TestGapDeadLettersAfterGapTimeout: with contiguous versions and without
// hold-back, an event whose predecessor never arrives waits in place, then is
// dead-lettered with the cause "gap". Once the predecessor is applied,
// replaying it applies it.
func TestGapDeadLettersAfterGapTimeout(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		cfg := s.config()
		cfg.Versions = inbox.VersionsContiguous
		cfg.GapTimeout = 300 * time.Millisecond
		cfg.DisableHoldBack = true
		var (
			mu      sync.Mutex
			applied []int64
			calls   atomic.Int32
		)
		c := s.newConsumer(t, cfg)
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			calls.Add(1)
			mu.Lock()
			applied = append(applied, env.AggregateVersion)
			mu.Unlock()
			return tx.Create(&Effect{MessageID: env.ID}).Error
		}))
		run(t, c)
		v1 := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o1"}, nil)
		v2 := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o1"}, nil)
		v2.Metadata.Set(messaging.MetaAggregateVersion, "2")

		start := time.Now()
		s.publish(t, "order.placed", v2)
		dead := s.deadLetters(t, s.group, 1)
		assert.GreaterOrEqual(t, time.Since(start), cfg.GapTimeout, "it waited for its predecessor first")
		assert.Equal(t, v2.UUID, dead[0].UUID)
		assert.Equal(t, consumer.CauseGap, dead[0].Metadata.Get(consumer.MetaDeadCause))
		assert.Contains(t, dead[0].Metadata.Get(consumer.MetaDeadReason), "earlier version")
		assert.Zero(t, calls.Load(), "the handler never saw it")

		s.publish(t, "order.placed", v1)
		testenv.WaitFor(t, 10*time.Second, "version 1", func() bool { return s.effects(t) == 1 })
		replay := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o1"}, nil)
		replay.UUID = v2.UUID
		replay.Metadata.Set(messaging.MetaAggregateVersion, "2")
		s.publish(t, "order.placed", replay)
		testenv.WaitFor(t, 10*time.Second, "the replayed version 2", func() bool { return s.effects(t) == 2 })
		mu.Lock()
		assert.Equal(t, []int64{1, 2}, applied)
		mu.Unlock()
	})
}

// TestDeadLettersSayWhy: each dead letter carries its cause.
func TestDeadLettersSayWhy(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		cfg := s.config()
		cfg.MaxRetries = -1 // no retries
		c := s.newConsumer(t, cfg)
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			if e.OrderID == "refused" {
				return consumer.Permanent(fmt.Errorf("order %s refused", e.OrderID))
			}
			return fmt.Errorf("order %s failed", e.OrderID)
		}))
		run(t, c)
		refused := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "refused"}, nil)
		failed := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "failed"}, nil)
		malformed := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "m"}, nil)
		malformed.Payload = []byte(`{`)
		s.publish(t, "order.placed", refused)
		s.publish(t, "order.placed", failed)
		s.publish(t, "order.placed", malformed)
		causes := map[string]string{}
		for _, m := range s.deadLetters(t, s.group, 3) {
			causes[m.UUID] = m.Metadata.Get(consumer.MetaDeadCause)
		}
		assert.Equal(t, map[string]string{
			refused.UUID: consumer.CausePermanent, failed.UUID: consumer.CauseFailed, malformed.UUID: consumer.CauseDecode,
		}, causes)
	})
}

// TestHandlerTimeoutDeadLettersAHangingMessage: a handler that hangs on its
// message (until its context ends) fails each attempt at HandlerTimeout,
// so the message ends in dead letters after MaxRetries instead of holding
// its partition, and the message behind it is applied.
func TestHandlerTimeoutDeadLettersAHangingMessage(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		cfg := s.config()
		cfg.MaxRetries, cfg.HandlerTimeout, cfg.Partitions = 1, 100*time.Millisecond, 1
		c := s.newConsumer(t, cfg)
		var attempts atomic.Int32
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			if e.OrderID == "hangs" {
				attempts.Add(1)
				<-ctx.Done()
				return ctx.Err()
			}
			return tx.Create(&Effect{MessageID: env.ID}).Error
		}))
		run(t, c)
		hangs := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "hangs"}, nil)
		s.publish(t, "order.placed", hangs)
		s.publish(t, "order.placed", eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "next"}, nil))
		dead := s.deadLetters(t, s.group, 1)
		assert.Equal(t, hangs.UUID, dead[0].UUID)
		assert.Equal(t, consumer.CauseFailed, dead[0].Metadata.Get(consumer.MetaDeadCause))
		assert.Contains(t, dead[0].Metadata.Get(consumer.MetaDeadReason), consumer.ErrHandlerTimeout.Error())
		// One attempt and MaxRetries retries, after an attempt in a batch
		// when the two messages came together.
		assert.Contains(t, []int32{2, 3}, attempts.Load(), "attempts")
		testenv.WaitFor(t, 10*time.Second, "the next message applied", func() bool { return s.effects(t) == 1 })
	})
}

// TestBreakerPausesTheGroupWhileItsDatabaseIsDown: while every attempt
// fails as if the database were unreachable, the group's partitions stop
// trying: one message at a time probes, with backoff, instead of one per
// partition; once the database answers, everything is applied, in order,
// and nothing is dead-lettered.
func TestBreakerPausesTheGroupWhileItsDatabaseIsDown(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		cfg := s.config()
		cfg.Partitions, cfg.RetryMaxInterval = 8, time.Second
		var (
			down                 atomic.Bool
			calls, inFlight, top atomic.Int32
			mu                   sync.Mutex
			applied              = map[string][]int64{}
		)
		down.Store(true)
		c := s.newConsumer(t, cfg)
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e Step, env *messaging.Envelope) error {
			calls.Add(1)
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			if n > top.Load() {
				top.Store(n)
			}
			time.Sleep(10 * time.Millisecond)
			if down.Load() {
				return &pgconn.PgError{Code: "08006", Message: "connection failure"}
			}
			mu.Lock()
			applied[env.AggregateID] = append(applied[env.AggregateID], env.AggregateVersion)
			mu.Unlock()
			return nil
		}))
		run(t, c)
		const aggregates = 16
		for v := int64(1); v <= 2; v++ {
			for a := range aggregates {
				s.publish(t, Step{}.EventType(), stepMsg(t, a, v))
			}
		}
		testenv.WaitFor(t, 10*time.Second, "the first attempts", func() bool { return calls.Load() > 0 })
		time.Sleep(time.Second) // the breaker is open by now
		before := calls.Load()
		top.Store(0)
		const window = 3 * time.Second
		time.Sleep(window)
		probes := calls.Load() - before
		assert.LessOrEqual(t, top.Load(), int32(1), "messages attempted at once while the database was down")
		// Probes back off to RetryMaxInterval (1s): about 3 in the window;
		// one attempt per partition and backoff would be over 20.
		assert.LessOrEqual(t, probes, int32(6), "attempts while the database was down")
		t.Logf("%d attempts in %v while the database was down", probes, window)

		down.Store(false)
		testenv.WaitFor(t, 20*time.Second, "every event applied", func() bool {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, vs := range applied {
				n += len(vs)
			}
			return n == 2*aggregates
		})
		mu.Lock()
		for a, vs := range applied {
			assert.Equal(t, []int64{1, 2}, vs, "versions of %s in order", a)
		}
		mu.Unlock()
		assert.Empty(t, s.deadLetters(t, s.group, 0), "nothing dead-lettered")
	})
}
