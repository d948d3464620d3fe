package consumer

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/wire"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
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
	// ErrFenced is the failure of a transaction that a partitioned
	// consumer refused to commit because this instance's membership of its
	// group had ended (expired on the database's clock, or lapsed and begun
	// again since the transaction's partition was assigned): its partitions
	// may be another instance's by now. The messages are given back to
	// their queue, not applied, and count as no attempt.
	ErrFenced = errors.New("consumer: fenced: this instance's membership of the group ended")
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
const MetaDeadCause = wire.DeadCause

// Metadata keys of dead letters and replays.
const (
	// MetaDeadAt is when the consumer gave the message up (RFC 3339, UTC).
	MetaDeadAt = wire.DeadAt
	// MetaDeadAttempts is how many attempts failed before it did.
	MetaDeadAttempts = wire.DeadAttempts
	// MetaReplays counts the times a dead letter was replayed.
	MetaReplays = messaging.MetaReplays
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
	// CauseStale: a replayed dead letter arrived after later versions of
	// its aggregate were applied (they were released past it), so the
	// version watermark would have skipped it although the group never
	// applied it (inbox.ErrStale). It holds nothing back: the aggregate
	// has moved on already.
	CauseStale = "stale"
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
	// DefaultMaxCrashes is how many attempts at a message may die with
	// their process before it is dead-lettered as poison.
	DefaultMaxCrashes = 3
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
// version, a stale replay (inbox.ErrStale), or an error wrapped with
// Permanent.
func IsPermanent(err error) bool {
	return errors.Is(err, ErrPermanent) || errors.Is(err, inbox.ErrNoMessageID) || errors.Is(err, inbox.ErrBadVersion) ||
		errors.Is(err, inbox.ErrStale) ||
		isDecode(err)
}
