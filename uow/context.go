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
// transaction. Their AfterCommit hooks never run, since bento does not see
// the commit (as with Manager.RunTx): to have them run, take the
// transaction with [Own] and use [Owned.Join] instead.
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
