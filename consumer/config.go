package consumer

import (
	"database/sql"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/conf"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

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
	// keeps being retried with backoff, without counting toward
	// MaxRetries, holding its place so that nothing behind it on its
	// subscription overtakes it. Transient failures are those of the
	// group's own database (unreachable or restarting, a lost connection,
	// a serialization failure or deadlock, a lock or statement timeout, a
	// busy SQLite) and those the handler marks with Transient. A handler's
	// own network errors and deadlines are ordinary failures: a failure
	// that could come from anywhere (a refused connection, a deadline) is
	// an outage only when the group's database does not answer a probe
	// query either. Past the window such failures count toward MaxRetries.
	// A negative value means none. Defaults to DefaultOutageWindow (1h).
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
	// needs the consistent-hash exchange plugin (see Declare). A negative
	// value means no partitions:
	// one queue, "<group>", with Subscriptions competing subscriptions and
	// no order. Defaults to DefaultPartitions (16).
	Partitions int
	// QueueType is the RabbitMQ type of the partition queues:
	// rabbitmq.Quorum or rabbitmq.Classic. Defaults to rabbitmq.Quorum.
	QueueType rabbitmq.QueueType
	// DeliveryLimit is, for quorum partition queues, how many times a
	// message is delivered again before RabbitMQ (or the database bus)
	// dead-letters it. The
	// broker counts every give-back (a crash, a partition move, a lost
	// link, a shutdown) against every message a subscription held, so it
	// is only a far-off backstop: the consumer dead-letters a message
	// itself at its last delivery below the limit, with the cause
	// CausePoison, holding its aggregate back, so the broker never
	// dead-letters one without a hold. Poison is caught well before by
	// MaxCrashes. On the database bus (NewDatabase) it applies to every
	// group, and is the bus's own dbbus.Config.DeliveryLimit, or below it.
	// Defaults to DefaultDeliveryLimit (500); on the database bus to the
	// bus's limit.
	DeliveryLimit int
	// MaxCrashes is how many attempts at a message may die with their
	// process (a crash, a SIGKILL, an out-of-memory kill) before the
	// message is dead-lettered as poison, with the cause CausePoison and
	// its aggregate held back. Only attempts that started and never
	// returned count, in the inbox_attempts table: messages a dead process
	// merely held, and give-backs (moves, lost links, shutdowns), never do.
	// To keep it cheap, attempts are written down only for messages
	// delivered again; a message whose attempts died before runs alone
	// among such messages in its process, so a crash is blamed on it and
	// not on its neighbours. A negative value turns the count off, leaving
	// DeliveryLimit. Defaults to DefaultMaxCrashes (3).
	MaxCrashes int
	// TakeoverTime bounds how long the partitions of an instance that died
	// or froze stay without a consumer: each instance renews its
	// membership every quarter of it, each renewal bounded by a quarter of
	// it, and is forgotten three quarters after its last renewal. An
	// instance that cannot reach the database for that long releases its
	// partitions, abandoning the messages in hand. It also sets, with
	// Partitions:
	//   - on PostgreSQL, the lock_timeout and
	//     idle_in_transaction_session_timeout of every transaction the
	//     consumer applies messages in: half of it (5s by default), so
	//     that a stopped instance's transactions, and their locks on the
	//     inbox records of its messages, end before its peers take its
	//     partitions over. A handler that pauses longer than that between
	//     two statements of its transaction (a slow call made inside it)
	//     has its transaction ended by the server and fails; raise
	//     TakeoverTime for such handlers;
	//   - on PostgreSQL, the fence: each transaction commits only if this instance's
	//     membership is still live on the database's clock and is the one
	//     its partition was assigned under, else it is rolled back with
	//     ErrFenced and its messages are given back;
	//   - on RabbitMQ, the AMQP heartbeat of the partition subscriptions:
	//     at most half of it but not below 5s (shorter heartbeats are
	//     missed by loaded hosts, dropping healthy links) unless
	//     rabbitmq.Config.Heartbeat is lower, so that the broker drops a
	//     frozen instance's link, and hands its partitions on, within
	//     about TakeoverTime (10s by default).
	// Defaults to DefaultTakeoverTime (10s).
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
// out: 16 partitions with hold-back, 5 retries with backoff from 100ms to
// 10s, a 30s close timeout and a new registry. New, NewMemory and NewAMQP
// fill the same defaults into a Config's zero fields. The fields whose
// default depends on Partitions stay zero (BatchSize: DefaultBatchSize with
// partitions, 1 without; Subscriptions: 1 without partitions;
// PartitionConcurrency: all owned partitions), so that it is a valid base
// for each variant: set Partitions to -1 for an unpartitioned group,
// QueueType to rabbitmq.Classic for classic queues, and so on.
func DefaultConfig(group string) *Config {
	c, _ := (&Config{Group: group}).withDefaults()
	c.BatchSize = 0 // depends on Partitions, as Subscriptions does
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
	if putBack == "delivery-limit" && out.DeliveryLimit == 0 && out.MaxCrashes == 0 {
		out.DeliveryLimit, out.MaxCrashes = 20, -1 // poison counted by the broker's give-backs alone, as before the crash ledger
	}
	conf.Default(&p, "DeliveryLimit", &out.DeliveryLimit, DefaultDeliveryLimit)
	conf.OrDefault(&out.MaxCrashes, DefaultMaxCrashes)
	conf.Default(&p, "TakeoverTime", &out.TakeoverTime, DefaultTakeoverTime)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, p.Err(ErrInvalidConfig)
}
