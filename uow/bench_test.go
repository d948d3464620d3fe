package uow_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

// BenchmarkCommit compares, on each backend and in one run, a unit of work
// that saves one aggregate and writes one event ("uow") with the same GORM
// update of the same row in its own transaction without any event ("gorm").
// The "parallel" variants run 8 goroutines, each on its own aggregate.
//
//	go test -run '^$' -bench BenchmarkCommit ./uow/
func BenchmarkCommit(b *testing.B) {
	for _, backend := range testenv.Backends() {
		b.Run(backend.Name, func(b *testing.B) {
			db := backend.Open(b)
			ctx := context.Background()
			if err := outbox.Migrate(ctx, db); err != nil {
				b.Fatal(err)
			}
			if err := db.AutoMigrate(&Account{}); err != nil {
				b.Fatal(err)
			}
			units, err := uow.New(db, nil)
			if err != nil {
				b.Fatal(err)
			}
			var seq atomic.Int64
			newAccount := func() *Account {
				a := OpenAccount(fmt.Sprintf("bench-%d", seq.Add(1)), "ann")
				if err := units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Track(a) }); err != nil {
					b.Fatal(err)
				}
				return a
			}
			gormSave := func(a *Account) error {
				a.Balance++
				next := a.Version + 1
				return db.Transaction(func(tx *gorm.DB) error {
					a.Version = next
					res := tx.Model(a).Where("version = ?", next-1).Select("*").Updates(a)
					if res.Error == nil && res.RowsAffected != 1 {
						return uow.ErrConcurrencyConflict
					}
					return res.Error
				})
			}
			uowCommit := func(a *Account) error {
				u, err := units.Begin(ctx, nil)
				if err != nil {
					return err
				}
				if err := u.Track(a); err != nil {
					return err
				}
				if err := a.Deposit(1); err != nil {
					return err
				}
				return u.Commit(ctx)
			}
			for _, v := range []struct {
				name string
				fn   func(*Account) error
			}{{"gorm", gormSave}, {"uow", uowCommit}} {
				b.Run(v.name+"/serial", func(b *testing.B) {
					a := newAccount()
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						if err := v.fn(a); err != nil {
							b.Fatal(err)
						}
					}
				})
				b.Run(v.name+"/parallel", func(b *testing.B) {
					b.SetParallelism(4) // 8 goroutines on 2 cores
					b.RunParallel(func(pb *testing.PB) {
						a := newAccount()
						for pb.Next() {
							if err := v.fn(a); err != nil {
								b.Error(err)
								return
							}
						}
					})
				})
			}
		})
	}
}
