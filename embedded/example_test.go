package embedded_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/uow"
)

// Order is the example's aggregate.
type Order struct {
	aggregate.Base
	Status string
}

func (*Order) AggregateType() string { return "order" }

// OrderPlaced is the example's event.
type OrderPlaced struct {
	OrderID string `json:"order_id"`
}

func (OrderPlaced) EventType() string { return "order.placed" }

func ExampleOpen() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "bento-embedded")
	defer os.RemoveAll(dir)

	// One call: a SQLite file with bento's tables, the outbox store, a
	// projector relaying to the database bus in the same file, and units
	// of work. embedded.Config{DB: postgres} is the same wiring on
	// PostgreSQL; add Publisher: rabbitmq to relay to RabbitMQ instead.
	stack, err := embedded.Open(ctx, &embedded.Config{Path: filepath.Join(dir, "shop.db")})
	if err != nil {
		log.Fatal(err)
	}
	defer stack.Close()
	if err := stack.DB.AutoMigrate(&Order{}); err != nil {
		log.Fatal(err)
	}
	// A group's queue, as a consumer of the group declares it.
	if err := dbbus.DeclareGroup(ctx, stack.DB, "billing", "order.*"); err != nil {
		log.Fatal(err)
	}

	err = stack.Units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
		o := &Order{Status: "placed"}
		o.ID = "o-1"
		o.Record(OrderPlaced{OrderID: o.ID})
		return u.Add(o)
	})
	if err != nil {
		log.Fatal(err)
	}
	res, err := stack.Projector.Drain(ctx) // or go stack.Projector.Run(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("relayed:", res.Published)

	msgs, err := stack.Bus.Subscriber().Subscribe(ctx, "billing")
	if err != nil {
		log.Fatal(err)
	}
	m := <-msgs
	env, err := messaging.Decode(m)
	if err != nil {
		log.Fatal(err)
	}
	m.Ack()
	fmt.Println(env.EventType, env.AggregateID, env.AggregateVersion)
	// Output:
	// relayed: 1
	// order.placed o-1 1
}
