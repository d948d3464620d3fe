package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// deadProvider returns the URL of a loopback port nothing listens on: a
// payment provider that is down.
func deadProvider(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "http://" + addr + "/charge"
}

// TestHandlerNetworkErrorsAreOrdinaryFailures: a handler whose own HTTP
// call fails (a refused connection, then a client deadline) while the
// group's database answers has failed on its message, not met a database
// outage: its failures count toward MaxRetries and it is dead-lettered
// with the cause "failed" after MaxRetries+1 attempts, and the next event
// is applied. (Taken for an outage, it would be retried in place for
// OutageWindow, an hour by default, stopping its partition.)
func TestHandlerNetworkErrorsAreOrdinaryFailures(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		cfg := s.config()
		cfg.MaxRetries = 3
		url := deadProvider(t)
		slow := &http.Client{Timeout: time.Millisecond}
		var calls atomic.Int32
		c := s.newConsumer(t, cfg)
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			if e.OrderID != "declined" {
				return tx.Create(&Effect{MessageID: env.ID}).Error
			}
			client := http.DefaultClient
			if calls.Add(1)%2 == 0 {
				client = slow // context deadline exceeded (Client.Timeout exceeded)
			}
			resp, err := client.Post(url, "application/json", nil)
			if err == nil {
				_ = resp.Body.Close()
			}
			return err
		}))
		run(t, c)
		bad := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "declined"}, nil)
		s.publish(t, "order.placed", bad)
		dead := s.deadLetters(t, s.group, 1)
		require.Equal(t, bad.UUID, dead[0].UUID)
		assert.Equal(t, consumer.CauseFailed, dead[0].Metadata.Get(consumer.MetaDeadCause))
		assert.EqualValues(t, cfg.MaxRetries+1, calls.Load(), "attempts before the dead letter")
		s.publish(t, "order.placed", eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o2"}, nil))
		testenv.WaitFor(t, 10*time.Second, "the next event applied", func() bool { return s.effects(t) == 1 })
		assert.NoError(t, c.Health(), "the group's breaker stayed closed")
		t.Logf("%s: dead-lettered after %d attempts", h.name, calls.Load())
	})
}

// TestTransientMarksAHandlerFailureThatPasses: a handler failure wrapped
// with consumer.Transient is retried in place without counting toward
// MaxRetries, for up to OutageWindow, and never opens the group's breaker.
func TestTransientMarksAHandlerFailureThatPasses(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		cfg := s.config()
		cfg.MaxRetries = 1
		var calls atomic.Int32
		c := s.newConsumer(t, cfg)
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			if calls.Add(1) <= 6 {
				return consumer.Transient(errors.New("provider: 503 busy"))
			}
			return tx.Create(&Effect{MessageID: env.ID}).Error
		}))
		run(t, c)
		s.publish(t, "order.placed", eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o1"}, nil))
		testenv.WaitFor(t, 20*time.Second, "applied once the provider answers", func() bool { return s.effects(t) == 1 })
		assert.EqualValues(t, 7, calls.Load())
		assert.Empty(t, s.peekDead(t), "nothing dead-lettered")
		assert.True(t, consumer.IsTransient(consumer.Transient(errors.New("x"))))
		assert.False(t, consumer.IsTransient(errors.New("x")))
	})
}

// recorder is a slog handler that keeps the records at Warn and above.
type recorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// find returns the attributes of the first record with message msg.
func (r *recorder) find(msg string) (map[string]string, slog.Level, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.records {
		if rec.Message == msg {
			attrs := map[string]string{}
			rec.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
			return attrs, rec.Level, true
		}
	}
	return nil, 0, false
}

// TestEveryDeadLetterIsLogged: a message its handler refuses with
// consumer.Permanent is dead-lettered with a Warn line naming the group,
// the event, its type and aggregate, the cause and the error. (It used to
// be dead-lettered without a word.)
func TestEveryDeadLetterIsLogged(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		cfg := s.config()
		logs := &recorder{}
		cfg.Logger = slog.New(logs)
		c := s.newConsumer(t, cfg)
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			return consumer.Permanent(errors.New("card number malformed"))
		}))
		run(t, c)
		msg := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o1"}, nil)
		s.publish(t, "order.placed", msg)
		s.deadLetters(t, s.group, 1)
		attrs, level, ok := logs.find("consumer: dead letter")
		require.True(t, ok, "a log line for the dead letter")
		assert.Equal(t, slog.LevelWarn, level)
		assert.Equal(t, s.group, attrs["group"])
		assert.Equal(t, msg.UUID, attrs["message_id"])
		assert.Equal(t, "order.placed", attrs["event_type"])
		assert.Equal(t, "order", attrs["aggregate_type"])
		assert.Equal(t, "o-1", attrs["aggregate_id"])
		assert.Equal(t, consumer.CausePermanent, attrs["cause"])
		assert.Contains(t, attrs["err"], "card number malformed")
	})
}
