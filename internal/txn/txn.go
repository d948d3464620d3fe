// Package txn commits GORM transactions the same way on every database.
package txn

import (
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
)

// Commit commits tx.
//
// On SQLite a COMMIT that fails (a deferred foreign key, for example) leaves
// the transaction open, and database/sql would return the connection to the
// pool still inside it: the next BEGIN on it fails and its uncommitted writes
// linger. So on SQLite, Commit sends COMMIT as a statement of the
// transaction; if it fails, it rolls the transaction back and returns the
// error, and if it succeeds it ends the database/sql transaction (whose own
// COMMIT then finds nothing to commit, which is expected). Other databases
// end a transaction whose COMMIT failed themselves.
func Commit(tx *gorm.DB) error {
	if d, _ := dialect.Of(tx); d != dialect.SQLite {
		return tx.Commit().Error
	}
	if err := tx.Exec("COMMIT").Error; err != nil {
		tx.Rollback()
		return err
	}
	_ = tx.Commit() // "cannot commit - no transaction is active": already committed
	return nil
}
