package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/health"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/rabbitmq"
)

// ask serves one request to h and decodes the answer.
func ask(t *testing.T, h http.Handler) (int, health.Answer) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
	var a health.Answer
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &a), w.Body.String())
	return w.Code, a
}

func check(name string, err error) health.Check {
	return health.Check{Name: name, Run: func(context.Context) error { return err }}
}

func TestLiveAnswersOK(t *testing.T) {
	code, a := ask(t, health.Live())
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, health.StatusOK, a.Status)
}

// TestReadyNamesTheFailingChecks: every check is listed in order with its
// outcome; one that fails, hangs past the timeout or panics makes the
// answer 503 and carries its error; all passing is 200.
func TestReadyNamesTheFailingChecks(t *testing.T) {
	hang := health.Check{Name: "hangs", Run: func(ctx context.Context) error { <-ctx.Done(); time.Sleep(time.Second); return nil }}
	panics := health.Check{Name: "panics", Run: func(context.Context) error { panic("bug") }}
	start := time.Now()
	code, a := ask(t, health.Ready(&health.Config{Timeout: 100 * time.Millisecond},
		check("fine", nil), check("broken", errors.New("disk on fire")), hang, panics))
	assert.Less(t, time.Since(start), time.Second, "the checks ran at once, within the timeout")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, health.StatusFail, a.Status)
	require.Len(t, a.Checks, 4)
	assert.Equal(t, health.Result{Name: "fine", Status: health.StatusOK}, zeroDuration(a.Checks[0]))
	assert.Equal(t, health.Result{Name: "broken", Status: health.StatusFail, Error: "disk on fire"}, zeroDuration(a.Checks[1]))
	assert.Equal(t, "hangs", a.Checks[2].Name)
	assert.Contains(t, a.Checks[2].Error, "no answer within 100ms")
	assert.Contains(t, a.Checks[3].Error, "panicked: bug")

	code, a = ask(t, health.Ready(nil, check("fine", nil), check("also fine", nil)))
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, health.StatusOK, a.Status)
	assert.Len(t, a.Checks, 2)
}

// TestReadyTimeoutDefaults: a nil config, a zero one and a negative
// Timeout all give each check DefaultTimeout; a set one is kept.
func TestReadyTimeoutDefaults(t *testing.T) {
	for name, c := range map[string]struct {
		cfg  *health.Config
		want time.Duration
	}{
		"nil": {nil, 2 * time.Second}, "zero": {&health.Config{}, 2 * time.Second},
		"negative": {&health.Config{Timeout: -time.Second}, 2 * time.Second},
		"set":      {&health.Config{Timeout: 500 * time.Millisecond}, 500 * time.Millisecond},
	} {
		var left time.Duration
		probe := health.Check{Name: "probe", Run: func(ctx context.Context) error {
			deadline, ok := ctx.Deadline()
			require.True(t, ok, name)
			left = time.Until(deadline)
			return nil
		}}
		code, _ := ask(t, health.Ready(c.cfg, probe))
		assert.Equal(t, http.StatusOK, code, name)
		assert.LessOrEqual(t, left, c.want, name)
		assert.Greater(t, left, c.want-time.Second/4, name)
	}
}

func zeroDuration(r health.Result) health.Result {
	r.DurationMS = 0
	return r
}

// laterClock reads the clock an hour ahead.
type laterClock struct{ aggregate.SystemClock }

func (laterClock) Now() time.Time { return time.Now().UTC().Add(time.Hour) }

