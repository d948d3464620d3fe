package dbbus_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/embedded"
)

func ExampleBus() {
	dir, err := os.MkdirTemp("", "bento-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := embedded.OpenSQLite(filepath.Join(dir, "bento.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, _ := db.DB()
	defer sqlDB.Close()

	ctx := context.Background()
	if err := dbbus.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	bus, err := dbbus.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer bus.Close()

	// The billing group receives every order event.
	if err := dbbus.DeclareGroup(ctx, db, "billing", "order.*"); err != nil {
		log.Fatal(err)
	}
	msgs, err := bus.Subscriber().Subscribe(ctx, "billing")
	if err != nil {
		log.Fatal(err)
	}

	paid := message.NewMessage("01J0000000000000000000PAID", []byte(`{"order_id":"o-42"}`))
	if err := bus.Publish("order.paid", paid); err != nil {
		log.Fatal(err)
	}
	// No group is bound to invoice events: the bus keeps them aside.
	if err := bus.Publish("invoice.sent", message.NewMessage("01J0000000000000000000SENT", []byte(`{}`))); err != nil {
		log.Fatal(err)
	}

	m := <-msgs
	fmt.Println(m.UUID, string(m.Payload))
	m.Ack()

	n, err := dbbus.Depth(ctx, db, dbbus.UnroutableGroup)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("unroutable:", n)
	// Output:
	// 01J0000000000000000000PAID {"order_id":"o-42"}
	// unroutable: 1
}
