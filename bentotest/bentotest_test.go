package bentotest_test

import (
	"context"
	"errors"
	"log/slog"

	"github.com/oklog/ulid/v2"
	"gorm.io/gorm"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/bentotest"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/uow"
)

// Account is the kit's test aggregate.
type Account struct {
	aggregate.Base
	Balance int64
}

func (*Account) AggregateType() string { return "account" }

type Deposited struct {
	AccountID string `json:"account_id"`
	Amount    int64  `json:"amount"`
}

func (Deposited) EventType() string { return "account.deposited" }

type Thanked struct {
	AccountID string `json:"account_id"`
}

func (Thanked) EventType() string { return "account.thanked" }

func (a *Account) Deposit(n int64) {
	a.Balance += n
	a.Record(Deposited{AccountID: a.ID, Amount: n})
}

// Ledger is what the consumers write.
type Ledger struct {
	EventID string `gorm:"primaryKey"`
	Kind    string
}

func open(t *testing.T) *bentotest.Env {
	env := bentotest.New(t, nil)
	env.Migrate(t, &Account{}, &Ledger{})
	return env
}

func deposit(t *testing.T, env *bentotest.Env, id string, amounts ...int64) {
	t.Helper()
	require.NoError(t, env.Units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error {
		a, err := uow.Get[Account](ctx, u, id)
		if errors.Is(err, uow.ErrNotFound) {
			a = &Account{}
			a.ID = id
			err = u.Add(a)
		}
		if err != nil {
			return err
		}
		for _, n := range amounts {
			a.Deposit(n)
		}
		return nil
	}))
}

func ledgerRows(t *testing.T, env *bentotest.Env, kind string) int64 {
	var n int64
	require.NoError(t, env.DB.Model(&Ledger{}).Where("kind = ?", kind).Count(&n).Error)
	return n
}

// TestCommandDrainAssert is the kit's main path: a command, Drain, and
// assertions over the outbox, the bus and a consumer's effects, including a
// chain (a handler that emits an event another consumer handles).
func TestCommandDrainAssert(t *testing.T) {
	t.Parallel()
	env := open(t)
	accounting := env.MustConsumer(t, "accounting")
	require.NoError(t, consumer.Handle(accounting, func(ctx context.Context, tx *gorm.DB, e Deposited, m *messaging.Envelope) error {
		if err := tx.Create(&Ledger{EventID: m.ID, Kind: "deposit"}).Error; err != nil {
			return err
		}
		// Emit a follow-up event through a unit of work (it joins the inbox tx).
		return env.Units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			a, err := uow.Get[Account](ctx, u, e.AccountID)
			if err != nil {
				return err
			}
			a.Record(Thanked{AccountID: a.ID})
			return nil
		})
	}))
	mail := env.MustConsumer(t, "mail")
	require.NoError(t, consumer.Handle(mail, func(ctx context.Context, tx *gorm.DB, e Thanked, m *messaging.Envelope) error {
		return tx.Create(&Ledger{EventID: m.ID, Kind: "thanks"}).Error
	}))
	env.Start(t, accounting)
	env.Start(t, mail)

	deposit(t, env, "acc-1", 10, 5)
	env.RequireCommitted(t,
		bentotest.Want{Topic: "account.deposited", AggregateID: "acc-1", Payload: Deposited{AccountID: "acc-1", Amount: 10}},
		bentotest.Want{Topic: "account.deposited", Payload: map[string]any{"account_id": "acc-1", "amount": 5}},
	)
	res := env.Drain(t)
	assert.Equal(t, 4, res.Published, "2 deposits and the 2 thanks they caused")
	env.RequirePublished(t,
		bentotest.Want{Topic: "account.deposited"}, bentotest.Want{Topic: "account.deposited"},
		bentotest.Want{Topic: "account.thanked"}, bentotest.Want{Topic: "account.thanked"},
	)
	assert.Equal(t, int64(2), ledgerRows(t, env, "deposit"))
	assert.Equal(t, int64(2), ledgerRows(t, env, "thanks"))
	thanks := env.PublishedEvents(t)[2]
	deposits := env.PublishedEvents(t)[0]
	assert.Equal(t, deposits.ID, thanks.Metadata["causation_id"], "the chain keeps causation")
}

