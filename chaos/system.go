package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

// A System is the service a campaign attacks: its tables, the command its
// writers run, and its consumer groups. The same System value must be
// built in the test that calls Run and in the processes Run starts (they
// run that test again), so build it from code, not from state.
type System struct {
	// Migrate creates the system's own tables (its aggregates, its read
	// models). bento's tables and the campaign's ledgers are created by
	// Run. Optional.
	Migrate func(ctx context.Context, db *gorm.DB) error
	// Command runs one command on the aggregate id in u, as the
	// application would: load it (creating it the first time, when
	// uow.Get returns uow.ErrNotFound), change it, let it record events.
	// rng is the writer's seeded source. Every event a unit commits is
	// written down in the campaign's commit ledger in the same
	// transaction. Required.
	Command func(ctx context.Context, u *uow.UnitOfWork, id string, rng *rand.Rand) error
	// Groups are the consumer groups. At least one is required.
	Groups []Group
	// Poison reports whether an event is poison on purpose: its handler
	// fails or crashes on it every time. The checker expects each group
	// that receives a poison event to dead-letter it, and no other.
	// Defaults to no poison.
	Poison func(topic string, payload []byte) bool
}

// A Group is one consumer group of a System.
type Group struct {
	// Name names the group. Run makes it unique to the run (see
	// Env.Group), so that runs never share a broker's queues.
	Name string
	// Topics are the event types the group is bound to and handles: the
	// checker expects the group to apply every committed event of these
	// types exactly once (bar poison). At least one.
	Topics []string
	// Partitions, when positive, splits the group into that many
	// partitions (consumer.Config.Partitions): the checker then also
	// requires each aggregate's events to be applied in version order and
	// none past a dead letter (hold-back). Zero or negative: one queue,
	// competing subscriptions, no order.
	Partitions int
	// Register adds the group's handlers to c, with Handle (not
	// consumer.Handle), so that each application is written down in the
	// campaign's applied ledger in the handler's transaction. Required.
	Register func(c *consumer.Consumer, env *Env) error
	// Configure, when set, adjusts the group's consumer configuration in
	// every instance (retries, batch size, timeouts). Run has set Group,
	// Partitions, Logger and short retry intervals first.
	Configure func(cfg *consumer.Config)
}

// Env is what a group's handlers get from the campaign in the process
// that runs them.
type Env struct {
	// DB is the database (through the process's link, which the
	// campaign cuts, hangs and slows).
	DB *gorm.DB
	// Units is a unit-of-work manager whose commits are written down in
	// the commit ledger: emit a handler's chained events through it
	// (units.Run with the handler's context joins the inbox's
	// transaction).
	Units *uow.Manager
	// Group is the group's name in this run.
	Group string
	// Instance names the process: the slot it runs in and its restart.
	Instance string
}

// commitRow is one event in the commit ledger, written by the unit of
// work's BeforeCommit hook in the transaction that commits the event.
type commitRow struct {
	ID            int64  `gorm:"primaryKey;autoIncrement"`
	EventID       string `gorm:"size:26;not null;uniqueIndex:chaos_commits_event"`
	Topic         string `gorm:"size:100;not null"`
	AggregateType string `gorm:"size:100;not null"`
	AggregateID   string `gorm:"size:200;not null"`
	Version       int64  `gorm:"not null"`
	Poison        bool   `gorm:"not null"`
	// At is when the unit wrote it, just before its commit, on this
	// machine's clock (not the writers' skewed one).
	At time.Time `gorm:"not null"`
}

func (commitRow) TableName() string { return "chaos_commits" }

// appliedRow is one application of an event by a group, written by
// Handle in the handler's transaction. It has no unique key: an effect
// applied twice shows as two rows.
type appliedRow struct {
	ID            int64  `gorm:"primaryKey;autoIncrement"`
	Grp           string `gorm:"size:200;not null;index:chaos_applied_group"`
	MessageID     string `gorm:"size:26;not null"`
	Topic         string `gorm:"size:100;not null"`
	AggregateType string `gorm:"size:100;not null"`
	AggregateID   string `gorm:"size:200;not null"`
	Version       int64  `gorm:"not null"`
	Instance      string `gorm:"size:100;not null"`
	// At is when the handler returned, on this machine's clock.
	At time.Time `gorm:"not null"`
}

func (appliedRow) TableName() string { return "chaos_applied" }

// migrateLedgers creates the two ledgers.
func migrateLedgers(db *gorm.DB) error {
	if err := db.AutoMigrate(&commitRow{}, &appliedRow{}); err != nil {
		return fmt.Errorf("chaos: create the ledgers: %w", err)
	}
	return nil
}

// ledgerHook is the BeforeCommit hook that writes the commit ledger.
func ledgerHook(poison func(string, []byte) bool) func(context.Context, *gorm.DB, []*outbox.Message) error {
	return func(ctx context.Context, tx *gorm.DB, events []*outbox.Message) error {
		rows := make([]commitRow, 0, len(events))
		now := time.Now().UTC()
		for _, m := range events {
			rows = append(rows, commitRow{
				EventID: m.ID, Topic: m.Topic, AggregateType: m.AggregateType, AggregateID: m.AggregateID,
				Version: m.AggregateVersion, Poison: poison != nil && poison(m.Topic, m.Payload), At: now,
			})
		}
		return tx.Create(&rows).Error
	}
}

// newUnits returns a manager whose commits are written down in the commit
// ledger, its events stamped by clock.
func newUnits(db *gorm.DB, sys *System, clock aggregate.Clock) (*uow.Manager, error) {
	store, err := outbox.NewStore(db, &outbox.Config{Clock: clock})
	if err != nil {
		return nil, err
	}
	return uow.New(db, &uow.Config{Outbox: store, BeforeCommit: ledgerHook(sys.Poison), Producer: "chaos"})
}

// instance is this process's name in the applied ledger.
var instance = func() string {
	if s := os.Getenv(envInstance); s != "" {
		return s
	}
	return fmt.Sprintf("pid%d", os.Getpid())
}()

// Handle registers fn for events of type E on c, as consumer.Handle does,
// and writes each application of an event down in the campaign's applied
// ledger, in the handler's transaction, after fn returns nil: an effect
// that commits is recorded exactly when it commits.
func Handle[E aggregate.Event](c *consumer.Consumer, fn consumer.HandlerFunc[E]) error {
	group := c.Group()
	return consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e E, env *messaging.Envelope) error {
		if err := fn(ctx, tx, e, env); err != nil {
			return err
		}
		return tx.Create(&appliedRow{
			Grp: group, MessageID: env.ID, Topic: env.EventType, AggregateType: env.AggregateType,
			AggregateID: env.AggregateID, Version: env.AggregateVersion, Instance: instance, At: time.Now().UTC(),
		}).Error
	})
}

// skewClock is aggregate.SystemClock shifted by an offset the clock-skew
// fault changes.
type skewClock struct {
	offset atomic.Int64 // nanoseconds
}

func (c *skewClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

func (c *skewClock) NewID(t time.Time) string { return aggregate.SystemClock{}.NewID(t) }
