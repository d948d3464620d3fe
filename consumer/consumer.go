package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/conf"
	"github.com/bentoevents/bento/internal/dberr"
	"github.com/bentoevents/bento/internal/tracing"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
	"github.com/bentoevents/bento/uow"
)

var (
	// ErrInvalidConfig is returned for a bad configuration; the message
	// names every bad field.
	ErrInvalidConfig = errors.New("consumer: invalid config")
	// ErrPermanent marks a handler error that retrying cannot fix: the
	// message goes to the dead-letter destination at once. Wrap errors with
	// Permanent.
	ErrPermanent = errors.New("consumer: permanent failure")
	// ErrNoHandler is returned for a message whose event type has no
	// handler in the consumer; it wraps messaging.ErrUnknownEventType and is
	// dead-lettered at once.
	ErrNoHandler = fmt.Errorf("consumer: no handler: %w", messaging.ErrUnknownEventType)
	// ErrHandlerTimeout is the failure of an attempt that outlasted
	// Config.HandlerTimeout; it counts toward MaxRetries.
	ErrHandlerTimeout = errors.New("consumer: handler timed out")
	// ErrRunning is returned when Handle is called on a running consumer or
	// Run is called twice.
	ErrRunning = errors.New("consumer: already running")
	// ErrNotRunning is Health's answer before Run has subscribed and after
	// it returned.
	ErrNotRunning = errors.New("consumer: not running")
	// ErrMembershipLapsed is Health's answer while a partitioned consumer
	// cannot renew its membership (the database is unreachable) and has
	// released its partitions.
	ErrMembershipLapsed = errors.New("consumer: membership lapsed; partitions released")
)

// MetaDeadReason is the metadata key under which a dead letter carries the
// error that killed it (set by Watermill's poison middleware, along with
// topic_poisoned, handler_poisoned and subscriber_poisoned).
const MetaDeadReason = middleware.ReasonForPoisonedKey

// MetaDeadCause is the metadata key under which a dead letter carries why
// it was given up on: one of the Cause constants.
const MetaDeadCause = "dead_cause"

// Metadata keys of dead letters and replays.
const (
	// MetaDeadAt is when the consumer gave the message up (RFC 3339, UTC).
	MetaDeadAt = "dead_at"
	// MetaDeadAttempts is how many attempts failed before it did.
	MetaDeadAttempts = "dead_attempts"
	// MetaReplays counts the times a dead letter was replayed.
	MetaReplays = "bento_replays"
)

// The causes of dead letters (MetaDeadCause).
const (
	// CauseDecode: the message could not be decoded (malformed metadata or
	// payload, unknown event type or schema version, no handler).
	CauseDecode = "decode"
	// CausePermanent: the handler returned an error wrapped with Permanent,
	// or the message has no usable id or version.
	CausePermanent = "permanent"
	// CauseFailed: the handler kept failing (or timing out, see
	// HandlerTimeout) through MaxRetries retries, or a transient failure
	// outlasted OutageWindow.
	CauseFailed = "failed"
	// CauseGap: under inbox.VersionsContiguous, the aggregate's previous
	// version was not applied within GapTimeout. (With hold-back such an
	// event stays parked, with the reason inbox.ParkedGap: see Parked.)
	CauseGap = inbox.ParkedGap
)

// Defaults of the Config fields that take one when zero.
const (
	// DefaultMaxRetries is how many times a failing message is retried.
	DefaultMaxRetries = 5
	// DefaultRetryInitialInterval and DefaultRetryMaxInterval bound the
	// backoff between retries.
	DefaultRetryInitialInterval = 100 * time.Millisecond
	DefaultRetryMaxInterval     = 10 * time.Second
	// DefaultCloseTimeout is how long Run waits for handlers to finish.
	DefaultCloseTimeout = 30 * time.Second
	// DefaultOutageWindow is how long transient failures are retried.
	DefaultOutageWindow = time.Hour
	// DefaultGapTimeout is how long a message waits for its predecessor.
	DefaultGapTimeout = 5 * time.Minute
	// DefaultPartitions is the partition count of a group.
	DefaultPartitions = 16
	// DefaultDeliveryLimit is how many times a quorum partition queue
	// delivers a message again before RabbitMQ dead-letters it:
	// rabbitmq.DefaultDeliveryLimit.
	DefaultDeliveryLimit = rabbitmq.DefaultDeliveryLimit
	// DefaultTakeoverTime bounds how long the partitions of an instance
	// that died wait before another instance takes them over.
	DefaultTakeoverTime = 10 * time.Second
	// DefaultBatchSize is the BatchSize of a partitioned group: measured on RabbitMQ
	// and PostgreSQL (docs/benchmarks.md), it applies 5 to 10 times the
	// messages a second of one transaction per message, and adds no
	// latency (0.1 ms at p50 at 200 events/s; at 1,000 events/s it cuts
	// p50 from 32 ms to 1.7 ms).
	DefaultBatchSize = 100
)

// Permanent wraps err so the consumer does not retry it.
func Permanent(err error) error { return fmt.Errorf("%w: %w", ErrPermanent, err) }

