package dbbus

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Config configures a [Bus]. The zero value, or a nil *Config, means every
// default.
type Config struct {
	// VisibilityTimeout is how long a claimed delivery stays leased to its
	// subscriber without a renewal, and a partition queue owned by its
	// subscription: a live subscription renews both three times per
	// timeout, however slow its handler; those of a subscription whose
	// process died (or lost the database) lapse, the deliveries becoming
	// ready again for another consumer, counted as a failed attempt, and
	// the partition open to another subscription. Defaults to 30 s.
	VisibilityTimeout time.Duration
	// PollInterval is how often an idle subscription looks for deliveries
	// without being woken, and how often it makes expired leases ready
	// again. Wake-ups (LISTEN/NOTIFY on PostgreSQL, an in-process signal on
	// both databases) usually come first. Defaults to 5 s on PostgreSQL,
	// where the bus listens for other processes' publishes, and to 200 ms
	// on SQLite or with NoListen, where polling is how they are found.
	// A partition queue's owner ([Bus.PartitionSubscriber]) on a bus that
	// listens does not poll once it owns its queue: a publish to the queue
	// wakes it, wherever it comes from, and each renewal of its ownership
	// (three per VisibilityTimeout) looks for deliveries too. A
	// subscription waiting to own a queue polls, to find an owner that
	// lapsed.
	PollInterval time.Duration
	// BatchSize is how many deliveries one claim leases at most; the
	// subscription hands them out one at a time, in order. Defaults to 16.
	BatchSize int
	// DeliveryLimit is how many times a delivery may come back to its
	// queue (attempts that failed: a nack, a lease that lapsed, a
	// partition queue taken over from a subscription that died) before
	// the bus dead-letters it: a delivery claimed with more failed
	// attempts than DeliveryLimit is not handed out but moved, in one
	// transaction, to the dead letters of its group, published on
	// messaging's dead-letter topic of the group ("bento-dead.<group>",
	// consumer.DeadLetterTopic; a partition queue's group is the
	// partitioned group) and so to the group consumer.DeadLetterQueue(group)
	// bound to it, or kept in [UnroutableGroup] when none is, with the
	// metadata dead_cause "poison", reason_poisoned saying why, dead_at
	// and dead_attempts (see [Bus.DeliveryLimit]). Give-backs (Close, a
	// cancelled subscription) count no attempt. It is a backstop like a
	// RabbitMQ quorum queue's delivery limit: the consumer runtime
	// dead-letters a message itself first, at its last delivery below the
	// limit, holding its aggregate back, which a dead letter of the bus
	// does not. A negative value means no limit. Defaults to
	// DefaultDeliveryLimit (500).
	DeliveryLimit int
	// NoListen turns LISTEN/NOTIFY off on PostgreSQL, for connections
	// through a pooler in transaction mode (such as PgBouncer): subscribers
	// then poll. Publishers still notify, which costs nothing when nobody
	// listens. Defaults to false.
	NoListen bool
	// Logger receives the bus's warnings (a failed claim, an ack whose
	// lease was lost). Defaults to slog.Default().
	Logger *slog.Logger
}

// ErrInvalidConfig is returned by [New] for a Config field out of range.
var ErrInvalidConfig = errors.New("dbbus: invalid config")

// DefaultDeliveryLimit is Config.DeliveryLimit's default, RabbitMQ's
// quorum partition queues' too.
const DefaultDeliveryLimit = 500

const (
	defaultVisibilityTimeout = 30 * time.Second
	defaultPollInterval      = 200 * time.Millisecond
	// defaultListenPollInterval is PollInterval's default for a bus that
	// listens: an idle subscription's polls are most of its CPU, and
	// NOTIFY, sent by every publish in any process, wakes it first.
	defaultListenPollInterval = 5 * time.Second
	defaultBatchSize          = 16
	maxBatchSize              = 1000
)

// withDefaults validates c and returns a copy with defaults filled in, for
// a bus that listens for notifications (listens) or not.
func (c *Config) withDefaults(listens bool) (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	var errs []error
	if out.VisibilityTimeout < 0 || (out.VisibilityTimeout > 0 && out.VisibilityTimeout < time.Millisecond) {
		errs = append(errs, fmt.Errorf("%w: VisibilityTimeout %v (want at least 1ms)", ErrInvalidConfig, out.VisibilityTimeout))
	}
	if out.PollInterval < 0 {
		errs = append(errs, fmt.Errorf("%w: PollInterval %v is negative", ErrInvalidConfig, out.PollInterval))
	}
	if out.BatchSize < 0 || out.BatchSize > maxBatchSize {
		errs = append(errs, fmt.Errorf("%w: BatchSize %d (want 1 to %d)", ErrInvalidConfig, out.BatchSize, maxBatchSize))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	if out.VisibilityTimeout == 0 {
		out.VisibilityTimeout = defaultVisibilityTimeout
	}
	if out.PollInterval == 0 {
		out.PollInterval = defaultPollInterval
		if listens && !out.NoListen {
			out.PollInterval = defaultListenPollInterval
		}
	}
	if out.BatchSize == 0 {
		out.BatchSize = defaultBatchSize
	}
	if out.DeliveryLimit == 0 {
		out.DeliveryLimit = DefaultDeliveryLimit
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, nil
}
