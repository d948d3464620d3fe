package messaging_test

import (
	"context"
	"fmt"
	"time"

	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

func ExampleMemoryBus() {
	bus := messaging.NewMemoryBus()
	defer bus.Close()

	// The billing group's queue receives every order event, from now on.
	if err := bus.DeclareQueue("billing", "order.*"); err != nil {
		panic(err)
	}

	// A relay turns an outbox row into a message and publishes it under its
	// event type.
	row := &outbox.Message{
		ID:               "01JD3ZQ8Y7C1W4K3M5N6P7Q8R9",
		TenantID:         "default",
		Topic:            "order.paid",
		AggregateType:    "order",
		AggregateID:      "o-1",
		AggregateVersion: 3,
		SchemaVersion:    1,
		Payload:          outbox.JSON(`{"order_id":"o-1","amount_cents":1200}`),
		OccurredAt:       time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC),
	}
	msg, err := messaging.NewMessage(row)
	if err != nil {
		panic(err)
	}
	if err := bus.Publish(row.Topic, msg); err != nil {
		panic(err)
	}

	// A consumer of the group decodes and acks it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	messages, err := bus.Subscriber("billing", "order.*").Subscribe(ctx, "")
	if err != nil {
		panic(err)
	}
	m := <-messages
	env, err := messaging.Decode(m)
	if err != nil {
		m.Nack()
		panic(err)
	}
	fmt.Println(env.ID, env.EventType, env.AggregateID, env.AggregateVersion)
	fmt.Println(env.CorrelationID == env.ID, string(env.Payload))
	m.Ack()

	// Nobody is bound to invoice events: the bus parks them in its
	// alternate queue, as RabbitMQ does, where an operator can read them.
	if err := bus.Publish("invoice.sent", msg); err != nil {
		panic(err)
	}
	parked, err := bus.Subscriber(messaging.MemoryUnroutableQueue).Subscribe(ctx, "")
	if err != nil {
		panic(err)
	}
	p := <-parked
	fmt.Println("parked:", p.UUID)
	p.Ack()
	// Output:
	// 01JD3ZQ8Y7C1W4K3M5N6P7Q8R9 order.paid o-1 3
	// true {"order_id":"o-1","amount_cents":1200}
	// parked: 01JD3ZQ8Y7C1W4K3M5N6P7Q8R9
}
