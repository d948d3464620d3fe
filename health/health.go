// Package health serves the liveness and readiness checks of a service
// built on bento, as JSON over HTTP.
//
// [Live] answers 200 as long as the process serves HTTP: mount it where the
// orchestrator decides whether to restart the process (a database outage
// must not restart every instance). [Ready] runs its checks at each request,
// concurrently, each within a timeout, and answers 200 when every one
// passes, 503 naming those that failed: mount it where the orchestrator or
// load balancer decides whether to send the instance work.
//
//	mux.Handle("GET /healthz", health.Live())
//	mux.Handle("GET /readyz", health.Ready(nil,
//		health.Database(db),
//		health.Broker(amqpCfg),
//		health.Relay(store, time.Minute),
//		health.Consumer(billing)))
//
// The body is {"status": "ok" | "fail", "checks": [{"name", "status",
// "error", "duration_ms"}]}; errors say what failed, never a payload.
package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/rabbitmq"
)

// DefaultTimeout bounds each check of Ready when Config.Timeout is zero.
const DefaultTimeout = 2 * time.Second

// Check is one readiness check: Run returns nil when what it checks is
// healthy, or an error that says what is not.
type Check struct {
	// Name names the check in the answer ("database", "relay").
	Name string
	// Run runs the check; ctx ends at the check's timeout.
	Run func(ctx context.Context) error
}

// Config configures Ready. A nil *Config or a zero field means the
// field's default.
type Config struct {
	// Timeout bounds each check; one that takes longer fails. Ready has no
	// error to return, so a negative value, which could only fail every
	// check, also means the default. Defaults to DefaultTimeout (2s).
	Timeout time.Duration
}

// Result is one check's outcome in the answer.
type Result struct {
	Name       string  `json:"name"`
	Status     string  `json:"status"`
	Error      string  `json:"error,omitempty"`
	DurationMS float64 `json:"duration_ms"`
}

// Answer is the JSON body of Live and Ready.
type Answer struct {
	// Status is "ok" or "fail".
	Status string   `json:"status"`
	Checks []Result `json:"checks,omitempty"`
}

// The values of Answer.Status and Result.Status.
const (
	StatusOK   = "ok"
	StatusFail = "fail"
)

// Live returns the liveness handler: 200 and {"status": "ok"} whenever
// the process can answer.
func Live() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		write(w, http.StatusOK, Answer{Status: StatusOK})
	})
}

// Ready returns the readiness handler of checks: each runs at every
// request, all at once, within cfg.Timeout; 200 when all pass, else 503.
// The answer lists every check, in the given order, with its status, its
// error and how long it took.
func Ready(cfg *Config, checks ...Check) http.Handler {
	timeout := DefaultTimeout
	if cfg != nil && cfg.Timeout > 0 {
		timeout = cfg.Timeout
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		results := make([]Result, len(checks))
		var wg sync.WaitGroup
		for i, c := range checks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = run(r.Context(), c, timeout)
			}()
		}
		wg.Wait()
		a := Answer{Status: StatusOK, Checks: results}
		status := http.StatusOK
		for _, res := range results {
			if res.Status != StatusOK {
				a.Status, status = StatusFail, http.StatusServiceUnavailable
			}
		}
		write(w, status, a)
	})
}

// run runs c within timeout, turning a panic or an overrun into a failure.
func run(ctx context.Context, c Check, timeout time.Duration) (res Result) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	res = Result{Name: c.Name, Status: StatusOK}
	done := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- fmt.Errorf("check panicked: %v", p)
			}
		}()
		done <- c.Run(ctx)
	}()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		err = fmt.Errorf("no answer within %v", timeout)
	}
	res.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		res.Status, res.Error = StatusFail, err.Error()
	}
	return res
}

func write(w http.ResponseWriter, status int, a Answer) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(a)
}

// Database checks that db answers a ping.
func Database(db *gorm.DB) Check {
	return Check{Name: "database", Run: func(ctx context.Context) error {
		sqlDB, err := db.DB()
		if err != nil {
			return err
		}
		return sqlDB.PingContext(ctx)
	}}
}

// Broker checks that the RabbitMQ broker of cfg accepts a connection.
func Broker(cfg *rabbitmq.Config) Check {
	return Check{Name: "broker", Run: func(ctx context.Context) error { return rabbitmq.Ping(ctx, cfg) }}
}

// ErrRelayBehind is the error of a Relay check whose oldest pending event
// has waited too long.
var ErrRelayBehind = errors.New("health: the relay is behind")

// Relay checks the outbox of store: it fails when the oldest event waiting
// to be relayed has waited longer than maxAge (a relay that is stopped,
// stuck or cut off from the broker).
func Relay(store *outbox.Store, maxAge time.Duration) Check {
	return Check{Name: "relay", Run: func(ctx context.Context) error {
		st, err := store.Stats(ctx, nil)
		if err != nil {
			return err
		}
		if st.OldestPendingAge > maxAge {
			return fmt.Errorf("%w: %d events wait, the oldest for %v (limit %v)", ErrRelayBehind, st.Pending,
				st.OldestPendingAge.Round(time.Millisecond), maxAge)
		}
		return nil
	}}
}

// Consumer checks that c runs: subscribed, and for a partitioned group a
// member of it (it answers for its partitions).
func Consumer(c *consumer.Consumer) Check {
	return Check{Name: "consumer " + c.Group(), Run: func(context.Context) error { return c.Health() }}
}
