package consumer_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// Shipment is what the example's consumer writes for each paid order.
type Shipment struct {
	OrderID string `gorm:"primaryKey"`
}

func ExampleConsumer() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, _ := os.MkdirTemp("", "bento-inbox")
	defer os.RemoveAll(dir)
	db, err := embedded.OpenSQLite(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	_ = outbox.Migrate(ctx, db)
	_ = inbox.Migrate(ctx, db)
	_ = db.AutoMigrate(&Shipment{})

	bus := messaging.NewMemoryBus() // rabbitmq.NewSubscriber & co. for RabbitMQ: consumer.NewAMQP
	cfg := consumer.DefaultConfig("shipping")
	cfg.Logger = quiet
	shipping, err := consumer.NewMemory(db, bus, cfg)
	if err != nil {
		log.Fatal(err)
	}
	shipped := make(chan string, 1)
	// The handler runs in the inbox's transaction: its writes (and any unit
	// of work begun with ctx) commit with the inbox record, exactly once.
	err = consumer.Handle(shipping, func(ctx context.Context, tx *gorm.DB, e OrderPaid, env *messaging.Envelope) error {
		if err := tx.Create(&Shipment{OrderID: e.OrderID}).Error; err != nil {
			return err
		}
		shipped <- e.OrderID
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = shipping.Run(ctx) }()
	<-shipping.Running()

	// The same event delivered twice, as at-least-once delivery may.
	msg, _ := messaging.NewMessage(&outbox.Message{
		ID: "01JD3ZQ8Y7C1W4K3M5N6P7Q8R9", TenantID: "default", Topic: "order.paid",
		SchemaVersion: 1, Payload: []byte(`{"order_id":"o-1"}`), OccurredAt: time.Now(),
	})
	_ = bus.Publish("order.paid", msg)
	_ = bus.Publish("order.paid", msg.Copy())

	fmt.Println("shipped", <-shipped)
	// The handler has run; its transaction commits before the message is
	// acked. Wait until both deliveries are acked: the first committed, the
	// duplicate skipped.
	for !bus.Idle() {
		time.Sleep(time.Millisecond)
	}
	cancel()
	var shipments int64
	db.Model(&Shipment{}).Count(&shipments)
	fmt.Println("shipments:", shipments)
	// Output:
	// shipped o-1
	// shipments: 1
}