// TestChecksOfBento: the database, broker, relay and consumer checks pass
// against working services and fail, saying why, against broken ones.
func TestChecksOfBento(t *testing.T) {
	ctx := context.Background()
	db := testenv.SQLite(t)
	require.NoError(t, outbox.Migrate(ctx, db))
	require.NoError(t, inbox.Migrate(ctx, db))
	run := func(c health.Check) error { return c.Run(ctx) }

	assert.NoError(t, run(health.Database(db)))
	closed := testenv.SQLite(t)
	sqlDB, err := closed.DB()
	require.NoError(t, err)
	require.NoError(t, sqlDB.Close())
	assert.Error(t, run(health.Database(closed)))

	ex := testenv.NewExchange(t)
	assert.NoError(t, run(health.Broker(&rabbitmq.Config{URL: ex.URL, Exchange: ex.Name})))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())
	assert.Error(t, run(health.Broker(&rabbitmq.Config{URL: "amqp://guest:guest@" + dead + "/", Exchange: ex.Name})))

	store, err := outbox.NewStore(db, nil)
	require.NoError(t, err)
	assert.NoError(t, run(health.Relay(store, time.Minute)), "nothing pending")
	_, err = store.Add(ctx, db, "order.placed", map[string]string{"id": "o1"}, nil)
	require.NoError(t, err)
	assert.NoError(t, run(health.Relay(store, time.Minute)), "pending for less than a minute")
	later, err := outbox.NewStore(db, &outbox.Config{Clock: laterClock{}})
	require.NoError(t, err)
	err = run(health.Relay(later, time.Minute))
	assert.ErrorIs(t, err, health.ErrRelayBehind)
	assert.Contains(t, fmt.Sprint(err), "1 events wait")

	bus := messaging.NewMemoryBus()
	t.Cleanup(func() { _ = bus.Close() })
	cfg := consumer.DefaultConfig("billing")
	c, err := consumer.NewMemory(db, bus, cfg)
	require.NoError(t, err)
	require.NoError(t, consumer.Handle(c, func(context.Context, *gorm.DB, placed, *messaging.Envelope) error { return nil }))
	cc := health.Consumer(c)
	assert.Equal(t, "consumer billing", cc.Name)
	assert.ErrorIs(t, run(cc), consumer.ErrNotRunning, "before Run")
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	<-c.Running()
	assert.NoError(t, run(cc))
	stop()
	require.NoError(t, <-done)
	assert.ErrorIs(t, run(cc), consumer.ErrNotRunning, "after Run returned")
}

type placed struct {
	ID string `json:"id"`
}

func (placed) EventType() string { return "order.placed" }

// TestReadinessFollowsCutLinks: readiness over PostgreSQL and RabbitMQ, each
// reached through a TCP proxy, turns unready naming the database when the
// database's link is cut, and the broker when the broker's is, and ready
// again once each is restored.
func TestReadinessFollowsCutLinks(t *testing.T) {
	_, dsn := testenv.Postgres(t)
	pgURL, pgProxy := testenv.Proxied(t, dsn)
	db, err := gorm.Open(postgres.Open(pgURL), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { sqlDB, _ := db.DB(); _ = sqlDB.Close() })
	ex := testenv.NewExchange(t)
	amqpURL, amqpProxy := testenv.Proxied(t, ex.URL)
	ready := health.Ready(&health.Config{Timeout: time.Second},
		health.Database(db), health.Broker(&rabbitmq.Config{URL: amqpURL, Exchange: ex.Name}))
	failing := func() []string {
		code, a := ask(t, ready)
		var names []string
		for _, c := range a.Checks {
			if c.Status != health.StatusOK {
				names = append(names, c.Name)
			}
		}
		assert.Equal(t, code == http.StatusOK, len(names) == 0, "the status says whether a check failed")
		return names
	}
	eventually := func(want []string, what string) {
		t.Helper()
		var got []string
		testenv.Poll(15*time.Second, func() bool { got = failing(); return slices.Equal(got, want) })
		assert.Equal(t, want, got, what)
	}
	eventually(nil, "ready at first")
	pgProxy.Cut()
	eventually([]string{"database"}, "the database cut")
	pgProxy.Restore()
	eventually(nil, "ready once the database is back")
	amqpProxy.Cut()
	eventually([]string{"broker"}, "the broker cut")
	amqpProxy.Restore()
	eventually(nil, "ready once the broker is back")
}
