package uow

import (
	"context"
	"sync"

	"gorm.io/gorm"
)

type txKey struct{}

// txScope is a transaction carried by contexts, and the callbacks that units
// of work joined to it registered to run once it commits.
type txScope struct {
	tx    *gorm.DB
	mu    sync.Mutex
	after []func()
}

// add registers fn to run at commit.
func (s *txScope) add(fn func()) {
	s.mu.Lock()
	s.after = append(s.after, fn)
	s.mu.Unlock()
}

// run runs and forgets the registered callbacks, in registration order.
func (s *txScope) run() {
	s.mu.Lock()
	fns := s.after
	s.after = nil
	s.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

func withScope(ctx context.Context, s *txScope) context.Context {
	return context.WithValue(ctx, txKey{}, s)
}

func scopeFrom(ctx context.Context) *txScope {
	s, _ := ctx.Value(txKey{}).(*txScope)
	if s == nil || s.tx == nil {
		return nil
	}
	return s
}

// ContextWithTx returns a copy of ctx that carries tx. Units of work begun
// under the returned context join tx instead of starting their own
// transaction.
//
// The code that owns tx (begins and commits it, like the inbox middleware
// or the idempotency ledger) calls [Committed] with the returned context
// once tx has committed, so that the AfterCommit hooks of the units that
// joined it run.
func ContextWithTx(ctx context.Context, tx *gorm.DB) context.Context {
	return withScope(ctx, &txScope{tx: tx})
}

// TxFromContext returns the transaction carried by ctx, if any.
func TxFromContext(ctx context.Context) (*gorm.DB, bool) {
	if s := scopeFrom(ctx); s != nil {
		return s.tx, true
	}
	return nil, false
}

// Committed runs the Config.AfterCommit hooks of the units of work that
// joined the transaction carried by ctx (see ContextWithTx) and committed
// their part, each once, in the order they committed. The owner of the
// transaction calls it after the transaction commits; a transaction rolled
// back is simply never reported, and its hooks never run. Calling it again,
// or with a ctx that carries no transaction, does nothing.
func Committed(ctx context.Context) {
	if s := scopeFrom(ctx); s != nil {
		s.run()
	}
}

// DB returns the transaction carried by ctx, or db when there is none, bound
// to ctx. Repositories call it so that their queries run inside the unit of
// work when there is one:
//
//	func (r *Repo) Find(ctx context.Context, id string) (*Row, error) {
//		var row Row
//		err := uow.DB(ctx, r.db).Take(&row, "id = ?", id).Error
//		...
//	}
func DB(ctx context.Context, db *gorm.DB) *gorm.DB {
	if tx, ok := TxFromContext(ctx); ok {
		return tx.WithContext(ctx)
	}
	return db.WithContext(ctx)
}
