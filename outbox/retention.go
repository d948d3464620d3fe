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
// Store's clock), batch by batch, and returns how many it deleted. It stops
// early, returning what it deleted so far, when ctx is done.
//
// Errors: [ErrInvalidArgument] for a negative olderThan, the context's
// error, [ErrClosed], or the database error.
func (s *Store) PurgeSent(ctx context.Context, olderThan time.Duration, opts *PurgeOpts) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("outbox: purge sent: %w: negative age %v", ErrInvalidArgument, olderThan)
	}
	if opts == nil {
		opts = &PurgeOpts{}
	}
	query := purgeSentSQL
	if opts.Tenant != "" {
		query += " AND tenant_id = @tenant"
	}
	query += purgeSentTail
	args := map[string]any{"before": s.clock.in(-olderThan), "tenant": opts.Tenant}
	return purge.Batches(ctx, s.db, query, args, opts.BatchSize, func(err error) error {
		return wrapDB("outbox: purge sent", err)
	})
}

// CountSent counts the sent rows published more than olderThan ago: what
// PurgeSent with the same arguments would delete (a dry run).
//
// Errors: [ErrInvalidArgument] for a negative olderThan, [ErrClosed], or
// the database error.
func (s *Store) CountSent(ctx context.Context, olderThan time.Duration, opts *PurgeOpts) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("outbox: count sent: %w: negative age %v", ErrInvalidArgument, olderThan)
	}
	if opts == nil {
		opts = &PurgeOpts{}
	}
	q := s.db.WithContext(ctx).Model(&Message{}).
		Where("status = ? AND published_at < ?", StatusSent, s.clock.in(-olderThan))
	if opts.Tenant != "" {
		q = q.Where("tenant_id = ?", opts.Tenant)
	}
	var n int64
	if err := q.Count(&n).Error; err != nil {
		return 0, wrapDB("outbox: count sent", err)
	}
	return n, nil
}
