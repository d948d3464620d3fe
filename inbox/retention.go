package inbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/purge"
)

// PurgeOpts narrow Purge. A nil *PurgeOpts means every consumer, batches of
// 1,000 and the system clock.
type PurgeOpts struct {
	// Consumer restricts the purge to one consumer's records.
	Consumer string
	// BatchSize is how many records one DELETE removes; each batch is its
	// own short statement. CountPurgeable ignores it. Defaults to 1,000.
	BatchSize int
	// Clock is the clock the age is measured from. Defaults to
	// aggregate.SystemClock.
	Clock aggregate.Clock
}

// Purge deletes inbox records received more than olderThan ago and returns
// how many it deleted. It also deletes the crash counts of redelivered
// messages (inbox_attempts) last touched as long ago, which a message never
// applied nor dead-lettered (its group deleted, say) would leave behind;
// those are not counted.
//
// The retention window is the dedup window: a message whose record was
// purged is applied again if it is delivered again. Keep olderThan longer
// than any message can be redelivered after it was first applied — broker
// redelivery, a projector retrying an event it could not mark sent, an
// operator replaying a dead letter or requeueing an outbox event — with a
// wide margin (days, not minutes). Do not purge right after a long outage:
// deliveries held back by it are exactly the late duplicates the window is
// for.
//
// It stops early, returning what it deleted so far, when ctx is done.
//
// Errors: [ErrInvalidArgument] for a negative olderThan, the context's
// error, [ErrClosed], or the database error.
func Purge(ctx context.Context, db *gorm.DB, olderThan time.Duration, opts *PurgeOpts) (int64, error) {
	where, args, opts, err := purgeable("purge", olderThan, opts)
	if err != nil {
		return 0, err
	}
	wrap := func(err error) error { return wrapDB("purge", err) }
	query := `DELETE FROM inbox_messages WHERE (consumer, message_id) IN (
  SELECT consumer, message_id FROM inbox_messages WHERE ` + where + ` ORDER BY received_at LIMIT @limit)`
	n, err := purge.Batches(ctx, db, query, args, opts.BatchSize, wrap)
	if err != nil {
		return n, err
	}
	attempts := `DELETE FROM inbox_attempts WHERE (consumer, message_id) IN (
  SELECT consumer, message_id FROM inbox_attempts WHERE ` + strings.Replace(where, "received_at", "updated_at", 1) + ` LIMIT @limit)`
	if _, err := purge.Batches(ctx, db, attempts, args, opts.BatchSize, wrap); err != nil {
		return n, err
	}
	return n, nil
}

// purgeable returns the condition (and its arguments) that selects the
// records Purge deletes and CountPurgeable counts, and opts with nil made
// zero, or an error naming op for a negative age.
func purgeable(op string, olderThan time.Duration, opts *PurgeOpts) (string, map[string]any, *PurgeOpts, error) {
	if olderThan < 0 {
		return "", nil, nil, fmt.Errorf("inbox: %s: %w: negative age %v", op, ErrInvalidArgument, olderThan)
	}
	if opts == nil {
		opts = &PurgeOpts{}
	}
	var clock aggregate.Clock = aggregate.SystemClock{}
	if opts.Clock != nil {
		clock = opts.Clock
	}
	where := `received_at < @before`
	if opts.Consumer != "" {
		where += ` AND consumer = @consumer`
	}
	return where, map[string]any{"before": clock.Now().UTC().Add(-olderThan), "consumer": opts.Consumer}, opts, nil
}

// CountPurgeable counts the records that Purge with the same arguments
// would delete now (BatchSize is ignored): a dry run.
//
// Errors: [ErrInvalidArgument] for a negative olderThan, [ErrClosed], or
// the database error.
func CountPurgeable(ctx context.Context, db *gorm.DB, olderThan time.Duration, opts *PurgeOpts) (int64, error) {
	where, args, _, err := purgeable("count purgeable", olderThan, opts)
	if err != nil {
		return 0, err
	}
	var n int64
	if err := db.WithContext(ctx).Raw(`SELECT count(*) FROM inbox_messages WHERE `+where, args).Scan(&n).Error; err != nil {
		return 0, wrapDB("count purgeable", err)
	}
	return n, nil
}
