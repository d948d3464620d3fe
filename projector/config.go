package projector

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/bentoevents/bento/internal/instance"
	"github.com/bentoevents/bento/tenant"
)

// Config configures an [OutboxProjector]. Start from [DefaultConfig] and
// change what you need; New(store, pub, nil) uses DefaultConfig() as it is.
//
// Unlike most bento configs, a non-nil Config is taken as given: a zero
// BatchSize, Lease or other number is rejected rather than replaced by a
// default, so a relay whose setting went missing fails at startup instead of
// running with a value nobody chose. Logger, Registerer, Tenant, WorkerID,
// TracerProvider and Propagator are optional.
type Config struct {
	// BatchSize is how many rows one claim takes. DefaultConfig: 500.
	BatchSize int
	// Concurrency is how many publishes may be in flight at once (across
	// batches, counting publishes that timed out and have not returned).
	// Publishers that wait for a broker confirm per message, such as
	// watermill-amqp's, need it for throughput. DefaultConfig: 16.
	Concurrency int
	// MaxAttempts is how many failed publishes make an event dead.
	// DefaultConfig: 20, which with the default backoff rides out about an
	// hour of broker outage before events go dead.
	MaxAttempts int
	// BackoffFloor is the retry delay after the first failure; it doubles
	// with each attempt, jittered to between half and all of its value.
	// DefaultConfig: 1s.
	BackoffFloor time.Duration
	// BackoffCeiling caps the retry delay. DefaultConfig: 5m.
	BackoffCeiling time.Duration
	// Lease is how long claimed rows stay reserved for this projector; if
	// it crashes, other projectors take the rows over once the lease ends.
	// DefaultConfig: 30s.
	Lease time.Duration
	// PublishTimeout bounds how long a batch waits for its publishes; a
	// publish still running then counts as failed (it may still reach the
	// broker: at-least-once). Must be shorter than Lease. DefaultConfig: 10s.
	PublishTimeout time.Duration
	// MaxBatchBytes bounds the payload and metadata bytes one claim takes,
	// so a batch of large events cannot hold BatchSize times the largest
	// payload in memory: a claim stops before the row that would pass it
	// (a row larger than the budget goes out alone). Unlike the fields
	// above, zero means the default. Defaults to DefaultMaxBatchBytes
	// (64 MiB); a negative value means no bound.
	MaxBatchBytes int64
	// BusySleep is the pause after a batch that was not full. A full batch
	// is followed at once by the next claim. DefaultConfig: 10ms.
	BusySleep time.Duration
	// IdleSleep is the polling interval when nothing is due; PostgreSQL
	// notifications and Wake end it early. DefaultConfig: 2s.
	IdleSleep time.Duration
	// Tenant, when set, restricts the projector to one tenant's events.
	// Defaults to all tenants.
	Tenant string
	// WorkerID names the projector in leases and logs. Defaults to
	// "<hostname>-<pid>-<random>".
	WorkerID string
	// DeleteOnSuccess deletes rows once the broker confirmed them instead of
	// keeping them as sent. Defaults to false.
	DeleteOnSuccess bool
	// DisableNotify turns off the PostgreSQL LISTEN wake-up, leaving
	// polling (for example behind PgBouncer in transaction mode). Defaults
	// to false; SQLite never listens.
	DisableNotify bool
	// Logger receives structured logs (event id, topic, tenant, attempts,
	// error; never the payload). Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer, when set, receives the projector's Prometheus metrics.
	// Defaults to none.
	Registerer prometheus.Registerer
	// TracerProvider creates a producer span per published event,
	// "bento.publish <topic>", a child of the trace context stored with the
	// event (see uow.Config.TracerProvider); the message carries the publish
	// span's context. Defaults to otel.GetTracerProvider(), a no-op until
	// the application sets one.
	TracerProvider trace.TracerProvider
	// Propagator reads the stored trace context and writes the publish
	// span's into the message metadata. Defaults to W3C Trace Context
	// (traceparent, tracestate), whatever the global propagator is.
	Propagator propagation.TextMapPropagator
}

// DefaultMaxBatchBytes is the default Config.MaxBatchBytes: 64 MiB.
const DefaultMaxBatchBytes = 64 << 20

// Copy returns a copy of c.
func (c *Config) Copy() *Config {
	cp := *c
	return &cp
}

// DefaultConfig returns the defaults: batches of 500, 16 publishes in
// flight, 20 attempts, backoff from 1s to 5m, a 30s lease with a 10s publish
// timeout, a 64 MiB batch byte budget, 10ms busy and 2s idle sleep.
func DefaultConfig() *Config {
	return &Config{
		BatchSize:      500,
		Concurrency:    16,
		MaxAttempts:    20,
		BackoffFloor:   time.Second,
		BackoffCeiling: 5 * time.Minute,
		Lease:          30 * time.Second,
		PublishTimeout: 10 * time.Second,
		MaxBatchBytes:  DefaultMaxBatchBytes,
		BusySleep:      10 * time.Millisecond,
		IdleSleep:      2 * time.Second,
	}
}

// validate checks c (nil means DefaultConfig) and fills the optional fields.
func (c *Config) validate() (Config, error) {
	if c == nil {
		c = DefaultConfig()
	}
	out := *c
	var errs []error
	atLeastOne := func(name string, v int) {
		if v < 1 {
			errs = append(errs, fmt.Errorf("%s: %d, must be at least 1", name, v))
		}
	}
	atLeastOne("BatchSize", out.BatchSize)
	atLeastOne("Concurrency", out.Concurrency)
	atLeastOne("MaxAttempts", out.MaxAttempts)
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"BackoffFloor", out.BackoffFloor}, {"BackoffCeiling", out.BackoffCeiling}, {"Lease", out.Lease},
		{"PublishTimeout", out.PublishTimeout}, {"BusySleep", out.BusySleep}, {"IdleSleep", out.IdleSleep}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s: %v, must be positive", d.name, d.v))
		}
	}
	switch {
	case out.MaxBatchBytes == 0:
		out.MaxBatchBytes = DefaultMaxBatchBytes
	case out.MaxBatchBytes < 0:
		out.MaxBatchBytes = 0 // the claim's "no bound"
	}
	if out.BackoffCeiling < out.BackoffFloor {
		errs = append(errs, fmt.Errorf("BackoffCeiling: %v is below BackoffFloor %v", out.BackoffCeiling, out.BackoffFloor))
	}
	if out.PublishTimeout >= out.Lease && out.Lease > 0 {
		errs = append(errs, fmt.Errorf("PublishTimeout: %v must be shorter than Lease %v", out.PublishTimeout, out.Lease))
	}
	if out.Tenant != "" {
		if err := tenant.Validate(out.Tenant); err != nil {
			errs = append(errs, fmt.Errorf("Tenant: %w", err))
		}
	}
	if len(out.WorkerID) > 128 {
		errs = append(errs, fmt.Errorf("WorkerID: longer than 128 characters"))
	}
	if out.WorkerID == "" {
		out.WorkerID = instance.ID()
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return out, nil
}
