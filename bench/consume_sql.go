package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
)

// sqlPublishBatch is how many messages one Publish writes, for the
// database modes' fill (one multi-row INSERT each).
const sqlPublishBatch = 500

// runWatermillSQL is the "wmsql" mode, the database bus's peer: the
// handler, without the inbox, on a Watermill router over n subscriptions
// of one consumer group of watermill-sql's PostgreSQL subscriber (its
// default schema and offsets adapter), after every message was published
// into a fresh topic table. Like the "plain" mode it has no exactly-once
// effect; it is what a team gets from Watermill's own SQL pub/sub.
func runWatermillSQL(ctx context.Context, b *consumeBed, db *gorm.DB, group string, n int,
	fn consumer.HandlerFunc[Deposited], c *counter) error {
	wlog := watermill.NewSlogLogger(b.e.log)
	sqlDB, err := sql.Open("pgx", b.schema.DSN)
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(n + 2)
	// One topic per run, so each run reads a fresh table from offset 0.
	wtopic := "bench_" + group
	schema := wsql.DefaultPostgreSQLSchema{}
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(sqlDB),
		wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, wlog)
	if err != nil {
		return err
	}
	for lo := 0; lo < len(b.msgs); lo += sqlPublishBatch {
		batch := make([]*message.Message, 0, sqlPublishBatch)
		for _, o := range b.msgs[lo:min(lo+sqlPublishBatch, len(b.msgs))] {
			batch = append(batch, o.Message.Copy())
		}
		if err := pub.Publish(wtopic, batch...); err != nil {
			return fmt.Errorf("watermill-sql publish: %w", err)
		}
	}
	dispatch, err := decodeDispatch(db, fn)
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlog)
	if err != nil {
		return err
	}
	router.AddMiddleware(middleware.Recoverer)
	for i := range n {
		sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(sqlDB), wsql.SubscriberConfig{
			ConsumerGroup:  group,
			SchemaAdapter:  schema,
			OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
			// Its default polls once a second when a read finds nothing;
			// a drain always finds something, so this only shortens the start.
			PollInterval:     10 * time.Millisecond,
			InitializeSchema: true,
		}, wlog)
		if err != nil {
			return err
		}
		defer sub.Close()
		router.AddConsumerHandler(fmt.Sprintf("%s-%d", group, i), wtopic, sub, dispatch)
	}
	return runUntilCounted(ctx, c, []func(context.Context) error{router.Run}, nil)
}
