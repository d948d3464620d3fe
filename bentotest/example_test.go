package bentotest_test

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/bentotest"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/uow"
)

// In a real test, pass t (*testing.T); the examples use a Recorder.

func ExampleNew() {
	t := &bentotest.Recorder{}
	defer t.Close()
	env := bentotest.New(t, nil)
	env.Migrate(t, &Account{})

	a := &Account{}
	a.ID = "acc-1"
	a.Deposit(5)
	_ = env.Units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(a) })

	env.RequireCommitted(t, bentotest.Want{Topic: "account.deposited", AggregateID: "acc-1"})
	fmt.Println("failed:", t.Failed())
	// Output: failed: false
}

func ExampleRequireRecorded() {
	t := &bentotest.Recorder{}
	a := &Account{}
	a.ID = "acc-1"
	a.Deposit(5)
	bentotest.RequireRecorded(t, a, bentotest.Want{Topic: "account.deposited", Payload: Deposited{AccountID: "acc-1", Amount: 50}})
	fmt.Println(t.String())
	// Output:
	// bentotest: events recorded by account: event 1: payload {"account_id":"acc-1","amount":5}, want {"account_id":"acc-1","amount":50}
	// expected:
	//   1. account.deposited {"account_id":"acc-1","amount":50}
	// recorded:
	//   1. account.deposited account/acc-1 v1 {"account_id":"acc-1","amount":5}
}

func ExampleEnv_Drain() {
	t := &bentotest.Recorder{}
	defer t.Close()
	env := bentotest.New(t, nil)
	env.Migrate(t, &Account{}, &Ledger{})
	c := env.MustConsumer(t, "accounting")
	_ = consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e Deposited, m *messaging.Envelope) error {
		return tx.Create(&Ledger{EventID: m.ID, Kind: "deposit"}).Error
	})
	env.Start(t, c)

	a := &Account{}
	a.ID = "acc-1"
	a.Deposit(5)
	_ = env.Units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(a) })

	res := env.Drain(t) // relay, then wait until the consumer is done
	var n int64
	env.DB.Model(&Ledger{}).Count(&n)
	fmt.Println("published:", res.Published, "ledger rows:", n)
	// Output: published: 1 ledger rows: 1
}

func ExampleEnv_RequireAppliedOnce() {
	t := &bentotest.Recorder{}
	defer t.Close()
	env := bentotest.New(t, nil)
	env.Migrate(t, &Ledger{})
	c := env.MustConsumer(t, "accounting")
	_ = consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e Deposited, m *messaging.Envelope) error {
		return tx.Create(&Ledger{EventID: m.ID, Kind: "deposit"}).Error
	})
	env.Start(t, c)

	msg := env.Message(t, Deposited{AccountID: "acc-1", Amount: 5}, nil)
	env.RequireAppliedOnce(t, msg, func() int64 {
		var n int64
		env.DB.Model(&Ledger{}).Count(&n)
		return n
	})
	fmt.Println("failed:", t.Failed())
	// Output: failed: false
}

func ExampleClock() {
	c := bentotest.NewClock(bentotest.DefaultStart)
	fmt.Println(c.NewID(c.Now()))
	c.Advance(time.Second)
	fmt.Println(c.Now().Format(time.RFC3339), c.NewID(c.Now()))
	// Output:
	// 01KDVDNA000000000000000001
	// 2026-01-01T00:00:01Z 01KDVDNAZ80000000000000002
}

func ExampleRecorder() {
	r := &bentotest.Recorder{}
	r.Run(func(t bentotest.TB) {
		t.Fatalf("stop here")
	})
	fmt.Println(r.Failed(), r.Failures())
	// Output: true [stop here]
}

func ExampleEnv_RequirePublished() {
	t := &bentotest.Recorder{}
	defer t.Close()
	env := bentotest.New(t, nil)
	env.Migrate(t, &Account{})
	a := &Account{}
	a.ID = "acc-1"
	a.Deposit(5)
	_ = env.Units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(a) })

	env.Drain(t)
	env.RequirePublished(t, bentotest.Want{Topic: "account.deposited", AggregateID: "acc-1", Payload: Deposited{AccountID: "acc-1", Amount: 5}})
	fmt.Println("failed:", t.Failed())
	// Output: failed: false
}

func ExampleEnv_Deliver() {
	t := &bentotest.Recorder{}
	defer t.Close()
	env := bentotest.New(t, nil)
	env.Migrate(t, &Ledger{})
	c := env.MustConsumer(t, "accounting")
	calls := 0
	_ = consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e Deposited, m *messaging.Envelope) error {
		calls++
		return tx.Create(&Ledger{EventID: m.ID, Kind: "deposit"}).Error
	})
	env.Start(t, c)

	// Message builds what a projector would publish; Deliver sends copies at
	// once, like racing redeliveries, and drains.
	msg := env.Message(t, Deposited{AccountID: "acc-1", Amount: 5}, nil)
	env.Deliver(t, msg, 3)
	fmt.Println("handler calls:", calls)
	// Output: handler calls: 1
}
