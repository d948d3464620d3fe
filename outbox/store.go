package outbox

import (
	"fmt"

	"go.opentelemetry.io/otel/propagation"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/conf"
	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/migrate"
	"github.com/bentoevents/bento/internal/tracing"
)

// DefaultMaxPayloadBytes is the default payload size limit: 1 MiB.
const DefaultMaxPayloadBytes = 1 << 20

// DefaultMaxMetadataBytes is the default metadata size limit: 16 KiB as
// AMQP headers encode it. RabbitMQ sends an event's headers in one frame,
// 128 KiB by default (frame_max); 16 KiB leaves the rest for the headers the
// projector adds and for brokers configured with smaller frames.
const DefaultMaxMetadataBytes = 16 << 10

// MaxMetadataKeyLen is the longest metadata key, in bytes: AMQP encodes a
// header name in at most 255 bytes.
const MaxMetadataKeyLen = 255

// Config configures a [Store]. A nil Config or a zero field means the
// field's default; a negative size is rejected with [ErrInvalidConfig].
type Config struct {
	// MaxPayloadBytes is the largest payload accepted, in bytes of JSON.
	// Defaults to DefaultMaxPayloadBytes (1 MiB).
	MaxPayloadBytes int
	// MaxMetadataBytes is the largest metadata accepted, counted as AMQP
	// headers encode it: per entry its key and value plus 6 bytes. An
	// event's metadata travels as headers in one frame, so an event over the
	// broker's frame size could never be published; it is refused when
	// written, with ErrMetadataTooLarge. Defaults to DefaultMaxMetadataBytes
	// (16 KiB).
	MaxMetadataBytes int
	// Clock gives each event written without one its id and its
	// occurred_at (so units of work stamp their events at commit), and the
	// times bento shows rather than compares: created_at. Leases, due times,
	// backoff and retention use the database's clock instead, so hosts whose
	// clocks disagree cannot steal each other's leases or delay each other's
	// events. Defaults to aggregate.SystemClock.
	Clock aggregate.Clock
	// Propagator writes the trace context of the span in Add's context
	// into the event's metadata (traceparent, tracestate), so the publish
	// and consume spans continue the caller's trace. Defaults to W3C Trace
	// Context.
	Propagator propagation.TextMapPropagator
	// Test holds settings for tests only. Defaults to none.
	Test TestConfig
}

func (c *Config) withDefaults() (Config, error) {
	out := conf.Value(c)
	var p conf.Problems
	conf.Default(&p, "MaxPayloadBytes", &out.MaxPayloadBytes, DefaultMaxPayloadBytes)
	conf.Default(&p, "MaxMetadataBytes", &out.MaxMetadataBytes, DefaultMaxMetadataBytes)
	if out.Clock == nil {
		out.Clock = aggregate.SystemClock{}
	}
	return out, p.Err(ErrInvalidConfig)
}

// Store reads and writes the outbox_events table. It is safe for concurrent
// use.
type Store struct {
	db          *gorm.DB
	dialect     dialect.Dialect
	cfg         Config
	partitioned partitioned
	tracing     tracing.Tracing
	clock       dbClock
	dueClock    dbClock // scheduled messages' due times (newScheduleClock)
}

// NewStore returns a store over db (PostgreSQL or SQLite) with the outbox
// table created by Migrate or MigrateWith. cfg may be nil. It checks that
// the table exists, with one query under db's context.
//
// Errors: dialect.ErrUnsupported for another database, ErrInvalidConfig
// naming each bad field, ErrNotMigrated, or the database error of the
// check.
func NewStore(db *gorm.DB, cfg *Config) (*Store, error) {
	d, err := dialect.Of(db)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := migrate.Require(db, component, ErrNotMigrated, Message{}.TableName()); err != nil {
		return nil, err
	}
	return &Store{db: db, dialect: d, cfg: c, tracing: tracing.New(nil, c.Propagator), clock: newDBClock(d, c.Test),
		dueClock: newScheduleClock(d, c.Test)}, nil
}

// DB returns the database the store was created with.
func (s *Store) DB() *gorm.DB { return s.db }

// Config returns the store's configuration with defaults filled in.
func (s *Store) Config() Config { return s.cfg }
