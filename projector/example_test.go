package projector_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/uow"
)

func ExampleOutboxProjector() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "bento-projector")
	defer os.RemoveAll(dir)
	db, err := embedded.OpenSQLite(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := outbox.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	_ = db.AutoMigrate(&Counter{})
	store, _ := outbox.NewStore(db, nil)
	units, _ := uow.New(db, &uow.Config{Outbox: store})

	// The bus: in memory here, rabbitmq.NewPublisher for RabbitMQ, or
	// any Watermill publisher. Declare consumer queues before relaying.
	bus := messaging.NewMemoryBus()
	defer bus.Close()
	_ = bus.DeclareQueue("audit", "counter.#")

	// Commit two events.
	c := &Counter{}
	c.ID = "counter-1"
	c.Tick()
	c.Tick()
	if err := units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(c) }); err != nil {
		log.Fatal(err)
	}

	cfg := projector.DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := projector.New(store, bus, cfg)
	if err != nil {
		log.Fatal(err)
	}
	// Drain relays what is due and returns; in a service, run p.Run(ctx).
	res, err := p.Drain(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published:", res.Published)

	msgs, _ := bus.Subscriber("audit", "counter.#").Subscribe(ctx, "counter.#")
	for i := 0; i < 2; i++ {
		m := <-msgs
		env, _ := messaging.Decode(m)
		fmt.Println(env.EventType, env.AggregateID, env.AggregateVersion)
		m.Ack()
	}
	// Output:
	// published: 2
	// counter.ticked counter-1 1
	// counter.ticked counter-1 2
}

// A projector whose bus is a dbbus.Bus on the outbox's database relays
// each batch in the transaction that marks it sent: exactly once.
func ExampleTxPublisher() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "bento-projector")
	defer os.RemoveAll(dir)
	db, err := embedded.OpenSQLite(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, _ := db.DB()
	defer sqlDB.Close()
	if err := outbox.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	if err := dbbus.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	_ = db.AutoMigrate(&Counter{})
	store, _ := outbox.NewStore(db, nil)
	units, _ := uow.New(db, &uow.Config{Outbox: store})

	// The bus's queues live in the same database as the outbox.
	bus, err := dbbus.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer bus.Close()
	if err := dbbus.DeclareGroup(ctx, db, "audit", "counter.#"); err != nil {
		log.Fatal(err)
	}

	c := &Counter{}
	c.ID = "counter-1"
	c.Tick()
	if err := units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(c) }); err != nil {
		log.Fatal(err)
	}

	cfg := projector.DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := projector.New(store, bus, cfg) // bus is a projector.TxPublisher
	if err != nil {
		log.Fatal(err)
	}
	res, err := p.Drain(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published:", res.Published)

	msgs, _ := bus.Subscriber().Subscribe(ctx, "audit")
	m := <-msgs
	env, _ := messaging.Decode(m)
	fmt.Println(env.EventType, env.AggregateID, env.AggregateVersion)
	m.Ack()
	// Output:
	// published: 1
	// counter.ticked counter-1 1
}