func TestRequireRecorded(t *testing.T) {
	t.Parallel()
	a := &Account{}
	a.ID = "acc-1"
	a.Deposit(3)
	bentotest.RequireRecorded(t, a, bentotest.Want{Topic: "account.deposited", Payload: Deposited{AccountID: "acc-1", Amount: 3}})

	r := &bentotest.Recorder{}
	bentotest.RequireRecorded(r, a, bentotest.Want{Topic: "account.deposited", Payload: Deposited{AccountID: "acc-1", Amount: 4}})
	require.True(t, r.Failed(), "a wrong payload must fail")
	msg := r.String()
	assert.Contains(t, msg, `payload {"account_id":"acc-1","amount":3}, want {"account_id":"acc-1","amount":4}`)
	assert.Contains(t, msg, "expected:")
	assert.Contains(t, msg, "recorded:")
	assert.Contains(t, msg, "account/acc-1 v1")

	r = &bentotest.Recorder{}
	bentotest.RequireRecorded(r, a)
	assert.Contains(t, r.String(), "1 events, want 0")
	r = &bentotest.Recorder{}
	bentotest.RequireRecorded(r, a, bentotest.Want{Topic: "account.opened"})
	assert.Contains(t, r.String(), `topic "account.deposited", want "account.opened"`)
}

func TestCommittedAndPublishedAssertionsFail(t *testing.T) {
	t.Parallel()
	env := open(t)
	deposit(t, env, "acc-1", 1)
	r := &bentotest.Recorder{}
	env.RequireCommitted(r, bentotest.Want{AggregateID: "acc-2"})
	assert.Contains(t, r.String(), `aggregate "acc-1", want "acc-2"`)

	r = &bentotest.Recorder{}
	env.RequirePublished(r, bentotest.Want{Topic: "account.deposited"})
	assert.Contains(t, r.String(), "0 events, want 1", "nothing is published before Drain")
	assert.Contains(t, r.String(), "(none)")

	// No consumer is bound to account.deposited: it is published to the
	// alternate queue, as RabbitMQ's alternate exchange would.
	res := env.Drain(t)
	assert.Equal(t, 1, res.Published)
	assert.Equal(t, 0, res.Failed)
	r = &bentotest.Recorder{}
	env.RequirePublished(r, bentotest.Want{Topic: "account.withdrawn"})
	assert.Contains(t, r.String(), `topic "account.deposited", want "account.withdrawn"`)
}

// TestDrainNamesAHandlerWritingOutsideItsTransaction: a handler that
// writes through the env's *gorm.DB instead of the tx it receives waits
// for the lock its own message's transaction holds (SQLite); Drain's
// failure names that likely cause instead of only "still busy".
func TestDrainNamesAHandlerWritingOutsideItsTransaction(t *testing.T) {
	t.Parallel()
	env := bentotest.New(t, &bentotest.Options{DrainTimeout: 300 * time.Millisecond})
	env.Migrate(t, &Account{}, &Ledger{})
	// A handler timeout ends each stuck attempt, so that the test stops
	// quickly; the lock is held again by the next attempt.
	cfg := consumer.DefaultConfig("accounting")
	cfg.HandlerTimeout, cfg.MaxRetries, cfg.RetryInitialInterval = 100*time.Millisecond, 1000, time.Millisecond
	cfg.CloseTimeout, cfg.Logger = 100*time.Millisecond, slog.New(slog.DiscardHandler)
	c, err := consumer.NewMemory(env.DB, env.Bus, cfg)
	require.NoError(t, err)
	entered := make(chan struct{}, 1)
	require.NoError(t, consumer.Handle(c, func(ctx context.Context, _ *gorm.DB, e Deposited, m *messaging.Envelope) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		// The mistake: env.DB, not the tx this handler receives.
		return env.DB.WithContext(ctx).Create(&Ledger{EventID: m.ID, Kind: "deposit"}).Error
	}))
	env.Start(t, c)
	deposit(t, env, "acc-1", 10)

	r := &bentotest.Recorder{}
	r.Run(func(tb bentotest.TB) { env.Drain(tb) })
	require.True(t, r.Failed(), "Drain gives up on the stuck handler")
	<-entered
	assert.Contains(t, r.String(), bentotest.BusyHint)
}

