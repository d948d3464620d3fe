package chaos_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/chaos"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/uow"
)

var (
	flagSeeds    = flag.String("chaos.seeds", "", "comma-separated seeds to run (default: the fixed seeds and one fresh seed)")
	flagDuration = flag.Duration("chaos.duration", 0, "how long each campaign's faults last (default: 40s; a soak: 1h)")
	flagStacks   = flag.String("chaos.stacks", "", "comma-separated stacks (default: all three)")
	flagKeep     = flag.Bool("chaos.keep", false, "keep each run's schema and queues for inspection")
	flagDir      = flag.String("chaos.dir", "", "keep the processes' logs in this directory (default: a temporary one)")
	flagRate     = flag.Int("chaos.rate", 0, "commands a second the writers run together (default: chaos.Config's, 30 on SQLite)")
)

// Item is the workload's aggregate: a counter that records ItemAdded.
type Item struct {
	aggregate.Base
	Total int64
}

func (*Item) AggregateType() string { return "item" }

// ItemAdded is recorded by each command. Poison, when set ("fail" or
// "crash"), makes the handlers fail on it, or kill their process, every
// time.
type ItemAdded struct {
	ItemID string `json:"item_id"`
	N      int64  `json:"n"`
	Poison string `json:"poison,omitempty"`
}

func (ItemAdded) EventType() string { return "item.added" }

// Tally is the chained aggregate the tally group's handler changes: one
// per item, recording TallyNoted for each ItemAdded applied.
type Tally struct {
	aggregate.Base
	Seen int64
}

func (*Tally) AggregateType() string { return "tally" }

// TallyNoted is the chained event.
type TallyNoted struct {
	ItemID string `json:"item_id"`
	Seen   int64  `json:"seen"`
}

func (TallyNoted) EventType() string { return "tally.noted" }

// ItemTotal is the tally group's read model.
type ItemTotal struct {
	ItemID string `gorm:"primaryKey;size:64"`
	Total  int64
}

// AuditLine is the audit group's read model: one line per event applied.
type AuditLine struct {
	ID      int64  `gorm:"primaryKey;autoIncrement"`
	EventID string `gorm:"size:26"`
}

// workload is the campaign's own System: writers add to items; the
// partitioned "tally" group keeps each item's total and emits a chained
// tally.noted event per item.added; the unpartitioned "audit" group writes
// a line per event of both types. One command in poisonEvery records a
// poison item.added: "fail" (its handlers return an error) or "crash"
// (the tally handler kills its process).
func workload(poisonEvery int) *chaos.System {
	return &chaos.System{
		Migrate: func(ctx context.Context, db *gorm.DB) error {
			return db.WithContext(ctx).AutoMigrate(&Item{}, &Tally{}, &ItemTotal{}, &AuditLine{})
		},
		Command: func(ctx context.Context, u *uow.UnitOfWork, id string, rng *rand.Rand) error {
			it, err := uow.Get[Item](ctx, u, id)
			if errors.Is(err, uow.ErrNotFound) {
				it = &Item{}
				it.ID = id
				err = u.Add(it)
			}
			if err != nil {
				return err
			}
			e := ItemAdded{ItemID: id, N: 1 + rng.Int64N(9)}
			if rng.IntN(poisonEvery) == 0 {
				e.Poison = [...]string{"fail", "crash"}[rng.IntN(2)]
			}
			it.Total += e.N
			it.Record(e)
			return nil
		},
		Poison: func(topic string, payload []byte) bool {
			return topic == "item.added" && strings.Contains(string(payload), `"poison":`)
		},
		Groups: []chaos.Group{
			{
				Name: "tally", Topics: []string{"item.added"}, Partitions: 8,
				Register: func(c *consumer.Consumer, env *chaos.Env) error {
					return chaos.Handle(c, func(ctx context.Context, tx *gorm.DB, e ItemAdded, _ *messaging.Envelope) error {
						switch e.Poison {
						case "fail":
							return fmt.Errorf("poison item.added of %s", e.ItemID)
						case "crash":
							os.Exit(7) // the process dies mid-handler, every time
						}
						if err := tx.Clauses(clause.OnConflict{
							Columns:   []clause.Column{{Name: "item_id"}},
							DoUpdates: clause.Assignments(map[string]any{"total": gorm.Expr("item_totals.total + ?", e.N)}),
						}).Create(&ItemTotal{ItemID: e.ItemID, Total: e.N}).Error; err != nil {
							return err
						}
						return env.Units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
							t, err := uow.Get[Tally](ctx, u, "t-"+e.ItemID)
							if errors.Is(err, uow.ErrNotFound) {
								t = &Tally{}
								t.ID = "t-" + e.ItemID
								err = u.Add(t)
							}
							if err != nil {
								return err
							}
							t.Seen++
							t.Record(TallyNoted{ItemID: e.ItemID, Seen: t.Seen})
							return nil
						})
					})
				},
			},
			{
				Name: "audit", Topics: []string{"item.added", "tally.noted"},
				Register: func(c *consumer.Consumer, env *chaos.Env) error {
					line := func(tx *gorm.DB, env *messaging.Envelope) error {
						return tx.Create(&AuditLine{EventID: env.ID}).Error
					}
					if err := chaos.Handle(c, func(ctx context.Context, tx *gorm.DB, e ItemAdded, env *messaging.Envelope) error {
						if e.Poison != "" {
							return fmt.Errorf("poison item.added of %s", e.ItemID)
						}
						return line(tx, env)
					}); err != nil {
						return err
					}
					return chaos.Handle(c, func(ctx context.Context, tx *gorm.DB, e TallyNoted, env *messaging.Envelope) error {
						return line(tx, env)
					})
				},
			},
		},
	}
}

