package chaos_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/chaos"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/uow"
)

// Account is a service's own aggregate.
type Account struct {
	aggregate.Base
	Balance int64
}

func (*Account) AggregateType() string { return "account" }

// Deposited is its event.
type Deposited struct {
	AccountID string `json:"account_id"`
	Amount    int64  `json:"amount"`
}

func (Deposited) EventType() string { return "account.deposited" }

// Statement is the read model the service's handler keeps.
type Statement struct {
	AccountID string `gorm:"primaryKey;size:64"`
	Total     int64
}

// accounts is the service as the campaign sees it: its tables, its
// command, and its "statements" group, whose handler is the service's own
// (registered with chaos.Handle, so that the checker sees it apply).
func accounts() *chaos.System {
	return &chaos.System{
		Migrate: func(ctx context.Context, db *gorm.DB) error {
			return db.WithContext(ctx).AutoMigrate(&Account{}, &Statement{})
		},
		Command: func(ctx context.Context, u *uow.UnitOfWork, id string, rng *rand.Rand) error {
			a, err := uow.Get[Account](ctx, u, id)
			if errors.Is(err, uow.ErrNotFound) {
				a = &Account{}
				a.ID = id
				err = u.Add(a)
			}
			if err != nil {
				return err
			}
			amount := 1 + rng.Int64N(100)
			a.Balance += amount
			a.Record(Deposited{AccountID: id, Amount: amount})
			return nil
		},
		Groups: []chaos.Group{{
			Name: "statements", Topics: []string{"account.deposited"}, Partitions: 4,
			Register: func(c *consumer.Consumer, env *chaos.Env) error {
				return chaos.Handle(c, func(ctx context.Context, tx *gorm.DB, e Deposited, _ *messaging.Envelope) error {
					s := Statement{AccountID: e.AccountID}
					if err := tx.FirstOrCreate(&s).Error; err != nil {
						return err
					}
					return tx.Model(&s).Update("total", gorm.Expr("total + ?", e.Amount)).Error
				})
			},
		}},
	}
}

// TestAccountsUnderFaults is how a service runs its own handlers under the
// campaign: here on the embedded default, for 20 seconds of faults.
func TestAccountsUnderFaults(t *testing.T) {
	sys := accounts()
	if chaos.IsChild() {
		chaos.Run(t, sys, nil) // a process of the campaign: plays its part, exits
	}
	testenv.Stress(t) // bento's CI runs campaigns in the pass without -race
	r := chaos.Run(t, sys, &chaos.Config{Stack: chaos.SQLiteDatabaseBus, Duration: 20 * time.Second, Rate: 30})
	if r.Groups["statements"].Applied == 0 {
		t.Errorf("nothing applied: %s", r)
	}
}

// ExampleRun shows the calls a service's test makes; see
// TestAccountsUnderFaults for the whole test.
func ExampleRun() {
	test := func(t *testing.T) {
		sys := accounts()
		if chaos.IsChild() {
			chaos.Run(t, sys, nil)
		}
		report := chaos.Run(t, sys, &chaos.Config{
			Stack:       chaos.PostgresRabbitMQ,
			PostgresDSN: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
			AMQPURL:     "amqp://guest:guest@127.0.0.1:5672/",
			Duration:    time.Minute,
		})
		t.Log(report)
	}
	_ = test
}
