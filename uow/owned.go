package uow

import (
	"context"
	"sync"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/txn"
)

// Owned is a transaction whose owner lets units of work join it and runs
// their after-commit hooks when it commits: what the inbox and the
// idempotency ledger do for the handlers they call. Take a begun
// transaction with Own, give the handlers contexts from Join, then Commit
// or Rollback.
type Owned struct {
	tx     *gorm.DB
	mu     sync.Mutex
	scopes []*txScope
	done   bool
}

// Own takes ownership of tx, a transaction the caller began.
func Own(tx *gorm.DB) *Owned { return &Owned{tx: tx} }

// Tx returns the transaction.
func (o *Owned) Tx() *gorm.DB { return o.tx }

// Join returns a copy of ctx that carries the transaction: units of work
// begun under it join the transaction (Manager.Run), and their AfterCommit
// hooks run when Commit succeeds, in the order they committed, contexts
// in the order they were joined.
func (o *Owned) Join(ctx context.Context) context.Context {
	s := &txScope{tx: o.tx}
	o.mu.Lock()
	o.scopes = append(o.scopes, s)
	o.mu.Unlock()
	return withScope(ctx, s)
}

// Commit commits the transaction (on SQLite a failed COMMIT rolls it back)
// and then runs the after-commit hooks of the units that joined it. A
// failed commit runs none.
func (o *Owned) Commit() error {
	o.mu.Lock()
	if o.done {
		o.mu.Unlock()
		return nil
	}
	o.done = true
	scopes := o.scopes
	o.mu.Unlock()
	if err := txn.Commit(o.tx); err != nil {
		return err
	}
	for _, s := range scopes {
		s.run()
	}
	return nil
}

// Rollback rolls the transaction back; the joined units' hooks never run.
// It does nothing once the transaction has ended.
func (o *Owned) Rollback() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return
	}
	o.done = true
	o.tx.Rollback()
}
