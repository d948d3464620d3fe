package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/uow"
)

// commitMode is one writer of the commit scenario.
type commitMode struct {
	Key   string
	Label string
	fn    func(ctx context.Context, db *gorm.DB, units *uow.Manager, a *Account) error
}

// commitModes mirror uow/bench_test.go: the same UPDATE of one account row
// in its own transaction, without ("gorm") and with one event ("uow").
var commitModes = []commitMode{
	{"gorm", "GORM update, no event", gormSave},
	{"uow", "unit of work + 1 event", uowCommit},
}

// commitGoroutines are the concurrency levels measured.
var commitGoroutines = []int{1, 8}

func gormSave(ctx context.Context, db *gorm.DB, _ *uow.Manager, a *Account) error {
	a.Balance++
	next := a.Version + 1
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		a.Version = next
		res := tx.Model(a).Where("version = ?", next-1).Select("*").Updates(a)
		if res.Error == nil && res.RowsAffected != 1 {
			return uow.ErrConcurrencyConflict
		}
		return res.Error
	})
}

func uowCommit(ctx context.Context, _ *gorm.DB, units *uow.Manager, a *Account) error {
	u, err := units.Begin(ctx, nil)
	if err != nil {
		return err
	}
	if err := u.Track(a); err != nil {
		_ = u.Rollback()
		return err
	}
	if err := a.Deposit(1); err != nil {
		_ = u.Rollback()
		return err
	}
	return u.Commit(ctx)
}

// commitResult is one mode at one concurrency in one run.
type commitResult struct {
	Mode       string  `json:"mode"`
	Goroutines int     `json:"goroutines"`
	Commits    int64   `json:"commits"`
	Seconds    float64 `json:"seconds"`
	Rate       float64 `json:"commits_per_second"`
}

// runCommit measures every mode at every concurrency for d each, in a fresh
// schema; each goroutine changes its own account.
func runCommit(ctx context.Context, e *env, d time.Duration) ([]commitResult, error) {
	s, err := e.newSchema(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := s.drop(); err != nil {
			e.log.Warn("cleanup", "err", err)
		}
	}()
	db, err := s.gorm(16)
	if err != nil {
		return nil, err
	}
	defer closeGorm(db)
	if err := migrate(ctx, db); err != nil {
		return nil, err
	}
	units, err := uow.New(db, nil)
	if err != nil {
		return nil, err
	}
	var seq atomic.Int64
	newAccount := func() (*Account, error) {
		a := &Account{Owner: "ann"}
		a.ID = fmt.Sprintf("commit-%d", seq.Add(1))
		err := units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(a) })
		return a, err
	}
	var out []commitResult
	for _, g := range commitGoroutines {
		for _, m := range commitModes {
			accounts := make([]*Account, g)
			for i := range accounts {
				if accounts[i], err = newAccount(); err != nil {
					return nil, err
				}
			}
			if err := db.WithContext(ctx).Exec("CHECKPOINT").Error; err != nil {
				return nil, err
			}
			var (
				total atomic.Int64
				wg    sync.WaitGroup
				mu    sync.Mutex
				errs  []error
			)
			start := time.Now()
			deadline := start.Add(d)
			for _, a := range accounts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(deadline) {
						if err := m.fn(ctx, db, units, a); err != nil {
							mu.Lock()
							errs = append(errs, err)
							mu.Unlock()
							return
						}
						total.Add(1)
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			if err := errors.Join(errs...); err != nil {
				return nil, fmt.Errorf("commit %s x%d: %w", m.Key, g, err)
			}
			out = append(out, commitResult{
				Mode: m.Key, Goroutines: g, Commits: total.Load(), Seconds: elapsed.Seconds(),
				Rate: float64(total.Load()) / elapsed.Seconds(),
			})
		}
	}
	return out, nil
}