// IsPermanent reports whether err is one retrying cannot fix: a malformed
// message, an unknown event type or schema version, an undecodable payload,
// a failed upcast, a message without an id or with a malformed aggregate
// version, or an error wrapped with Permanent.
func IsPermanent(err error) bool {
	return errors.Is(err, ErrPermanent) || errors.Is(err, inbox.ErrNoMessageID) || errors.Is(err, inbox.ErrBadVersion) ||
		isDecode(err)
}

// Config configures a Consumer. A nil Config or a zero field means the
// field's default, so Config{Group: "billing"} is a complete
// configuration; a negative value means "none" or "off" where a field's
// doc says so. Impossible or contradictory values (Subscriptions on a
// partitioned group, a RetryMaxInterval below RetryInitialInterval) are
// rejected with [ErrInvalidConfig] naming the field.
type Config struct {
	// Group names the consumer group: its queue, its inbox consumer name and
	// its dead-letter destination. It has no default: it is required.
	Group string
	// Registry decodes payloads into event types (with upcasters). Handle
	// registers each handled type as current. Defaults to a new, empty
	// registry.
	Registry *messaging.Registry
	// MaxRetries is how many times a failing message is retried in the
	// consumer, with exponential backoff, before it is dead-lettered.
	// Transient failures (see OutageWindow) and gaps (see GapTimeout) do
	// not count. A negative value means no retries: the first failure
	// dead-letters the message. Defaults to DefaultMaxRetries (5).
	MaxRetries int
	// OutageWindow is how long a message whose handling fails transiently
	// (the database unreachable or restarting, a lost connection, a
	// serialization failure or deadlock, a lock or statement timeout, a
	// busy SQLite) keeps being retried with backoff, holding its place so
	// that nothing behind it on its subscription overtakes it. Past the
	// window such failures count toward MaxRetries. A negative value means
	// none. Defaults to DefaultOutageWindow (1h).
	OutageWindow time.Duration
	// GapTimeout is how long a message refused with inbox.ErrGap (its
	// aggregate's previous version not applied yet, under
	// inbox.VersionsContiguous) waits for its predecessor before it is given
	// up as a dead letter with the cause "gap": with hold-back it waits
	// parked and stays parked with the reason inbox.ParkedGap (applied if
	// the predecessor turns up, or after Release); without, it is retried
	// in place, holding its subscription, and then dead-lettered. A
	// negative value means no wait. Defaults to DefaultGapTimeout (5m).
	GapTimeout time.Duration
	// HandlerTimeout bounds each attempt at a message: its context (and so
	// the inbox transaction and every query made with it) is cancelled
	// after that long, and the attempt fails like any other, counting
	// toward MaxRetries, so a message that hangs its handler ends in dead
	// letters instead of holding its partition forever. A handler that
	// ignores its context is not interrupted. A negative value also means
	// no limit. Defaults to no limit.
	HandlerTimeout time.Duration
	// RetryInitialInterval is the backoff before the first retry; it
	// doubles up to RetryMaxInterval, which must not be below it. Defaults
	// to 100ms.
	RetryInitialInterval time.Duration
	// RetryMaxInterval caps the backoff between retries. Defaults to 10s.
	RetryMaxInterval time.Duration
	// CloseTimeout is how long Run waits for handlers when its context ends.
	// Defaults to 30s.
	CloseTimeout time.Duration
	// Partitions splits the group's events into that many partitions by
	// (tenant, aggregate type, aggregate id): each partition is a queue
	// with a single active consumer, handled by one instance of the group
	// at a time, one message at a time, in order, so an aggregate's events
	// reach the handler in the order they were published. The partitions
	// are dealt among the running instances (through the consumer_members
	// table) and move when one starts, stops or dies (see TakeoverTime).
	// Every instance of a group must use the same count. On RabbitMQ it
	// needs the consistent-hash exchange plugin (see
	// rabbitmq.DeclarePartitions). A negative value means no partitions:
	// one queue, "<group>", with Subscriptions competing subscriptions and
	// no order. Defaults to DefaultPartitions (16).
	Partitions int
	// QueueType is the RabbitMQ type of the partition queues:
	// rabbitmq.Quorum or rabbitmq.Classic. Defaults to rabbitmq.Quorum.
	QueueType rabbitmq.QueueType
	// DeliveryLimit is, for quorum partition queues, how many times a
	// message is delivered again (after the process handling it died, or a
	// partition moved) before RabbitMQ dead-letters it: it stops a message
	// that crashes every process it reaches. Defaults to
	// DefaultDeliveryLimit (20).
	DeliveryLimit int
	// TakeoverTime bounds how long the partitions of an instance that died
	// stay without a consumer: each instance renews its membership every
	// quarter of it and is forgotten three quarters after its last renewal.
	// An instance that cannot reach the database for that long releases its
	// partitions. Defaults to DefaultTakeoverTime (10s).
	TakeoverTime time.Duration
	// DisableHoldBack turns off hold-back, which, with Partitions, keeps an
	// aggregate's events in order past a dead letter or a gap. The first
	// dead-lettered event of an aggregate holds it back (inbox_holds); its
	// later events are parked in the database (inbox_parked, see Parked)
	// instead of being applied, while the partition moves on to other
	// aggregates. Replaying the dead letter applies it and then the parked
	// events, in order; Release lets them through without it. Under
	// inbox.VersionsContiguous an event whose predecessor has not been
	// applied is parked too ("waiting", "gap" once it has waited
	// GapTimeout), with the aggregate's later events behind it, and applied
	// as soon as the predecessor is. Defaults to false: hold-back is on.
	DisableHoldBack bool
	// PartitionConcurrency, with Partitions, is how many of its partitions
	// an instance handles at once, each message in its own transaction.
	// Setting it without Partitions is an error. Defaults to all the
	// partitions the instance owns.
	PartitionConcurrency int
	// Subscriptions, without Partitions (Partitions negative), is how many
	// subscriptions compete for the group's queue, handling messages in no
	// particular order, at most 256 (each holds a database connection
	// while it handles a message). Setting it with Partitions is an error.
	// Defaults to 1.
	Subscriptions int
	// BatchSize, with Partitions, is how many consecutive messages of a
	// partition are applied in one transaction (see inbox.ApplyBatch): one
	// insert of their inbox records, their handlers in order, one commit,
	// then their acks, never before the commit. A message that fails stops
	// its batch: those before it commit, and it is tried again on its own,
	// under the retry rules (so its batch attempt is one more than
	// MaxRetries counts), before those after it. A message whose aggregate
	// is held back or has parked events is handled on its own too. The
	// partition subscription holds that many messages at a time. At most
	// inbox.MaxBatch; 1 or a negative value applies each message in its own
	// transaction, as a group without Partitions always does (a BatchSize
	// above 1 there is an error). Defaults to DefaultBatchSize (100).
	BatchSize int
	// BatchWait is how long a batch waits to fill once it has its first
	// message. Defaults to 0: a batch takes only the messages already at
	// hand, so it adds no latency.
	BatchWait time.Duration
	// Versions is the inbox's policy for aggregate versions (see
	// inbox.Versions): VersionsIncreasing or VersionsContiguous keep a
	// version watermark per aggregate, which skips late duplicates even
	// after their inbox records were purged; with VersionsContiguous a
	// message that arrives before its predecessor was applied fails with
	// inbox.ErrGap and is retried like any failure. Defaults to
	// inbox.VersionsIgnored, which dedups by message id alone.
	Versions inbox.Versions
	// TxOptions are used for each message's transaction. Defaults to the
	// database's default isolation.
	TxOptions *sql.TxOptions
	// Logger receives the consumer's and Watermill's logs. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Registerer, when set, receives the consumer's and the inbox's
	// metrics. Defaults to none.
	Registerer prometheus.Registerer
	// TracerProvider creates the consumer span of each delivery (see
	// Inbox.Middleware). Defaults to otel.GetTracerProvider(), a no-op
	// until the application sets one.
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context of each message. Defaults to W3C
	// Trace Context (traceparent, tracestate).
	Propagator propagation.TextMapPropagator
}

