package inbox

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/clip"
	"github.com/bentoevents/bento/internal/dberr"
	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/migrate"
	"github.com/bentoevents/bento/internal/tracing"
	"github.com/bentoevents/bento/internal/wire"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
)

var (
	// ErrInvalidConfig is returned for a bad configuration; the message
	// names every bad field.
	ErrInvalidConfig = errors.New("inbox: invalid config")
	// ErrNoMessageID is returned for a message without a usable id (empty
	// or longer than 128 characters): it cannot be deduplicated, so it is
	// never applied. The consumer sends it to the dead-letter destination.
	ErrNoMessageID = errors.New("inbox: message has no usable id")
	// ErrClosed is outbox.ErrClosed, the one closed-database error: the
	// database handle has been closed.
	ErrClosed = outbox.ErrClosed
	// ErrGap is returned, and the handler not run, for a message of an
	// aggregate whose previous version the consumer has not applied yet,
	// under VersionsContiguous. The message is not recorded: redelivered
	// once its predecessor was applied, it is applied then.
	ErrGap = errors.New("inbox: an earlier version of the aggregate has not been applied")
	// ErrStale is returned, and the handler not run, for a replayed dead
	// letter (messaging.MetaReplays) at or below its aggregate's version
	// watermark: later versions were applied past it, so applying it now
	// would put the aggregate out of order, and skipping it as a duplicate
	// would lose it, since it was never applied.
	ErrStale = errors.New("inbox: a replayed event arrived after later versions of its aggregate were applied")
	// ErrBadVersion is returned for a message whose aggregate_version
	// metadata is not a positive integer: it cannot be ordered, so it is
	// never applied.
	ErrBadVersion = errors.New("inbox: malformed aggregate version")
	// ErrInvalidArgument is returned by Purge and CountPurgeable for an
	// argument out of range, such as a negative age.
	ErrInvalidArgument = errors.New("inbox: invalid argument")
	// ErrNotMigrated is returned by New when an inbox table does not exist
	// in the database: Migrate (or MigrateWith) was not called, or not
	// since an upgrade of bento added the table.
	ErrNotMigrated = errors.New("inbox: inbox tables missing: call inbox.Migrate(ctx, db) first")
)

// tables are the inbox's tables, as its migrations create them.
var tables = []string{"inbox_messages", "inbox_watermarks", "consumer_members", "inbox_holds", "inbox_parked", "inbox_attempts"}

// MaxMessageIDLen is the longest message id the inbox stores.
const MaxMessageIDLen = 128

// CheckConsumer returns an error when name cannot name a consumer, by the
// rule for queue and group names (a consumer group's name is its inbox
// consumer's): 1 to 200 ASCII letters, digits, '_', '.', ':' or '-', not
// starting with "amq.".
func CheckConsumer(name string) error {
	if r := wire.Name(name); r != "" {
		return fmt.Errorf("%q %s", clip.String(name), r)
	}
	return nil
}

// Record is one row of inbox_messages: consumer applied message.
type Record struct {
	Consumer   string `gorm:"primaryKey"`
	MessageID  string `gorm:"primaryKey"`
	TenantID   string
	ReceivedAt time.Time
}

// TableName tells GORM the table.
func (Record) TableName() string { return "inbox_messages" }

