package dialect

import "gorm.io/gorm"

// AsyncCommit is the PostgreSQL expression that makes the current
// transaction commit without waiting for its WAL record to reach the disk
// (synchronous_commit off for this transaction alone). Statements that
// must not cost a round trip of their own embed it; see CommitAsync for
// when it may be used.
const AsyncCommit = `set_config('synchronous_commit', 'off', true)`

// AsyncCommitSQL is AsyncCommit as a statement of its own.
const AsyncCommitSQL = `SELECT ` + AsyncCommit

// CommitAsync makes tx, a transaction on PostgreSQL, commit asynchronously;
// on SQLite it does nothing. It is for bento's own bookkeeping whose loss
// in a crash of the database server only repeats work: a projector's
// claim, its record of what it published, its hop onto a database bus. No
// commit that anything else depends on may use it, and none needs to: a
// later synchronous commit flushes the WAL up to its own record, so any
// transaction that read the asynchronous one's rows and committed is
// durable only with it.
func CommitAsync(tx *gorm.DB) error {
	if d, err := Of(tx); err != nil || d != Postgres {
		return err
	}
	return tx.Exec(AsyncCommitSQL).Error
}
