package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/bentoevents/bento/internal/purge"
)

// PurgeOpts narrow PurgeSent and CountSent. A nil *PurgeOpts means all
// tenants and batches of 1,000.
type PurgeOpts struct {
	// Tenant restricts the purge to one tenant.
	Tenant string
	// BatchSize is how many rows one DELETE removes; each batch is its own
	// short statement, so a purge never holds locks the relay needs for
	// long. CountSent ignores it. Defaults to 1,000.
	BatchSize int
}

// PurgeSent deletes sent rows published more than olderThan ago (by the
// Store's clock), batch by batch, and the scheduled messages released
// (moved into the outbox) more than olderThan ago, and returns how many it
// deleted in all. It stops
// early, returning what it deleted so far, when ctx is done.
//
// Errors: [ErrInvalidArgument] for a negative olderThan, the context's
// error, [ErrClosed], or the database error.
func (s *Store) PurgeSent(ctx context.Context, olderThan time.Duration, opts *PurgeOpts) (int64, error) {
	o, args, err := s.sentArgs("purge sent", olderThan, opts)
	if err != nil {
		return 0, err
	}
	wrap := func(err error) error { return wrapDB("outbox: purge sent", err) }
	n, err := purge.Batches(ctx, s.db, purgeSentSQL(o.Tenant != ""), args, o.BatchSize, wrap)
	if err != nil {
		return n, err
	}
	released, err := purge.Batches(ctx, s.db, purgeReleasedSQL(o.Tenant != ""), args, o.BatchSize, wrap)
	return n + released, err
}

// CountSent counts the sent rows published more than olderThan ago: what
// PurgeSent with the same arguments would delete (a dry run).
//
// Errors: [ErrInvalidArgument] for a negative olderThan, [ErrClosed], or
// the database error.
func (s *Store) CountSent(ctx context.Context, olderThan time.Duration, opts *PurgeOpts) (int64, error) {
	o, args, err := s.sentArgs("count sent", olderThan, opts)
	if err != nil {
		return 0, err
	}
	var n, released int64
	if err := s.db.WithContext(ctx).Raw(countSentSQL(o.Tenant != ""), args).Scan(&n).Error; err != nil {
		return 0, wrapDB("outbox: count sent", err)
	}
	if err := s.db.WithContext(ctx).Raw(countReleasedSQL(o.Tenant != ""), args).Scan(&released).Error; err != nil {
		return 0, wrapDB("outbox: count sent", err)
	}
	return n + released, nil
}

// sentArgs checks olderThan and returns opts (none for nil) and the bind
// parameters of sentBefore: the rows PurgeSent deletes and CountSent
// counts. op names the call in the error.
func (s *Store) sentArgs(op string, olderThan time.Duration, opts *PurgeOpts) (PurgeOpts, map[string]any, error) {
	if olderThan < 0 {
		return PurgeOpts{}, nil, fmt.Errorf("outbox: %s: %w: negative age %v", op, ErrInvalidArgument, olderThan)
	}
	var o PurgeOpts
	if opts != nil {
		o = *opts
	}
	return o, map[string]any{"before": s.clock.in(-olderThan), "tenant": o.Tenant}, nil
}