// maxSubscriptions bounds Config.Subscriptions: each subscription holds
// a database connection while it handles a message.
const maxSubscriptions = 256

// DefaultConfig returns Config{Group: group} with every default spelled
// out: 16 partitions with hold-back, batches of up to 100 messages, 5
// retries with backoff from 100ms to 10s, a 30s close timeout and a new
// registry. New, NewMemory and NewAMQP fill the same defaults into a
// Config's zero fields; it is there to read or print them.
func DefaultConfig(group string) *Config {
	c, _ := (&Config{Group: group}).withDefaults()
	return &c
}

// withDefaults returns a copy of c (nil means a zero Config) whose zero
// fields are set to their defaults. Negative values stay as they are: each
// use treats them as "none". It names every field that is impossible or
// contradicts another.
func (c *Config) withDefaults() (Config, error) {
	out := conf.Value(c)
	var p conf.Problems
	if err := inbox.CheckConsumer(out.Group); err != nil {
		p.Add("Group", err)
	}
	if out.Registry == nil {
		out.Registry = messaging.NewRegistry()
	}
	conf.OrDefault(&out.MaxRetries, DefaultMaxRetries)
	conf.OrDefault(&out.OutageWindow, DefaultOutageWindow)
	conf.OrDefault(&out.GapTimeout, DefaultGapTimeout)
	conf.Default(&p, "RetryInitialInterval", &out.RetryInitialInterval, DefaultRetryInitialInterval)
	conf.Default(&p, "RetryMaxInterval", &out.RetryMaxInterval, DefaultRetryMaxInterval)
	if out.RetryMaxInterval < out.RetryInitialInterval {
		p.Addf("RetryMaxInterval", "%v is below RetryInitialInterval %v", out.RetryMaxInterval, out.RetryInitialInterval)
	}
	conf.Default(&p, "CloseTimeout", &out.CloseTimeout, DefaultCloseTimeout)
	conf.OrDefault(&out.Partitions, DefaultPartitions)
	partitioned := out.Partitions > 0
	if out.Partitions > messaging.MaxPartitions {
		p.Addf("Partitions", "%d is more than %d", out.Partitions, messaging.MaxPartitions)
	}
	switch {
	case out.PartitionConcurrency < 0:
		p.Addf("PartitionConcurrency", "%d is negative", out.PartitionConcurrency)
	case out.PartitionConcurrency > 0 && !partitioned:
		p.Addf("PartitionConcurrency", "%d without Partitions; use Subscriptions", out.PartitionConcurrency)
	}
	switch {
	case out.Subscriptions < 0 || out.Subscriptions > maxSubscriptions:
		p.Addf("Subscriptions", "%d, want 1 to %d", out.Subscriptions, maxSubscriptions)
	case out.Subscriptions > 0 && partitioned:
		p.Addf("Subscriptions", "%d with Partitions %d; use PartitionConcurrency, or a negative Partitions for competing subscriptions",
			out.Subscriptions, out.Partitions)
	case out.Subscriptions == 0 && !partitioned:
		out.Subscriptions = 1
	}
	switch {
	case out.BatchSize > inbox.MaxBatch:
		p.Addf("BatchSize", "%d is more than %d", out.BatchSize, inbox.MaxBatch)
	case out.BatchSize > 1 && !partitioned:
		p.Addf("BatchSize", "%d without Partitions, which applies each message alone", out.BatchSize)
	case out.BatchSize < 0 || (out.BatchSize == 0 && !partitioned):
		out.BatchSize = 1
	case out.BatchSize == 0:
		out.BatchSize = DefaultBatchSize
	}
	if out.BatchWait < 0 {
		p.Addf("BatchWait", "%v is negative", out.BatchWait)
	}
	conf.Default(&p, "DeliveryLimit", &out.DeliveryLimit, DefaultDeliveryLimit)
	conf.Default(&p, "TakeoverTime", &out.TakeoverTime, DefaultTakeoverTime)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, p.Err(ErrInvalidConfig)
}

