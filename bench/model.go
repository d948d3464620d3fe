package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

// topic is the one event type every scenario writes; queues bind to it.
const topic = "account.deposited"

// Account is the aggregate the benchmarks change, as in uow/bench_test.go.
type Account struct {
	aggregate.Base
	Owner   string
	Balance int64
}

// AggregateType implements aggregate.Root.
func (*Account) AggregateType() string { return "account" }

// Deposited is the event. Its JSON is about 300 bytes, a typical domain
// event with a free-text field.
type Deposited struct {
	AccountID string `json:"account_id"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
	Reference string `json:"reference"`
	Memo      string `json:"memo"`
}

// EventType implements aggregate.Event.
func (Deposited) EventType() string { return topic }

// memo pads the payload to about 300 bytes.
var memo = strings.Repeat("monthly transfer from savings, see statement ", 5)[:200]

// Deposit changes the balance, recording Deposited with a fresh reference.
func (a *Account) Deposit(amount int64) error {
	return a.DepositRef(amount, aggregate.NewID())
}

// DepositRef changes the balance, recording Deposited with reference ref
// (the steady scenario numbers its events through it).
func (a *Account) DepositRef(amount int64, ref string) error {
	if amount <= 0 {
		return errors.New("deposit must be positive")
	}
	a.Balance += amount
	a.Record(a.deposited(amount, ref))
	return nil
}

func (a *Account) deposited(amount int64, ref string) Deposited {
	return Deposited{AccountID: a.ID, Amount: amount, Currency: "EUR", Reference: ref, Memo: memo}
}

// migrate creates the outbox and accounts tables in db.
func migrate(ctx context.Context, db *gorm.DB) error {
	if err := outbox.Migrate(ctx, db); err != nil {
		return err
	}
	return db.WithContext(ctx).AutoMigrate(&Account{})
}

// seed commits n events with units of work: n/10 new accounts (prefix
// names them), ten deposits each, 50 accounts per unit (500 events), the
// deposits of a unit's accounts interleaved as concurrent traffic would
// interleave them. Two goroutines commit units at once.
func seed(ctx context.Context, units *uow.Manager, prefix string, n int) error {
	const perAccount, accountsPerUnit = 10, 50
	accounts := (n + perAccount - 1) / perAccount
	left := n
	type job struct{ first, count, events int }
	jobs := make(chan job)
	go func() {
		defer close(jobs)
		for first := 0; first < accounts; first += accountsPerUnit {
			count := min(accountsPerUnit, accounts-first)
			events := min(left, count*perAccount)
			left -= events
			jobs <- job{first, count, events}
		}
	}()
	return runWorkers(2, jobs, func(j job) error {
		return units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			batch := make([]*Account, j.count)
			for i := range batch {
				a := &Account{Owner: "ann"}
				a.ID = fmt.Sprintf("%s-%07d", prefix, j.first+i)
				batch[i] = a
			}
			for e := 0; e < j.events; e++ {
				if err := batch[e%j.count].Deposit(int64(e + 1)); err != nil {
					return err
				}
			}
			for _, a := range batch {
				if err := u.Add(a); err != nil {
					return err
				}
			}
			return nil
		})
	})
}
