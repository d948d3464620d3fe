package consumer_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/messaging"
)

// An operator lists a group's dead letters on the database bus and
// replays one once its cause is fixed: it moves back to the group, and
// only to it, in one transaction.
func ExampleDatabaseDeadLetters() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "bento-dead")
	defer os.RemoveAll(dir)
	db, err := embedded.OpenSQLite(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, _ := db.DB()
	defer sqlDB.Close()
	if err := dbbus.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	// What the group's consumer declares, and a dead letter it left.
	_ = dbbus.DeclareGroup(ctx, db, "billing", "order.*")
	_ = dbbus.DeclareGroup(ctx, db, consumer.DeadLetterQueue("billing"), consumer.DeadLetterTopic("billing"))
	bus, _ := dbbus.New(db, nil)
	defer bus.Close()
	m := message.NewMessage("order-7-paid", []byte(`{"order_id":"7"}`))
	m.Metadata.Set(messaging.MetaEventType, "order.paid")
	m.Metadata.Set(consumer.MetaDeadCause, consumer.CausePermanent)
	m.Metadata.Set(consumer.MetaDeadReason, "no such customer")
	_ = bus.Publish(consumer.DeadLetterTopic("billing"), m)

	dead := consumer.DatabaseDeadLetters(db)
	list, err := dead.List(ctx, "billing", consumer.DeadFilter{}, 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range list {
		fmt.Println(d.MessageID, d.EventType, d.Cause, d.Error)
	}
	replayed, err := dead.Replay(ctx, "billing", consumer.DeadFilter{EventType: "order.paid"})
	if err != nil {
		log.Fatal(err)
	}
	n, _ := dbbus.Depth(ctx, db, "billing")
	fmt.Printf("replayed %d; billing holds %d\n", len(replayed), n)
	// Output:
	// order-7-paid order.paid permanent no such customer
	// replayed 1; billing holds 1
}