// SubscriberFactory returns the subscriber of a consumer group, bound to the
// topic patterns of its handlers. Without Config.Partitions, each of its
// subscriptions competes for the group's messages. With Partitions, it must
// have declared the group's partition queues, and Subscribe(ctx,
// messaging.PartitionQueue(group, p)) must consume partition p, with a
// single active consumer across every instance, as the subscribers of
// rabbitmq.NewPartitionSubscriber and MemoryBus.PartitionSubscriber do.
type SubscriberFactory func(patterns []string) (message.Subscriber, error)

// Consumer runs typed handlers for one consumer group: each message is
// decoded, deduplicated by the inbox, handled in the inbox's transaction,
// retried with backoff when it fails, and dead-lettered when it keeps
// failing or cannot be decoded. Build it with NewAMQP, NewMemory or New,
// add handlers with Handle, then Run.
type Consumer struct {
	cfg       Config
	inbox     *inbox.Inbox
	newSub    SubscriberFactory
	dead      message.Publisher
	deadTopic string
	closers   []func() error
	members   *members // with Partitions
	owned     atomic.Pointer[[]int]
	drainMu   sync.Mutex // one drain of parked events at a time
	breaker   *breaker
	metrics   metrics
	deadDepth func(context.Context) (int, error) // messages in the dead-letter queue; nil when unknown
	live      atomic.Bool                        // subscribed, and Run has not returned
	lapsed    atomic.Bool                        // membership lapsed

	mu       sync.Mutex
	handlers map[string]handler
	started  bool
	running  chan struct{}
}

// New returns a consumer over db that reads from the subscriber
// newSub returns and publishes dead letters to deadTopic on dead. db needs
// the inbox and outbox tables (inbox.Migrate, outbox.Migrate).
//
// Errors: ErrInvalidConfig, inbox.ErrNotMigrated.
func New(db *gorm.DB, newSub SubscriberFactory, dead message.Publisher, deadTopic string, cfg *Config) (*Consumer, error) {
	return newConsumer(db, newSub, dead, deadTopic, cfg, "")
}

