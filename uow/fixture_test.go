package uow_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

// Account is the aggregate the suite changes.
type Account struct {
	aggregate.Base
	Owner   string
	Balance int64
}

func (*Account) AggregateType() string { return "account" }

type Opened struct {
	AccountID string `json:"account_id"`
	Owner     string `json:"owner"`
}

func (Opened) EventType() string { return "account.opened" }

type Deposited struct {
	AccountID string `json:"account_id"`
	Amount    int64  `json:"amount"`
}

func (Deposited) EventType() string { return "account.deposited" }

// OpenAccount creates an account, recording Opened.
func OpenAccount(id, owner string) *Account {
	a := &Account{Owner: owner}
	a.ID = id
	a.Record(Opened{AccountID: id, Owner: owner})
	return a
}

// Deposit changes the balance, recording Deposited.
func (a *Account) Deposit(amount int64) error {
	if amount <= 0 {
		return errors.New("deposit must be positive")
	}
	a.Balance += amount
	a.Record(Deposited{AccountID: a.ID, Amount: amount})
	return nil
}

// env is what each suite test needs.
type env struct {
	db      *gorm.DB
	units   *uow.Manager
	stamper *testenv.Clock
	backend testenv.Backend
}

var epoch = time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)

// setup migrates db and returns a manager using a fake clock.
func setup(t *testing.T, b testenv.Backend, db *gorm.DB) *env {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, outbox.Migrate(ctx, db))
	require.NoError(t, db.AutoMigrate(&Account{}))
	st := testenv.NewClock(epoch)
	store, err := outbox.NewStore(db, &outbox.Config{Clock: st, Test: outbox.TestConfig{Clock: st}})
	require.NoError(t, err)
	units, err := uow.New(db, &uow.Config{Outbox: store, Producer: "suite"})
	require.NoError(t, err)
	return &env{db: db, units: units, stamper: st, backend: b}
}

// outboxRows returns every outbox row ordered by id.
func (e *env) outboxRows(t *testing.T) []outbox.Message {
	t.Helper()
	var rows []outbox.Message
	require.NoError(t, e.db.Order("id").Find(&rows).Error)
	return rows
}

// load reads an account outside any unit.
func (e *env) load(t *testing.T, id string) *Account {
	t.Helper()
	var a Account
	require.NoError(t, e.db.Take(&a, "id = ?", id).Error)
	return &a
}

func (e *env) count(t *testing.T, model any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, e.db.Model(model).Count(&n).Error)
	return n
}

// commitNew saves a freshly opened account.
func (e *env) commitNew(t *testing.T, id string) *Account {
	t.Helper()
	a := OpenAccount(id, "ann")
	err := e.units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error {
		return u.Track(a)
	})
	require.NoError(t, err)
	return a
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func (e *env) commitNewCtx(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	a := OpenAccount(id, "ann")
	require.NoError(t, e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Track(a) }))
}
