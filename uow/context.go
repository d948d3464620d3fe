package uow

import (
	"context"

	"gorm.io/gorm"
)

type txKey struct{}

// ContextWithTx returns a copy of ctx that carries tx. Units of work begun
// under the returned context join tx instead of starting their own
// transaction.
func ContextWithTx(ctx context.Context, tx *gorm.DB) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFromContext returns the transaction carried by ctx, if any.
func TxFromContext(ctx context.Context) (*gorm.DB, bool) {
	tx, ok := ctx.Value(txKey{}).(*gorm.DB)
	return tx, ok && tx != nil
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