// newConsumer is New, with the messaging system named on consumer spans.
func newConsumer(db *gorm.DB, newSub SubscriberFactory, dead message.Publisher, deadTopic string, cfg *Config, system string) (*Consumer, error) {
	c, err := cfg.withDefaults()
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if newSub == nil {
		errs = append(errs, fmt.Errorf("%w: nil subscriber factory", ErrInvalidConfig))
	}
	if dead == nil || deadTopic == "" {
		errs = append(errs, fmt.Errorf("%w: dead-letter publisher and topic are required", ErrInvalidConfig))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	in, err := inbox.New(db, &inbox.Config{Consumer: c.Group, TxOptions: c.TxOptions, Logger: c.Logger, Registerer: c.Registerer,
		TracerProvider: c.TracerProvider, Propagator: c.Propagator, System: system, Versions: c.Versions})
	if errors.Is(err, inbox.ErrNotMigrated) {
		return nil, fmt.Errorf("consumer %s: %w", c.Group, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	m, err := newMetrics(c.Registerer, c.Group)
	if err != nil {
		return nil, fmt.Errorf("consumer: metrics: %w", err)
	}
	dead = countingPublisher{Publisher: dead, dead: m.deadLettered}
	m.partitionCount.Set(float64(max(c.Partitions, 0)))
	var mem *members
	if c.Partitions > 0 {
		if mem, err = newMembers(db, c.Group, c.Partitions); err != nil {
			return nil, err
		}
	}
	return &Consumer{
		cfg: c, inbox: in, newSub: newSub, dead: dead, deadTopic: deadTopic, members: mem,
		breaker: newBreaker(c.RetryInitialInterval, c.RetryMaxInterval), metrics: m,
		handlers: map[string]handler{},
		running:  make(chan struct{}),
	}, nil
}

// Config returns the consumer's configuration with defaults filled in.
func (c *Consumer) Config() Config { return c.cfg }

var notTopicChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// DeadLetterTopic is the topic dead letters of group are published under:
// "bento-dead.<group>", with characters a topic cannot hold replaced by '_'.
// Its queue is "<group>.dead".
func DeadLetterTopic(group string) string {
	return "bento-dead." + notTopicChars.ReplaceAllString(group, "_")
}

// NewMemory returns a consumer of group cfg.Group on the in-memory
// bus: with Partitions, of the group's partition queues (see
// MemoryBus.DeclarePartitions), else of the queue named after the group.
// Dead letters go to the queue "<group>.dead", bound to
// DeadLetterTopic(group) on the same bus (so a consumer bound to "#" sees
// them too). cfg's zero fields take their defaults.
//
// Errors: ErrInvalidConfig.
func NewMemory(db *gorm.DB, bus *messaging.MemoryBus, cfg *Config) (*Consumer, error) {
	if bus == nil {
		return nil, fmt.Errorf("%w: nil bus", ErrInvalidConfig)
	}
	resolved, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg = &resolved
	topic := DeadLetterTopic(cfg.Group)
	if err := bus.DeclareQueue(DeadLetterQueue(cfg.Group), topic); err != nil {
		return nil, fmt.Errorf("consumer: declare dead-letter queue: %w", err)
	}
	newSub := func(patterns []string) (message.Subscriber, error) {
		if cfg.Partitions > 0 {
			if err := bus.DeclarePartitions(cfg.Group, cfg.Partitions, patterns...); err != nil {
				return nil, err
			}
			return bus.PartitionSubscriber(cfg.BatchSize), nil
		}
		if err := bus.DeclareQueue(cfg.Group, patterns...); err != nil {
			return nil, err
		}
		return bus.Subscriber(cfg.Group, patterns...), nil
	}
	c, err := newConsumer(db, newSub, bus, topic, cfg, tracing.SystemMemory)
	if err != nil {
		return nil, err
	}
	deadQueue := DeadLetterQueue(cfg.Group)
	c.deadDepth = func(context.Context) (int, error) { return bus.Depth(deadQueue) }
	return c, nil
}

// NewAMQP returns a consumer of group cfg.Group on RabbitMQ. With
// cfg.Partitions, it reads the group's partition queues, declared by Run
// with rabbitmq.DeclarePartitions (see PartitionSpec) and bound on
// amqpCfg.Exchange to the event types of its handlers; it needs RabbitMQ's
// consistent-hash exchange plugin, and Run fails with
// rabbitmq.ErrHashExchangeMissing without it. Without Partitions, it reads
// the durable queue named after the group. Dead letters go to the exchange
// "<exchange>.dead" with routing key DeadLetterTopic(group), bound to the
// durable queue "<group>.dead", declared here, so they never mix with
// events; the partition queues' delivery limit sends poison there too.
// The zero fields of amqpCfg and cfg take their defaults.
//
// Errors: ErrInvalidConfig, rabbitmq.ErrInvalidConfig (a nil amqpCfg
// names no URL), or the broker's error.
func NewAMQP(ctx context.Context, db *gorm.DB, amqpCfg *rabbitmq.Config, cfg *Config) (*Consumer, error) {
	resolved, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg = &resolved
	deadCfg := conf.Value(amqpCfg)
	deadCfg.Exchange = DeadLetterExchange(amqpCfg.ExchangeName())
	topic := DeadLetterTopic(cfg.Group)
	if err := rabbitmq.DeclareQueue(ctx, &deadCfg, DeadLetterQueue(cfg.Group), topic); err != nil {
		return nil, fmt.Errorf("consumer: declare dead-letter queue: %w", err)
	}
	dead, err := rabbitmq.NewPublisher(ctx, &deadCfg)
	if err != nil {
		return nil, fmt.Errorf("consumer: dead-letter publisher: %w", err)
	}
	newSub := func(patterns []string) (message.Subscriber, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if cfg.Partitions > 0 {
			spec := PartitionSpec(amqpCfg.ExchangeName(), cfg)
			spec.Patterns, spec.Prefetch = patterns, cfg.BatchSize
			return rabbitmq.NewPartitionSubscriber(ctx, amqpCfg, spec)
		}
		return rabbitmq.NewSubscriber(ctx, amqpCfg, cfg.Group, patterns...)
	}
	c, err := newConsumer(db, newSub, dead, topic, cfg, tracing.SystemRabbitMQ)
	if err != nil {
		_ = dead.Close()
		return nil, err
	}
	c.closers = append(c.closers, dead.Close)
	deadQueue := DeadLetterQueue(cfg.Group)
	c.deadDepth = func(ctx context.Context) (int, error) { return rabbitmq.QueueDepth(ctx, amqpCfg, deadQueue) }
	return c, nil
}

// PartitionSpec returns the partition queues of the consumer group cfg
// describes, on the exchange named exchange: what NewAMQP's consumer
// declares. Declare them with rabbitmq.DeclarePartitions before the first
// events of the group's types are relayed, so none is missed, with the
// event types the group handles as Patterns (this leaves Patterns empty).
// cfg's zero fields take their defaults (a nil cfg is a zero Config).
func PartitionSpec(exchange string, cfg *Config) rabbitmq.PartitionSpec {
	c, _ := cfg.withDefaults() // a bad config fails when the spec is declared
	return rabbitmq.PartitionSpec{
		Group: c.Group, Count: c.Partitions, QueueType: c.QueueType, DeliveryLimit: c.DeliveryLimit,
		DeadExchange: DeadLetterExchange(exchange), DeadKey: DeadLetterTopic(c.Group),
	}
}

// HandlerFunc handles one event of type E inside the inbox transaction
// of its message. tx is that transaction, bound to ctx: write through it
// (or through a unit of work begun with ctx, which joins it), so the
// handler's writes commit with the inbox record, exactly once, or roll
// back with it. A write through any other *gorm.DB runs outside that
// transaction: it is not undone when the message is retried, and on
// SQLite it waits for the lock the inbox transaction holds. env is the
// event's envelope (id, aggregate, tenant, occurred_at, correlation and
// causation ids).
type HandlerFunc[E aggregate.Event] func(ctx context.Context, tx *gorm.DB, e E, env *messaging.Envelope) error

// handler is a registered HandlerFunc, over any event type.
type handler func(ctx context.Context, tx *gorm.DB, ev aggregate.Event, env *messaging.Envelope) error

// Handle registers fn as the consumer's handler for events of type E: E is
// registered in the consumer's registry as the current type of its event
// type, and the group's queue is bound to that event type. fn receives the
// inbox transaction (see HandlerFunc), the decoded event (upcast from
// older schema versions) and its envelope; ctx carries the transaction
// too, so units of work begun with it join it.
//
// Errors: messaging.ErrRegistration, an error for a second handler of the
// same event type, ErrRunning.
func Handle[E aggregate.Event](c *Consumer, fn HandlerFunc[E]) error {
	if err := messaging.Register[E](c.cfg.Registry); err != nil {
		return err
	}
	var zero E
	eventType := zero.EventType()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return ErrRunning
	}
	if _, dup := c.handlers[eventType]; dup {
		return fmt.Errorf("consumer: a handler for %s is already registered in %s", eventType, c.cfg.Group)
	}
	c.handlers[eventType] = func(ctx context.Context, tx *gorm.DB, ev aggregate.Event, env *messaging.Envelope) error {
		e, ok := ev.(E)
		if !ok {
			return Permanent(fmt.Errorf("event %s decoded as %T, handler wants %T", env.ID, ev, zero))
		}
		return fn(ctx, tx, e, env)
	}
	return nil
}

// Release lets a held-back aggregate's parked events through (see
// Config.DisableHoldBack): for when the dead letter it is held behind was
// discarded, or the versions a parked event waits for are lost for good
// (under inbox.VersionsContiguous they are skipped). The consumer of the
// events' partition applies them within about a second. It reports whether
// there was a hold or a gap to give up. An empty tenant means the default
// tenant.
func (c *Consumer) Release(ctx context.Context, tenantID, aggregateType, aggregateID string) (bool, error) {
	return c.inbox.Release(ctx, tenantID, aggregateType, aggregateID)
}

// Group returns the consumer group.
func (c *Consumer) Group() string { return c.cfg.Group }

// DeadLetterTopic returns the topic dead letters are published under.
func (c *Consumer) DeadLetterTopic() string { return c.deadTopic }

// Partitions returns the partitions this instance handles now, in order:
// none before Run, after it returns, or while its membership has lapsed,
// and none for a consumer without Config.Partitions.
func (c *Consumer) Partitions() []int {
	if p := c.owned.Load(); p != nil {
		return slices.Clone(*p)
	}
	return nil
}

// Running is closed once Run has subscribed and messages flow.
func (c *Consumer) Running() <-chan struct{} { return c.running }

// Health returns nil while the consumer runs: Run has subscribed and not
// returned, and, for a partitioned group, its membership is current.
//
// Errors: ErrNotRunning, ErrMembershipLapsed.
func (c *Consumer) Health() error {
	switch {
	case !c.live.Load():
		return ErrNotRunning
	case c.lapsed.Load():
		return ErrMembershipLapsed
	}
	return nil
}

// markRunning marks the consumer subscribed: Running and Health say so.
func (c *Consumer) markRunning() {
	c.live.Store(true)
	close(c.running)
}

// dispatch calls the handler of a message's event type with the envelope
// decoded once for the delivery (messaging.EnvelopeOf).
func (c *Consumer) dispatch(msg *message.Message) error {
	env, err := messaging.EnvelopeOf(msg)
	if err != nil {
		return err
	}
	c.mu.Lock()
	h := c.handlers[env.EventType]
	c.mu.Unlock()
	if h == nil {
		return fmt.Errorf("%w: %s in %s", ErrNoHandler, env.EventType, c.cfg.Group)
	}
	ev, err := c.cfg.Registry.Decode(env)
	if err != nil {
		return err
	}
	ctx := msg.Context()
	tx, ok := uow.TxFromContext(ctx)
	if !ok { // the inbox middleware always runs dispatch in a transaction
		return fmt.Errorf("consumer: message %s reached its handler outside an inbox transaction", env.ID)
	}
	start := time.Now()
	err = h(ctx, tx.WithContext(ctx), ev, env)
	result := "ok"
	if err != nil {
		result = "error"
	}
	c.metrics.handlerSeconds.WithLabelValues(env.EventType, result).Observe(time.Since(start).Seconds())
	return err
}

// retry is the middleware that decides, for each failure of a message,
// whether to try it again (after a backoff, in place, so nothing behind it
// on its subscription overtakes it) or to give up: then it returns the
// error with the cause in MetaDeadCause, for the poison middleware to
// dead-letter. A message whose context ends (the consumer stopping) is
// returned at once, to be redelivered.
func (c *Consumer) retry(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		// One decode per delivery: the inbox and the handler read the
		// envelope kept in the message's context. A message that does not
		// decode fails each attempt with that error (dead-lettered as
		// CauseDecode below).
		_, decodeErr := messaging.EnvelopeOf(msg)
		ctx := msg.Context()
		start := time.Now()
		delay := c.cfg.RetryInitialInterval
		failures := 0
		holds := !c.cfg.DisableHoldBack && c.cfg.Partitions > 0
		for {
			probe, err := c.breaker.enter(ctx)
			if err != nil {
				return nil, fmt.Errorf("consumer: stopped waiting for the database: %w", context.Canceled)
			}
			var out []*message.Message
			var st inbox.HoldState
			err = decodeErr
			if err == nil && holds {
				st, err = c.inbox.CheckHold(ctx, msg)
			}
			if err == nil {
				out, err = c.attempt(ctx, msg, h)
			}
			c.leaveBreaker(ctx, probe, err)
			if err == nil {
				if st.Own {
					c.unhold(ctx, msg)
				}
				if st.Parked { // its aggregate's later events, parked behind it
					c.drain(ctx, aggregateOf(msg))
				}
				return out, nil
			}
			if ctx.Err() != nil && !errors.Is(err, context.Canceled) {
				// The consumer is stopping or giving the partition up: the
				// message goes back to its queue, whatever it failed with.
				return nil, fmt.Errorf("consumer: stopped retrying: %w (%w)", context.Canceled, err)
			}
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return nil, err
			}
			if reason := parkReason(err); holds && reason != "" {
				// Out of order: park it, and let its partition move on.
				perr := c.park(ctx, msg, reason, err)
				if perr == nil {
					return nil, nil
				}
				err = perr // retried like any failure, in place
			}
			cause := ""
			switch waited := time.Since(start); {
			case errors.Is(err, ErrNoHandler) || isDecode(err):
				cause = CauseDecode
			case IsPermanent(err):
				cause = CausePermanent
			case errors.Is(err, inbox.ErrGap):
				if waited >= c.cfg.GapTimeout {
					cause = CauseGap
				}
			case dberr.IsTransient(err) && waited < c.cfg.OutageWindow:
				c.cfg.Logger.Warn("consumer: transient failure; retrying in place", "group", c.cfg.Group,
					"message_id", msg.UUID, "waited", waited.Round(time.Millisecond), "err", err)
			default:
				if failures++; failures > c.cfg.MaxRetries {
					cause = CauseFailed
				}
			}
			if holds && cause != "" {
				// Hold the aggregate before its event leaves; if the hold
				// cannot be written, keep the event rather than let later
				// ones overtake it.
				if herr := c.inbox.Hold(ctx, msg); herr != nil {
					c.cfg.Logger.Warn("consumer: cannot hold the aggregate back; keeping the message", "group", c.cfg.Group,
						"message_id", msg.UUID, "err", herr)
					cause = ""
				}
			}
			if cause != "" {
				markDead(msg, cause, max(failures, 1))
				return nil, err
			}
			jittered := delay/2 + rand.N(delay/2+1)
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("consumer: stopped retrying: %w (%w)", context.Canceled, err)
			case <-time.After(jittered):
			}
			delay = min(2*delay, c.cfg.RetryMaxInterval)
		}
	}
}