// Config configures an [Inbox]. A zero field means the field's default,
// except Consumer, which has none; a nil *Config is a zero one, so it fails
// naming Consumer. Impossible values are rejected with [ErrInvalidConfig]
// naming the field.
type Config struct {
	// Consumer names who applies the messages: usually the consumer group.
	// Dedup is per (Consumer, message id), so two consumers of one message
	// each apply it once. 1 to 200 ASCII letters, digits, '_', '.', ':' or
	// '-'. It has no default: it is required.
	Consumer string
	// TxOptions are used to begin each message's transaction. Defaults to
	// the database's default isolation.
	TxOptions *sql.TxOptions
	// Clock is the clock for received_at. Defaults to
	// aggregate.SystemClock.
	Clock aggregate.Clock
	// Logger receives a line per duplicate skipped. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Registerer, when set, receives bento_inbox_processed_total and
	// bento_inbox_duplicates_total by consumer. Defaults to none.
	Registerer prometheus.Registerer
	// TracerProvider creates a consumer span per message,
	// "bento.consume <event type>", a child of the trace context the message
	// carries (its traceparent metadata). Defaults to otel.GetTracerProvider(),
	// a no-op until the application sets one.
	TracerProvider trace.TracerProvider
	// Propagator reads the message's trace context. Defaults to W3C Trace
	// Context (traceparent, tracestate), whatever the global propagator is.
	Propagator propagation.TextMapPropagator
	// System names the broker on consumer spans (the messaging.system
	// attribute, such as "rabbitmq"). Defaults to none.
	System string
	// Versions is how the consumer's version watermark treats the
	// aggregate versions of the messages: see Versions. Defaults to
	// VersionsIgnored.
	Versions Versions
	// BeginTx, when set, runs first in each transaction the inbox begins
	// to apply messages (Middleware, ApplyBatch), on that transaction: for
	// settings such as PostgreSQL's SET LOCAL timeouts. Its error fails the
	// attempt, as a failed begin does. Defaults to none.
	BeginTx func(tx *gorm.DB) error
	// BeforeCommit, when set, runs last in each such transaction that has
	// something to commit, just before the commit: its error rolls the
	// transaction back and is returned with nothing settled, as a failed
	// commit is. Defaults to none.
	BeforeCommit func(tx *gorm.DB) error
}

// Versions is a consumer's policy for the aggregate versions of the
// messages it applies.
type Versions int

const (
	// VersionsIgnored keeps no watermark: dedup is by message id alone,
	// and messages are applied in the order they are delivered. Right for
	// a consumer whose deliveries are not ordered per aggregate and which
	// handles only some of an aggregate's event types.
	VersionsIgnored Versions = iota
	// VersionsIncreasing keeps a watermark per aggregate, the last version
	// applied: a version at or below it is a duplicate, skipped even after
	// its message-id record was purged; any higher version is applied.
	// Right for a consumer that receives each aggregate's events in version
	// order (one at a time per aggregate) and handles only some of its
	// event types. With unordered delivery it would skip an event that
	// arrived after a later one: do not use it there.
	VersionsIncreasing
	// VersionsContiguous keeps the watermark and requires every version:
	// a version above the watermark plus one is refused with ErrGap, not
	// recorded, and applied when delivered again after its predecessor.
	// An aggregate's first delivery must be its version 1. Right for a
	// consumer that receives every event of each aggregate it sees; it
	// keeps version order even when deliveries are not ordered, at the cost
	// of redeliveries.
	VersionsContiguous
)

// String names the policy.
func (v Versions) String() string {
	switch v {
	case VersionsIgnored:
		return "ignored"
	case VersionsIncreasing:
		return "increasing"
	case VersionsContiguous:
		return "contiguous"
	}
	return fmt.Sprintf("Versions(%d)", int(v))
}

// Inbox applies each message at most once per consumer: see Middleware.
type Inbox struct {
	db         *gorm.DB
	cfg        Config
	log        *slog.Logger
	processed  prometheus.Counter
	duplicates prometheus.Counter
	tracing    tracing.Tracing
}

