package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/rabbitmq"
)

// notificationsGroup is the consumer group that hears about orders.
const notificationsGroup = "minishop.notifications"

// groupBindings are minishop's consumer groups and the event types each
// consumes. Every process declares these queues at start-up, before anything
// is relayed: a relay that started before the workers would otherwise publish
// events no queue is bound to yet (they would go to the alternate exchange).
var groupBindings = map[string][]string{
	inventoryGroup:    {"order.placed", "order.cancelled"},
	orderingGroup:     {"stock.rejected"},
	notificationGroup: {"order.paid", "order.payment_failed", "order.cancelled", "checkout.payment_reminder"},
	checkoutGroup: {"order.placed", "order.paid", "order.payment_failed", "order.cancelled",
		"checkout.payment_window_closed", "checkout.payment_retry_due"},
}

// bus is where the projector publishes and consumer groups subscribe.
type bus struct {
	pub         message.Publisher
	newConsumer func(db *gorm.DB, cfg *consumer.Config) (*consumer.Consumer, error)
	close       func()
	// amqp is the broker's config; nil on the database bus.
	amqp *rabbitmq.Config
}

// databaseBus is minishop's wiring of the database bus b on db (the
// embedded default, and PostgreSQL without a broker): each group's
// partition queues, rows in db. An event no group consumes (stock.reserved,
// stock.released) is kept in dbbus.UnroutableGroup, as RabbitMQ parks it
// in the alternate exchange's queue, instead of failing as unroutable: they
// are facts for a future consumer, not bound on purpose, and housekeeping
// deletes them after unroutableRetention.
func databaseBus(ctx context.Context, db *gorm.DB, b *dbbus.Bus) (*bus, error) {
	for group, topics := range groupBindings {
		if err := dbbus.DeclarePartitions(ctx, db, group, consumer.DefaultPartitions, topics...); err != nil {
			return nil, err
		}
	}
	return &bus{
		pub: b,
		newConsumer: func(db *gorm.DB, cfg *consumer.Config) (*consumer.Consumer, error) {
			return consumer.NewDatabase(db, b, cfg)
		},
		close: func() {},
	}, nil
}

// openAMQP connects to RabbitMQ at amqpURL, on the exchange named by
// MINISHOP_EXCHANGE (default minishop.events), and declares every group's
// partition queues.
func openAMQP(ctx context.Context, log *slog.Logger, amqpURL string) (*bus, error) {
	exchange := os.Getenv("MINISHOP_EXCHANGE")
	if exchange == "" {
		exchange = "minishop.events"
	}
	cfg := &rabbitmq.Config{URL: amqpURL, Exchange: exchange, Logger: log}
	for group, topics := range groupBindings {
		if err := consumer.Declare(ctx, cfg, &consumer.Config{Group: group}, topics...); err != nil {
			return nil, err
		}
	}
	pub, err := rabbitmq.NewConfirmPublisher(ctx, cfg) // pipelined confirms: see docs/benchmarks.md
	if err != nil {
		return nil, err
	}
	return &bus{
		pub: pub,
		newConsumer: func(db *gorm.DB, ccfg *consumer.Config) (*consumer.Consumer, error) {
			return consumer.NewAMQP(ctx, db, cfg, ccfg)
		},
		close: func() { _ = pub.Close() },
		amqp:  cfg,
	}, nil
}
