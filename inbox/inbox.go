package inbox

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dberr"
	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/migrate"
	"github.com/bentoevents/bento/internal/tracing"
	"github.com/bentoevents/bento/internal/txn"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
	"github.com/bentoevents/bento/uow"
)

var (
	// ErrInvalidConfig is returned for a bad configuration; the message
	// names every bad field.
	ErrInvalidConfig = errors.New("inbox: invalid config")
	// ErrNoMessageID is returned for a message without a usable id (empty
	// or longer than 128 characters): it cannot be deduplicated, so it is
	// never applied. The consumer sends it to the dead-letter destination.
	ErrNoMessageID = errors.New("inbox: message has no usable id")
	// ErrClosed is returned when the database handle has been closed.
	ErrClosed = errors.New("inbox: database is closed")
)

// MaxMessageIDLen is the longest message id the inbox stores.
const MaxMessageIDLen = 128

var consumerRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,200}$`)

// recordSQL records that a consumer applies a message, unless it already
// did. A plain statement rather than GORM's Create: it runs for every
// message, and GORM's Create (reflection, clause building) was 19% of
// the consumer's CPU profile in the bench.
const recordSQL = `INSERT INTO inbox_messages (consumer, message_id, tenant_id, received_at)
VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`

// Record is one row of inbox_messages: consumer applied message.
type Record struct {
	Consumer   string `gorm:"primaryKey"`
	MessageID  string `gorm:"primaryKey"`
	TenantID   string
	ReceivedAt time.Time
}

// TableName tells GORM the table.
func (Record) TableName() string { return "inbox_messages" }

// Config configures an [Inbox].
type Config struct {
	// Consumer names who applies the messages: usually the consumer group.
	// Dedup is per (Consumer, message id), so two consumers of one message
	// each apply it once. 1 to 200 ASCII letters, digits, '_', '.', ':' or
	// '-'. Required.
	Consumer string
	// TxOptions are used to begin each message's transaction. Defaults to
	// the database's default isolation.
	TxOptions *sql.TxOptions
	// Now is the clock for received_at. Defaults to time.Now.
	Now func() time.Time
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
}

// Inbox applies each message at most once per consumer: see Middleware.
type Inbox struct {
	db         *gorm.DB
	cfg        Config
	log        *slog.Logger
	processed  prometheus.Counter
	duplicates prometheus.Counter
	tracing    tracing.Tracing
	system     string // messaging.system, set by the Consumer constructors
}

// New returns the inbox of cfg.Consumer over db (PostgreSQL or SQLite, with
// the inbox table created by Migrate).
//
// Errors: ErrInvalidConfig.
func New(db *gorm.DB, cfg *Config) (*Inbox, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	var errs []error
	if _, err := dialect.Of(db); err != nil {
		errs = append(errs, fmt.Errorf("db: %w", err))
	}
	if !consumerRE.MatchString(c.Consumer) {
		errs = append(errs, fmt.Errorf("Consumer: %q must be 1 to 200 ASCII letters, digits, '_', '.', ':' or '-'", c.Consumer))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.Now == nil {
		c.Now = time.Now
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
	return func(msg *message.Message) (produced []*message.Message, err error) {
		orig := msg.Context()
		ctx, span := in.startConsume(orig, msg)
		defer func() {
			if p := recover(); p != nil {
				tracing.EndPanic(span, p)
				panic(p)
			}
			tracing.End(span, err)
		}()
		if msg.UUID == "" || len(msg.UUID) > MaxMessageIDLen {
			return nil, fmt.Errorf("%w: %q", ErrNoMessageID, msg.UUID)
		}
		tid := msg.Metadata.Get(messaging.MetaTenantID)
		if tid == "" {
			tid = tenant.Default
		}
		if err := tenant.Validate(tid); err != nil {
			return nil, fmt.Errorf("inbox: message %s: %w: %w", msg.UUID, messaging.ErrMalformedMessage, err)
		}
		tx := in.db.WithContext(ctx).Begin(in.cfg.TxOptions)
		if tx.Error != nil {
			return nil, wrapDB("begin", tx.Error)
		}
		done := false
		defer func() {
			if !done {
				tx.Rollback()
			}
		}()
		res := tx.Exec(recordSQL, in.cfg.Consumer, msg.UUID, tid, in.cfg.Now().UTC())
		if res.Error != nil {
			return nil, wrapDB("record message", res.Error)
		}
		if res.RowsAffected == 0 {
			in.duplicates.Inc()
			if span.IsRecording() {
				span.AddEvent(tracing.EventDuplicate)
				span.SetAttributes(tracing.AttrDuplicate.Bool(true))
			}
			in.log.Debug("duplicate skipped", "message_id", msg.UUID, "event_type", msg.Metadata.Get(messaging.MetaEventType))
			return nil, nil
		}

		corr := msg.Metadata.Get(messaging.MetaCorrelationID)
		if corr == "" {
			corr = msg.UUID
		}
		hctx := uow.ContextWithTx(ctx, tx)
		hctx = tenant.With(hctx, tid)
		hctx = outbox.WithMetadata(hctx, outbox.Metadata{
			outbox.MetaCorrelationID: corr,
			outbox.MetaCausationID:   msg.UUID,
		})
		msg.SetContext(hctx)
		defer msg.SetContext(orig)

		produced, err = h(msg)
		if err != nil {
			return nil, err
		}
		done = true
		if err := txn.Commit(tx); err != nil {
			return nil, wrapDB("commit", err)
		}
		uow.Committed(hctx) // the AfterCommit hooks of the handler's units
		in.processed.Inc()
		return produced, nil
	}
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
		if in.system != "" {
			span.SetAttributes(tracing.AttrMessagingSystem.String(in.system))
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

func wrapDB(op string, err error) error {
	if dberr.IsClosed(err) {
		return fmt.Errorf("inbox: %s: %w: %w", op, ErrClosed, err)
	}
	return fmt.Errorf("inbox: %s: %w", op, err)
}

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