// leaveBreaker tells the breaker what an attempt that ended with err says
// about the database, and logs when that opens or closes it.
func (c *Consumer) leaveBreaker(ctx context.Context, probe bool, err error) {
	o := reachable
	switch {
	case ctx.Err() != nil:
		o = neutral
	case err != nil && dberr.IsTransient(err):
		o = unreachable
	}
	switch opened, down := c.breaker.leave(probe, o); {
	case opened:
		c.cfg.Logger.Warn("consumer: the database is unreachable; the group waits, one message probing it",
			"group", c.cfg.Group, "err", err)
	case down > 0:
		c.cfg.Logger.Info("consumer: the database answers again; the group goes on", "group", c.cfg.Group,
			"down", down.Round(time.Millisecond))
	}
}

// markDead stamps msg as a dead letter: its cause, when, and after how many
// attempts.
func markDead(msg *message.Message, cause string, attempts int) {
	msg.Metadata.Set(MetaDeadCause, cause)
	msg.Metadata.Set(MetaDeadAt, time.Now().UTC().Format(time.RFC3339Nano))
	msg.Metadata.Set(MetaDeadAttempts, strconv.Itoa(attempts))
}

// attempt runs h on msg once, within HandlerTimeout when there is one: the
// message's context is bounded for the attempt, then restored.
func (c *Consumer) attempt(ctx context.Context, msg *message.Message, h message.HandlerFunc) ([]*message.Message, error) {
	if c.cfg.HandlerTimeout <= 0 {
		return h(msg)
	}
	actx, cancel := context.WithTimeout(ctx, c.cfg.HandlerTimeout)
	defer cancel()
	msg.SetContext(actx)
	defer msg.SetContext(ctx)
	out, err := h(msg)
	if err != nil && actx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
		// Not wrapped: a timeout counts toward MaxRetries, whatever the
		// cancelled query says (a cancellation, a lost connection).
		err = fmt.Errorf("%w after %v (%v)", ErrHandlerTimeout, c.cfg.HandlerTimeout, err)
	}
	return out, err
}

