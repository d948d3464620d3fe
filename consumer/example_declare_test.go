package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/rabbitmq"
)

// ExampleDeclare sets a consumer group up on RabbitMQ ahead of its first
// instance, and deletes it once the group is retired. It needs a broker,
// so it is compiled but not run; TestDeclareIsWhatAnInstanceDeclares and
// TestDeleteUndoesDeclare run the same calls.
func ExampleDeclare() {
	ctx := context.Background()
	amqpCfg := &rabbitmq.Config{URL: "amqp://guest:guest@127.0.0.1:5672/", Exchange: "shop.events"}
	cfg := consumer.DefaultConfig("shipping")
	cfg.Partitions = 8 // the Config every instance of the group runs with

	// At deploy, before the first order.paid is relayed: the partition
	// queues behind their hash exchange, and the dead-letter queue, as
	// the instances declare them.
	err := consumer.Declare(ctx, amqpCfg, cfg, OrderPaid{}.EventType())
	if errors.Is(err, rabbitmq.ErrTopologyMismatch) {
		log.Fatalf("the group was declared with another Config: %v", err)
	}
	if err != nil {
		log.Fatal(err)
	}
	// The instances: consumer.NewAMQP(ctx, db, amqpCfg, cfg), Handle, Run.

	// Once the group is retired for good: its queues, with their messages,
	// and its hash exchange.
	deleted, err := consumer.Delete(ctx, amqpCfg, cfg.Group, nil)
	if errors.Is(err, consumer.ErrDeadLettersLeft) {
		log.Fatalf("replay or discard them first, or set DeleteOpts.Force: %v", err)
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted", deleted.Queues, deleted.Exchanges)
}