// fixedSeeds are the seeds every CI run replays, per stack.
var fixedSeeds = map[chaos.Stack][]uint64{
	chaos.PostgresRabbitMQ:    {1, 2},
	chaos.PostgresDatabaseBus: {3},
	chaos.SQLiteDatabaseBus:   {4},
}

// TestCampaign runs the workload under the fault campaign on each stack:
// the fixed seeds, then one fresh seed on PostgreSQL + RabbitMQ (printed in
// the log, to replay with -chaos.seeds). -chaos.duration makes it a soak.
func TestCampaign(t *testing.T) {
	sys := workload(600)
	if chaos.IsChild() {
		chaos.Run(t, sys, nil) // plays its part and exits
	}
	testenv.Stress(t)
	stacks := []chaos.Stack{chaos.PostgresRabbitMQ, chaos.PostgresDatabaseBus, chaos.SQLiteDatabaseBus}
	if *flagStacks != "" {
		stacks = nil
		for _, s := range strings.Split(*flagStacks, ",") {
			stacks = append(stacks, chaos.Stack(s))
		}
	}
	duration := 40 * time.Second
	if *flagDuration > 0 {
		duration = *flagDuration
	}
	for _, stack := range stacks {
		seeds := fixedSeeds[stack]
		if stack == chaos.PostgresRabbitMQ {
			seeds = append(seeds, 0) // a fresh one
		}
		if *flagSeeds != "" {
			seeds = nil
			for _, s := range strings.Split(*flagSeeds, ",") {
				n, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					t.Fatalf("-chaos.seeds: %v", err)
				}
				seeds = append(seeds, n)
			}
		}
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("%s/seed=%d", stack, seed), func(t *testing.T) {
				cfg := &chaos.Config{Stack: stack, Seed: seed, Duration: duration, Keep: *flagKeep}
				if *flagDir != "" {
					cfg.Dir, _ = os.MkdirTemp(*flagDir, "campaign")
				}
				switch stack {
				case chaos.PostgresRabbitMQ:
					cfg.PostgresDSN, cfg.AMQPURL = testenv.RequirePostgres(t), testenv.RequireAMQP(t)
				case chaos.PostgresDatabaseBus:
					cfg.PostgresDSN = testenv.RequirePostgres(t)
				case chaos.SQLiteDatabaseBus:
					cfg.Rate = 30 // one file for every process
				}
				if *flagRate > 0 {
					cfg.Rate = *flagRate
				}
				r := chaos.Run(t, sys, cfg)
				t.Logf("timeline:\n%s", r.TimelineString())
				if r.Commits == 0 || r.Groups["tally"].Applied == 0 {
					t.Errorf("the campaign committed or applied nothing: %s", r)
				}
			})
		}
	}
}

// TestCrashPoisonOnTheDatabaseBus: on the database bus, with no other
// fault, one command in 40 records a poison event, half of which kill the
// tally group's process every time it handles them (a handler crash loop
// under a supervisor). Each such event must be dead-lettered as poison
// once its attempts have died Config.MaxCrashes times, holding its
// aggregate back, and every other event applied once, in order. The crash
// ledger once never counted a crash on the database bus (it knew only
// RabbitMQ's redelivery marks), so the poison looped forever and its
// partition stalled.
func TestCrashPoisonOnTheDatabaseBus(t *testing.T) {
	sys := workload(40)
	if chaos.IsChild() {
		chaos.Run(t, sys, nil)
	}
	testenv.Stress(t)
	for _, stack := range []chaos.Stack{chaos.PostgresDatabaseBus, chaos.SQLiteDatabaseBus} {
		t.Run(string(stack), func(t *testing.T) {
			// Each poison crash-loops its partition's owner MaxCrashes
			// times, each crash costing a visibility timeout before the
			// next owner takes over, so the partitions drain slowly: 52 s
			// on a quiet machine, more than two minutes in one CI run.
			cfg := &chaos.Config{Stack: stack, Seed: 5, Duration: 15 * time.Second, Settle: 4 * time.Minute, Rate: 30, Exclude: stack.Faults()}
			if stack == chaos.PostgresDatabaseBus {
				cfg.PostgresDSN = testenv.RequirePostgres(t)
			}
			r := chaos.Run(t, sys, cfg)
			tally := r.Groups["tally"]
			t.Logf("tally: %d poison dead letters, %d events held behind them, %d process starts", tally.Poison, tally.Held, r.Starts)
			if tally.Poison == 0 || r.Starts <= 8 {
				t.Errorf("the run had no crash loop to survive: %s", r)
			}
		})
	}
}