// isDecode reports whether err says a message could not be decoded.
func isDecode(err error) bool {
	for _, target := range []error{messaging.ErrMalformedMessage, messaging.ErrUnknownEventType,
		messaging.ErrUnknownSchemaVersion, messaging.ErrMalformedPayload, messaging.ErrUpcast} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// poison is the middleware that dead-letters what retry gave up on. A
// handler that fails because the consumer is stopping (its message's
// context was cancelled) has not failed on the message: leave it to be
// nacked and redelivered, never dead-lettered.
func (c *Consumer) poison() (message.HandlerMiddleware, error) {
	poison, err := middleware.PoisonQueueWithFilter(c.dead, c.deadTopic, func(err error) bool {
		return !errors.Is(err, context.Canceled)
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: dead-letter middleware: %w", err)
	}
	return poison, nil
}

// chain is the handler of a partitioned consumer: the router's middlewares
// around dispatch, outermost first.
func (c *Consumer) chain() (message.HandlerFunc, error) {
	poison, err := c.poison()
	if err != nil {
		return nil, err
	}
	h := func(msg *message.Message) ([]*message.Message, error) { return nil, c.dispatch(msg) }
	return poison(c.retry(middleware.Recoverer(c.inbox.Middleware(h)))), nil
}

// Run subscribes and handles messages until ctx ends, then waits up to
// CloseTimeout for the handlers in flight and returns. A consumer runs once.
func (c *Consumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.started {
		c.mu.Unlock()
		return ErrRunning
	}
	c.started = true
	patterns := c.cfg.Registry.Types()
	var bound []string
	for _, p := range patterns {
		if _, ok := c.handlers[p]; ok {
			bound = append(bound, p)
		}
	}
	c.mu.Unlock()
	defer func() {
		c.live.Store(false)
		for _, f := range c.closers {
			_ = f()
		}
	}()
	if len(bound) == 0 {
		return fmt.Errorf("%w: consumer %s has no handlers", ErrInvalidConfig, c.cfg.Group)
	}
	gctx, stopGauges := context.WithCancel(ctx)
	gaugesDone := make(chan struct{})
	go func() {
		defer close(gaugesDone)
		c.refreshGauges(gctx)
	}()
	defer func() {
		stopGauges()
		<-gaugesDone
	}()
	if c.cfg.Partitions > 0 {
		handle, err := c.chain()
		if err != nil {
			return err
		}
		return c.runPartitioned(ctx, handle, bound)
	}
	sub, err := c.newSub(bound)
	if err != nil {
		return fmt.Errorf("consumer: subscribe %s: %w", c.cfg.Group, err)
	}
	defer sub.Close()

	wlog := watermill.NewSlogLogger(c.cfg.Logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: c.cfg.CloseTimeout}, wlog)
	if err != nil {
		return fmt.Errorf("consumer: router: %w", err)
	}
	poison, err := c.poison()
	if err != nil {
		return err
	}
	router.AddMiddleware(poison, c.retry, middleware.Recoverer, c.inbox.Middleware)
	for i := range c.cfg.Subscriptions { // competing subscriptions to the group's queue
		name := c.cfg.Group
		if i > 0 {
			name = fmt.Sprintf("%s#%d", c.cfg.Group, i+1)
		}
		router.AddConsumerHandler(name, c.cfg.Group, sub, c.dispatch)
	}

	go func() {
		select {
		case <-router.Running():
			c.markRunning()
		case <-ctx.Done():
		}
	}()
	if err := router.Run(ctx); err != nil {
		return fmt.Errorf("consumer: consumer %s: %w", c.cfg.Group, err)
	}
	return nil
}
