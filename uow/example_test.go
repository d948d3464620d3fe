package uow_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

// Order is an aggregate: a GORM model that embeds aggregate.Base.
type Order struct {
	aggregate.Base
	Status     string
	TotalCents int64
}

func (*Order) AggregateType() string { return "order" }

// OrderPaid is a domain event, named in the past tense.
type OrderPaid struct {
	OrderID string `json:"order_id"`
}

func (OrderPaid) EventType() string { return "order.paid" }

// Pay validates, changes state, and records what happened.
func (o *Order) Pay() error {
	if o.Status != "placed" {
		return errors.New("order is not awaiting payment")
	}
	o.Status = "paid"
	o.Record(OrderPaid{OrderID: o.ID})
	return nil
}

// PayOrder loads the order, pays it, and commits the new state together
// with the OrderPaid event. A concurrent change makes Run retry.
func PayOrder(ctx context.Context, units *uow.Manager, id string) error {
	return units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
		order, err := uow.Get[Order](ctx, u, id)
		if err != nil {
			return err
		}
		return order.Pay()
	})
}

type OrderPlaced struct {
	OrderID    string `json:"order_id"`
	TotalCents int64  `json:"total_cents"`
}

func (OrderPlaced) EventType() string { return "order.placed" }

func PlaceOrder(id string, total int64) *Order {
	o := &Order{Status: "placed", TotalCents: total}
	o.ID = id
	o.Record(OrderPlaced{OrderID: id, TotalCents: total})
	return o
}

func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "bento-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// Any PostgreSQL or SQLite *gorm.DB will do.
	db, err := embedded.OpenSQLite(filepath.Join(dir, "shop.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := outbox.Migrate(ctx, db); err != nil { // the outbox_events table
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Order{}); err != nil { // your own tables
		log.Fatal(err)
	}
	units, err := uow.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}

	// The order row and its OrderPlaced event commit in one transaction.
	err = units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
		return u.Add(PlaceOrder("order-1", 2400))
	})
	if err != nil {
		log.Fatal(err)
	}

	// Load, change, commit: the version check guards against lost updates.
	if err := PayOrder(ctx, units, "order-1"); err != nil {
		log.Fatal(err)
	}

	var rows []outbox.Message
	db.Order("id").Find(&rows)
	for _, r := range rows {
		fmt.Println(r.Topic, r.AggregateID, r.AggregateVersion, r.Status, string(r.Payload))
	}
	stats, err := units.Outbox().Stats(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("waiting for the projector:", stats.Pending)
	// Output:
	// order.placed order-1 1 new {"order_id":"order-1","total_cents":2400}
	// order.paid order-1 2 new {"order_id":"order-1"}
	// waiting for the projector: 2
}

// Code that owns a transaction and calls handlers in it (a message inbox,
// an idempotency ledger) takes it with Own: the handlers' units of work join
// it through Join, and their AfterCommit hooks run when Commit succeeds.
func ExampleOwned() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "bento-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := embedded.OpenSQLite(filepath.Join(dir, "shop.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := outbox.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		log.Fatal(err)
	}
	units, err := uow.New(db, &uow.Config{AfterCommit: func(n int) { fmt.Println("hook:", n, "event(s) committed") }})
	if err != nil {
		log.Fatal(err)
	}

	owned := uow.Own(db.Begin())
	defer owned.Rollback()                       // nothing, once committed
	handler := func(ctx context.Context) error { // joins the owner's transaction
		return units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			return u.Add(PlaceOrder("order-7", 990))
		})
	}
	if err := handler(owned.Join(ctx)); err != nil {
		log.Fatal(err)
	}
	fmt.Println("handler returned; committing")
	if err := owned.Commit(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// handler returned; committing
	// hook: 1 event(s) committed
}
