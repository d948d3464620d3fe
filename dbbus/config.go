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
	// both databases) usually come first. Defaults to 200 ms.
	PollInterval time.Duration
	// BatchSize is how many deliveries one claim leases at most; the
	// subscription hands them out one at a time, in order. Defaults to 16.
	BatchSize int
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

const (
	defaultVisibilityTimeout = 30 * time.Second
	defaultPollInterval      = 200 * time.Millisecond
	defaultBatchSize         = 16
	maxBatchSize             = 1000
)

// withDefaults validates c and returns a copy with defaults filled in.
func (c *Config) withDefaults() (Config, error) {
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
	}
	if out.BatchSize == 0 {
		out.BatchSize = defaultBatchSize
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, nil
}
