package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// peerMaxEvents caps the events Watermill's forwarder relays per run: it
// moves about a thousand a second, so it is compared by rate.
const peerMaxEvents = 20000

// forwarderTopic is the watermill-sql topic (table "watermill_outbox") the
// forwarder reads its envelopes from.
const forwarderTopic = "outbox"

// gormExec lets watermill-sql's publisher write through the GORM
// transaction of a unit of work.
type gormExec struct{ pool gorm.ConnPool }

func (g gormExec) ExecContext(ctx context.Context, q string, a ...any) (wsql.Result, error) {
	return g.pool.ExecContext(ctx, q, a...)
}

func (g gormExec) QueryContext(ctx context.Context, q string, a ...any) (wsql.Rows, error) {
	return g.pool.QueryContext(ctx, q, a...)
}

// runPeer times Watermill's own outbox: the first min(N, 20000) events of
// the backlog, as the same watermill messages bento publishes, written
// through watermill-sql's publisher wrapped in forwarder.NewPublisher inside
// transactions (not timed), then relayed by forwarder.NewForwarder from a
// watermill-sql subscriber to a watermill-amqp publisher with confirms. The
// time runs from starting the forwarder until the queue holds them all.
func runPeer(ctx context.Context, e *env, b *backlog) (drainRun, error) {
	n := min(b.n, peerMaxEvents)
	wlog := watermill.NewSlogLogger(e.log)
	sqlDB, err := sql.Open("pgx", b.schema.DSN)
	if err != nil {
		return drainRun{}, err
	}
	defer sqlDB.Close()
	// A fresh consumer group and tables per measurement.
	for _, t := range []string{`"watermill_` + forwarderTopic + `"`, `"watermill_offsets_` + forwarderTopic + `"`} {
		if _, err := sqlDB.ExecContext(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			return drainRun{}, err
		}
	}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(sqlDB), wsql.SubscriberConfig{
		ConsumerGroup:    "bench",
		SchemaAdapter:    wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
	}, wlog)
	if err != nil {
		return drainRun{}, err
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize(forwarderTopic); err != nil {
		return drainRun{}, fmt.Errorf("initialize watermill-sql schema: %w", err)
	}
	if err := writePeerOutbox(ctx, b.db, wlog, n); err != nil {
		return drainRun{}, err
	}
	if _, err := sqlDB.ExecContext(ctx, "ANALYZE"); err != nil {
		return drainRun{}, err
	}
	if _, err := sqlDB.ExecContext(ctx, "CHECKPOINT"); err != nil {
		return drainRun{}, err
	}

	names := newAMQPNames()
	defer func() {
		if err := e.deleteTopology(names); err != nil {
			e.log.Warn("cleanup", "err", err)
		}
	}()
	if err := declarePlainTopology(e, names); err != nil {
		return drainRun{}, err
	}
	cfg := wamqp.NewDurablePubSubConfig(e.amqpURL, nil)
	cfg.Exchange = wamqp.ExchangeConfig{GenerateName: func(string) string { return names.Exchange }, Type: "topic", Durable: true}
	cfg.Publish.GenerateRoutingKey = func(t string) string { return t }
	cfg.Publish.ConfirmDelivery, cfg.Publish.ChannelPoolSize = true, 16
	pub, err := wamqp.NewPublisher(cfg, wlog)
	if err != nil {
		return drainRun{}, err
	}
	defer pub.Close()
	fwd, err := forwarder.NewForwarder(sub, pub, wlog, forwarder.Config{ForwarderTopic: forwarderTopic, CloseTimeout: 5 * time.Second})
	if err != nil {
		return drainRun{}, err
	}

	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	runErr := make(chan error, 1)
	start := time.Now()
	go func() { runErr <- fwd.Run(ctx) }()
	_, waitErr := e.waitDepth(ctx, names.Queue, n, 10*time.Minute)
	elapsed := time.Since(start)
	_ = fwd.Close()
	if err := <-runErr; err != nil && waitErr == nil {
		waitErr = fmt.Errorf("forwarder: %w", err)
	}
	if waitErr != nil {
		return drainRun{}, waitErr
	}
	return newDrainRun(n, elapsed), nil
}

// writePeerOutbox writes the first n events of the backlog into
// watermill-sql's outbox table: 5,000 per transaction, 500 per Publish (one
// multi-row INSERT each).
func writePeerOutbox(ctx context.Context, db *gorm.DB, wlog watermill.LoggerAdapter, n int) error {
	var rows []*outbox.Message
	if err := db.WithContext(ctx).Table(backlogTable).Order("id").Limit(n).Find(&rows).Error; err != nil {
		return err
	}
	msgs := make([]*message.Message, len(rows))
	for i, r := range rows {
		m, err := messaging.NewMessage(r)
		if err != nil {
			return err
		}
		msgs[i] = m
	}
	const perTx, perPublish = 5000, 500
	for lo := 0; lo < len(msgs); lo += perTx {
		txMsgs := msgs[lo:min(lo+perTx, len(msgs))]
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			sqlPub, err := wsql.NewPublisher(gormExec{tx.Statement.ConnPool},
				wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, wlog)
			if err != nil {
				return err
			}
			pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic})
			for i := 0; i < len(txMsgs); i += perPublish {
				if err := pub.Publish(topic, txMsgs[i:min(i+perPublish, len(txMsgs))]...); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("write watermill outbox: %w", err)
		}
	}
	return nil
}

// declarePlainTopology declares the durable topic exchange (no arguments,
// as watermill-amqp declares it) and the queue bound to the events' topic.
func declarePlainTopology(e *env, n amqpNames) error {
	return e.withChannel(func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(n.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(n.Queue, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(n.Queue, topic, n.Exchange, false, nil)
	})
}
