// Package purge deletes old rows in short batches: the one loop behind the
// retention purges of the outbox, the inbox and the idempotency ledger.
package purge

import (
	"context"

	"gorm.io/gorm"
)

// DefaultBatchSize is how many rows one DELETE removes when the caller
// gives no batch size.
const DefaultBatchSize = 1000

// Batches runs query, a DELETE of at most @limit rows, with args and
// "limit" bound to batchSize (0 or less means [DefaultBatchSize]), again
// and again until one statement deletes fewer rows than the limit. Each
// statement is its own short transaction, so a purge never holds locks for
// long. It returns how many rows it deleted in all.
//
// It checks ctx before each statement and returns ctx's error, unwrapped,
// when it is done. A database error is returned through wrap, so each
// caller names its operation and its sentinels. Either way the count is
// what was deleted before the error.
func Batches(ctx context.Context, db *gorm.DB, query string, args map[string]any, batchSize int, wrap func(error) error) (int64, error) {
	if batchSize <= 0 {
		batchSize = DefaultBatchSize
	}
	args["limit"] = batchSize
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		res := db.WithContext(ctx).Exec(query, args)
		if res.Error != nil {
			return total, wrap(res.Error)
		}
		total += res.RowsAffected
		if res.RowsAffected < int64(batchSize) {
			return total, nil
		}
	}
}