func TestRequireAppliedOnce(t *testing.T) {
	t.Parallel()
	env := open(t)
	c := env.MustConsumer(t, "accounting")
	require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e Deposited, m *messaging.Envelope) error {
		return tx.Create(&Ledger{EventID: m.ID, Kind: "deposit"}).Error
	}))
	env.Start(t, c)
	msg := env.Message(t, Deposited{AccountID: "acc-1", Amount: 1}, &bentotest.MessageOpts{AggregateType: "account", AggregateID: "acc-1", AggregateVersion: 1})
	env.RequireAppliedOnce(t, msg, func() int64 { return ledgerRows(t, env, "deposit") })

	// A consumer without the inbox applies every delivery: the helper says so.
	require.NoError(t, env.Bus.DeclareQueue("raw", "account.thanked"))
	var raw atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := env.Bus.Subscriber("raw", "account.thanked").Subscribe(ctx, "")
	require.NoError(t, err)
	go func() {
		for m := range msgs {
			raw.Add(1)
			m.Ack()
		}
	}()
	r := &bentotest.Recorder{}
	r.Run(func(tb bentotest.TB) {
		env.RequireAppliedOnce(tb, env.Message(t, Thanked{AccountID: "acc-1"}, nil), raw.Load)
	})
	assert.Contains(t, r.String(), "delivered 6 times took effect 6 times, want 1")
}

func TestClockIsDeterministic(t *testing.T) {
	t.Parallel()
	ids := func() []string {
		c := bentotest.NewClock(bentotest.DefaultStart)
		var out []string
		for i := 0; i < 5; i++ {
			out = append(out, c.NewID(c.Now()))
			c.Advance(time.Millisecond)
		}
		out = append(out, c.NewID(bentotest.DefaultStart)) // an earlier time still increases
		return out
	}
	first, second := ids(), ids()
	assert.Equal(t, first, second, "same start, same ids")
	for i := 1; i < len(first); i++ {
		assert.Greater(t, first[i], first[i-1])
	}
	c := bentotest.NewClock(bentotest.DefaultStart)
	c.Advance(time.Hour)
	assert.Equal(t, bentotest.DefaultStart.Add(time.Hour), c.Now())
	c.Set(bentotest.DefaultStart)
	assert.Equal(t, bentotest.DefaultStart, c.Now())

	// The env's events carry the clock's time and ids.
	env := open(t)
	deposit(t, env, "acc-1", 1)
	got := env.Committed(t)
	require.Len(t, got, 1)
	assert.Equal(t, bentotest.DefaultStart, ulid.MustParse(got[0].ID).Timestamp().UTC(), "id %s carries the clock's time", got[0].ID)
	assert.Equal(t, "01KDVDNA000000000000000001", got[0].ID, "and is the same every run")
}

// TestOptionsDefaults checks the config convention: nil and zero Options
// start the clock at DefaultStart with the default tenant, and bad Options
// fail the test with ErrInvalidOptions naming each field.
func TestOptionsDefaults(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string]*bentotest.Options{"nil": nil, "zero": {}} {
		env := bentotest.New(t, opts)
		assert.Equal(t, bentotest.DefaultStart, env.Clock.Now(), name)
		assert.Equal(t, "default", env.Units.Config().Tenant, name)
	}
	r := &bentotest.Recorder{}
	defer r.Close()
	r.Run(func(tb bentotest.TB) {
		bentotest.New(tb, &bentotest.Options{DrainTimeout: -time.Second, Tenant: "no spaces"})
		t.Error("New must stop at bad options")
	})
	require.Len(t, r.Failures(), 1)
	for _, want := range []string{bentotest.ErrInvalidOptions.Error(), "DrainTimeout:", "Tenant:"} {
		assert.Contains(t, r.Failures()[0], want)
	}
}

func TestRecorder(t *testing.T) {
	t.Parallel()
	r := &bentotest.Recorder{}
	cleaned := false
	r.Cleanup(func() { cleaned = true })
	r.Run(func(tb bentotest.TB) {
		tb.Errorf("first %d", 1)
		tb.Fatalf("second")
		t.Error("Fatalf must stop the function")
	})
	assert.Equal(t, []string{"first 1", "second"}, r.Failures())
	r.Close()
	assert.True(t, cleaned)
}
