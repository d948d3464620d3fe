package projector

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/bentoevents/bento/internal/conf"
	"github.com/bentoevents/bento/internal/instance"
	"github.com/bentoevents/bento/tenant"
)

// Config configures an [OutboxProjector]. A nil Config or a zero field
// means the field's default; a negative MaxBatchBytes means no bound. Only
// contradictory or impossible values (a negative count or duration, a
// BackoffCeiling below BackoffFloor, a PublishTimeout not shorter than
// Lease) are rejected, with [ErrInvalidConfig] naming the field.
type Config struct {
	// BatchSize is how many rows one claim takes. Defaults to 500.
	BatchSize int
	// Concurrency is how many publishes may be in flight at once (across
	// batches, counting publishes that timed out and have not returned).
	// Publishers that wait for a broker confirm per message, such as
	// watermill-amqp's, need it for throughput. Defaults to 16.
	Concurrency int
	// MaxAttempts is how many failed publishes make an event dead. With the
	// default backoff, 20 attempts ride out about an hour of broker outage
	// before events go dead. Defaults to 20.
	MaxAttempts int
	// BackoffFloor is the retry delay after the first failure; it doubles
	// with each attempt, jittered to between half and all of its value.
	// Defaults to 1s.
	BackoffFloor time.Duration
	// BackoffCeiling caps the retry delay; it must not be below
	// BackoffFloor. Defaults to 5m.
	BackoffCeiling time.Duration
	// Lease is how long claimed rows stay reserved for this projector; if
	// it crashes, other projectors take the rows over once the lease ends.
	// Defaults to 30s.
	Lease time.Duration
	// PublishTimeout bounds how long a batch waits for its publishes; a
	// publish still running then counts as failed (it may still reach the
	// broker: at-least-once). Through a TxPublisher it bounds the
	// transaction that publishes and marks a batch, which then rolls back.
	// It must be shorter than Lease. Defaults to 10s.
	PublishTimeout time.Duration
	// MaxBatchBytes bounds the payload and metadata bytes one claim takes,
	// so a batch of large events cannot hold BatchSize times the largest
	// payload in memory: a claim stops before the row that would pass it
	// (a row larger than the budget goes out alone). A negative value
	// means no bound. Defaults to DefaultMaxBatchBytes (64 MiB).
	MaxBatchBytes int64
	// BusySleep is the pause after a batch that was not full. A full batch
	// is followed at once by the next claim. While claims keep finding
	// events the projector stays recorded busy, so commits do not notify
	// it and it finds them after at most BusySleep (or at once on Wake);
	// only a claim that finds nothing makes it idle. Defaults to 10ms.
	BusySleep time.Duration
	// IdleSleep is the polling interval when nothing is due; PostgreSQL
	// notifications and Wake end it early. Defaults to 2s.
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

// Defaults of [Config].
const (
	DefaultBatchSize      = 500
	DefaultConcurrency    = 16
	DefaultMaxAttempts    = 20
	DefaultBackoffFloor   = time.Second
	DefaultBackoffCeiling = 5 * time.Minute
	DefaultLease          = 30 * time.Second
	DefaultPublishTimeout = 10 * time.Second
	DefaultBusySleep      = 10 * time.Millisecond
	DefaultIdleSleep      = 2 * time.Second
)

// DefaultConfig returns a Config with every numeric default spelled out:
// batches of 500, 16 publishes in flight, 20 attempts, backoff from 1s to
// 5m, a 30s lease with a 10s publish timeout, a 64 MiB batch byte budget,
// 10ms busy and 2s idle sleep. New(store, pub, nil) and a zero Config mean
// the same; it is there to read or print the defaults.
func DefaultConfig() *Config {
	c, _ := (*Config)(nil).withDefaults()
	return &c
}

// withDefaults returns a copy of c (nil means a zero Config) whose zero
// numbers are set to their defaults; it names every field that is
// impossible or contradicts another.
func (c *Config) withDefaults() (Config, error) {
	out := conf.Value(c)
	var p conf.Problems
	conf.Default(&p, "BatchSize", &out.BatchSize, DefaultBatchSize)
	conf.Default(&p, "Concurrency", &out.Concurrency, DefaultConcurrency)
	conf.Default(&p, "MaxAttempts", &out.MaxAttempts, DefaultMaxAttempts)
	conf.Default(&p, "BackoffFloor", &out.BackoffFloor, DefaultBackoffFloor)
	conf.Default(&p, "BackoffCeiling", &out.BackoffCeiling, DefaultBackoffCeiling)
	conf.Default(&p, "Lease", &out.Lease, DefaultLease)
	conf.Default(&p, "PublishTimeout", &out.PublishTimeout, DefaultPublishTimeout)
	conf.Default(&p, "BusySleep", &out.BusySleep, DefaultBusySleep)
	conf.Default(&p, "IdleSleep", &out.IdleSleep, DefaultIdleSleep)
	conf.OrDefault(&out.MaxBatchBytes, DefaultMaxBatchBytes)
	if out.BackoffCeiling < out.BackoffFloor {
		p.Addf("BackoffCeiling", "%v is below BackoffFloor %v", out.BackoffCeiling, out.BackoffFloor)
	}
	if out.PublishTimeout >= out.Lease && out.Lease > 0 {
		p.Addf("PublishTimeout", "%v must be shorter than Lease %v", out.PublishTimeout, out.Lease)
	}
	if out.Tenant != "" {
		if err := tenant.Validate(out.Tenant); err != nil {
			p.Add("Tenant", err)
		}
	}
	if len(out.WorkerID) > 128 {
		p.Addf("WorkerID", "longer than 128 characters")
	}
	return out, p.Err(ErrInvalidConfig)
}

// validate checks c (nil means a zero Config) and fills every default,
// WorkerID and Logger included.
func (c *Config) validate() (Config, error) {
	out, err := c.withDefaults()
	if out.WorkerID == "" {
		out.WorkerID = instance.ID()
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, err
}