// New returns the inbox of cfg.Consumer over db (PostgreSQL or SQLite, with
// the inbox tables created by Migrate). It checks that the tables exist,
// with one query under db's context.
//
// Errors: ErrInvalidConfig, ErrNotMigrated, or the database error of the
// check.
func New(db *gorm.DB, cfg *Config) (*Inbox, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	var errs []error
	if _, err := dialect.Of(db); err != nil {
		errs = append(errs, fmt.Errorf("db: %w", err))
	}
	if c.Versions < VersionsIgnored || c.Versions > VersionsContiguous {
		errs = append(errs, fmt.Errorf("Versions: %v is not a policy", c.Versions))
	}
	if err := CheckConsumer(c.Consumer); err != nil {
		errs = append(errs, fmt.Errorf("Consumer: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := migrate.Require(db, "inbox", ErrNotMigrated, tables...); err != nil {
		return nil, err
	}
	if c.Clock == nil {
		c.Clock = aggregate.SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	in := &Inbox{db: db, cfg: c, log: c.Logger.With("component", "bento.inbox", "consumer", c.Consumer),
		tracing: tracing.New(c.TracerProvider, c.Propagator)}
	var err error
	if in.processed, in.duplicates, err = counters(c.Registerer, c.Consumer); err != nil {
		return nil, fmt.Errorf("inbox: metrics: %w", err)
	}
	return in, nil
}

// Consumer returns the consumer name.
func (in *Inbox) Consumer() string { return in.cfg.Consumer }

// Middleware is a Watermill middleware that applies each message once. For
// each message it begins a transaction and inserts (consumer, message id)
// into inbox_messages with an insert that cannot duplicate. If the record
// already exists — the message was applied before, or a racing delivery is
// applying it right now and commits — the message is acknowledged and the
// handler skipped. Otherwise the handler runs with the transaction in its
// context and the transaction commits when it returns nil: the handler's
// writes and the inbox record commit together. A handler error (or panic)
// rolls everything back, the inbox record included, so the message is
// redelivered and applied then.
//
// A message of an aggregate (aggregate_id and aggregate_version metadata,
// as every event bento relays carries) is also checked against the
// consumer's version watermark for that aggregate, kept in
// inbox_watermarks in the same transaction, unless Config.Versions is
// VersionsIgnored: a version at or below it is a duplicate, skipped even
// after its inbox record was purged, so dedup outlives retention; with
// VersionsContiguous a version above it plus one is refused with ErrGap;
// otherwise the handler runs and the watermark moves to the version.
// Deliveries of one aggregate serialise on its watermark row.
//
// The handler's context carries:
//   - the transaction: uow.TxFromContext, uow.DB, and units of work begun
//     under it (Manager.Run) join it, so aggregate changes and the events
//     they record commit with the inbox record;
//   - the message's tenant (tenant.From);
//   - outbox metadata making the events written under it carry the
//     message's correlation id and the message id as their causation id;
//   - the consumer span (see below), so spans the handler starts are its
//     children and events it commits through a unit of work carry its trace.
//
// Each delivery runs in an OpenTelemetry consumer span,
// "bento.consume <event type>", whose parent is the trace context in the
// message's traceparent metadata (the projector's publish span). A message
// without one starts a new trace; one with a malformed traceparent too, and
// the span records a "bento.traceparent.invalid" event: tracing never fails
// a message. A skipped duplicate's span gets a "bento.inbox.duplicate" event
// and attribute; a failed attempt's span is marked failed.
//
// Messages the router would publish from the handler's return value are
// published after the commit, outside the transaction; emit events through
// a unit of work instead.
func (in *Inbox) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx, span := in.startConsume(msg.Context(), msg)
		e, err := in.check(msg)
		if err != nil {
			tracing.End(span, err)
			return nil, err
		}
		e.ctx, e.span = ctx, span
		n, produced, err := in.apply(ctx, []*entry{e}, h)
		if e.panicked != nil {
			tracing.EndPanic(span, e.panicked)
			panic(e.panicked)
		}
		in.endSpan(e, err)
		if n == 0 {
			return nil, err
		}
		return produced, nil
	}
}

// skipped counts, traces and logs a duplicate the middleware skipped.
func (in *Inbox) skipped(span trace.Span, msg string, attrs ...any) {
	in.duplicates.Inc()
	if span.IsRecording() {
		span.AddEvent(tracing.EventDuplicate)
		span.SetAttributes(tracing.AttrDuplicate.Bool(true))
	}
	if msg == skippedByWatermark {
		in.log.Warn(msg, attrs...)
		return
	}
	in.log.Debug(msg, attrs...)
}

// aggregateRef is the aggregate a message belongs to; id is empty for a
// message without one.
type aggregateRef struct {
	typ, id string
	version int64
}

// aggregateOf reads a message's aggregate: from the envelope a consumer
// decoded once for the delivery (messaging.EnvelopeOf), else from the
// metadata, for the inbox used on its own. A message without an aggregate
// id, or without a version, is not ordered.
func aggregateOf(msg *message.Message) (aggregateRef, error) {
	if env, ok := messaging.EnvelopeFrom(msg.Context()); ok && env.ID == msg.UUID {
		_, versioned := env.Metadata[messaging.MetaAggregateVersion]
		switch {
		case env.AggregateID == "" || !versioned:
			return aggregateRef{}, nil
		case env.AggregateVersion < 1:
			return aggregateRef{}, fmt.Errorf("%w: message %s has aggregate_version %d", ErrBadVersion, msg.UUID, env.AggregateVersion)
		}
		return aggregateRef{typ: env.AggregateType, id: env.AggregateID, version: env.AggregateVersion}, nil
	}
	id := msg.Metadata.Get(messaging.MetaAggregateID)
	v := msg.Metadata.Get(messaging.MetaAggregateVersion)
	if id == "" || v == "" {
		return aggregateRef{}, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return aggregateRef{}, fmt.Errorf("%w: message %s has aggregate_version %q", ErrBadVersion, msg.UUID, v)
	}
	return aggregateRef{typ: msg.Metadata.Get(messaging.MetaAggregateType), id: id, version: n}, nil
}

// Watermark returns the last version of an aggregate the consumer applied,
// 0 when it has applied none. An empty tenant means tenant.Default.
func (in *Inbox) Watermark(ctx context.Context, tenantID, aggregateType, aggregateID string) (int64, error) {
	if tenantID == "" {
		tenantID = tenant.Default
	}
	var marks []int64
	err := in.db.WithContext(ctx).Raw(`SELECT version FROM inbox_watermarks
WHERE consumer = ? AND tenant_id = ? AND aggregate_type = ? AND aggregate_id = ?`,
		in.cfg.Consumer, tenantID, aggregateType, aggregateID).Scan(&marks).Error
	if err != nil {
		return 0, wrapDB("read watermark", err)
	}
	if len(marks) == 0 {
		return 0, nil
	}
	return marks[0], nil
}

// startConsume starts the consumer span of one delivery of msg, a child of
// the trace context msg carries.
func (in *Inbox) startConsume(ctx context.Context, msg *message.Message) (context.Context, trace.Span) {
	topic := msg.Metadata.Get(messaging.MetaEventType)
	ctx, span := in.tracing.StartFrom(ctx, msg.Metadata, tracing.SpanConsume+" "+topic, trace.SpanKindConsumer)
	if span.IsRecording() {
		span.SetAttributes(
			tracing.AttrOperationType.String(tracing.OpProcess),
			tracing.AttrDestinationName.String(topic),
			tracing.AttrMessageID.String(msg.UUID),
			tracing.AttrConsumerGroupName.String(in.cfg.Consumer),
			tracing.AttrTenant.String(msg.Metadata.Get(messaging.MetaTenantID)),
		)
		if in.cfg.System != "" {
			span.SetAttributes(tracing.AttrMessagingSystem.String(in.cfg.System))
		}
	}
	return ctx, span
}

// Processed reports whether the inbox holds a record of messageID.
func (in *Inbox) Processed(ctx context.Context, messageID string) (bool, error) {
	var n int64
	err := in.db.WithContext(ctx).Model(&Record{}).
		Where("consumer = ? AND message_id = ?", in.cfg.Consumer, messageID).Count(&n).Error
	if err != nil {
		return false, wrapDB("read", err)
	}
	return n > 0, nil
}

func wrapDB(op string, err error) error { return dberr.Wrap("inbox: "+op, err) }

//go:embed migrations
var migrationFiles embed.FS

// Migrations returns the embedded SQL migrations, one folder per dialect.
func Migrations() fs.FS {
	return migrate.Folder(migrationFiles)
}

// Migrate creates or upgrades the inbox table in db (PostgreSQL or SQLite).
// It is idempotent and safe to run from several processes at once.
func Migrate(ctx context.Context, db *gorm.DB) error {
	if err := migrate.Up(ctx, db, "inbox", Migrations()); err != nil {
		return wrapDB("migrate", err)
	}
	return nil
}
