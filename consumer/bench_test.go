package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// BenchmarkPartitionedInstances measures how a partitioned group scales out
// on RabbitMQ and PostgreSQL with an I/O-bound handler (it waits 5 ms per
// message): the same 32 partitions handled by 1 and by 4 instances of
// concurrency 1 and 8, each with a pool of its own of 10 connections, as
// separate processes would have. The events wait in the queues; the clock
// runs from the start of the instances (their membership settling
// included) until every event is applied. It reports msg/s; compare the
// two in one run:
//
//	go test ./consumer -run '^$' -bench PartitionedInstances -benchtime 2x
func BenchmarkPartitionedInstances(b *testing.B) {
	for _, concurrency := range []int{1, 8} {
		for _, instances := range []int{1, 4} {
			b.Run(fmt.Sprintf("concurrency=%d/instances=%d", concurrency, instances), func(b *testing.B) {
				var total time.Duration
				const messages = 400 * 8
				for range b.N {
					total += partitionedRun(b, instances, concurrency, messages)
				}
				b.ReportMetric(float64(messages*b.N)/total.Seconds(), "msg/s")
			})
		}
	}
}

// partitionedRun starts instances consumers of a fresh group, publishes
// messages (over 400 aggregates) and returns how long they took to apply.
func partitionedRun(b *testing.B, instances, concurrency, messages int) time.Duration {
	b.StopTimer()
	defer b.StartTimer()
	ex := testenv.NewExchange(b)
	db, dsn := testenv.Postgres(b)
	ctx := context.Background()
	require.NoError(b, inbox.Migrate(ctx, db))
	require.NoError(b, outbox.Migrate(ctx, db))
	require.NoError(b, db.AutoMigrate(&Effect{}))
	group := "bench" + ex.Name[3:]
	const partitions = 32
	ex.Partitioned(group, partitions)
	amqpCfg := &messaging.AMQPConfig{URL: ex.URL, Exchange: ex.Name, Logger: quiet}
	spec := consumer.PartitionSpec(ex.Name, &consumer.Config{Group: group, Partitions: partitions})
	spec.Patterns = []string{Step{}.EventType()}
	require.NoError(b, messaging.DeclarePartitions(ctx, amqpCfg, spec))
	pub, err := messaging.NewConfirmPublisher(amqpCfg)
	require.NoError(b, err)
	defer pub.Close()
	for v := range messages / 400 { // a batch per version: pipelined confirms
		batch := make([]*message.Message, 400)
		for a := range batch {
			batch[a] = stepMsg(b, a, int64(v+1))
		}
		require.NoError(b, pub.Publish(Step{}.EventType(), batch...))
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, instances)
	defer func() {
		stop()
		for range instances {
			<-done
		}
	}()
	start := time.Now()
	b.StartTimer()
	for range instances {
		idb, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
		require.NoError(b, err)
		sqlDB, _ := idb.DB()
		sqlDB.SetMaxOpenConns(10)
		defer sqlDB.Close()
		cfg := consumer.DefaultConfig(group)
		cfg.Partitions, cfg.Concurrency, cfg.TakeoverTime, cfg.Logger = partitions, concurrency, 2*time.Second, quiet
		c, err := consumer.NewAMQP(ctx, idb, amqpCfg, cfg)
		require.NoError(b, err)
		require.NoError(b, consumer.Handle(c, func(ctx context.Context, e Step, env *messaging.Envelope) error {
			time.Sleep(5 * time.Millisecond)
			return nil
		}))
		go func() { done <- c.Run(runCtx) }()
	}
	waitFor(b, 5*time.Minute, "every message applied", func() bool {
		var n int64
		require.NoError(b, db.Raw(`SELECT count(*) FROM inbox_messages WHERE consumer = ?`, group).Scan(&n).Error)
		return n == int64(messages)
	})
	b.StopTimer()
	return time.Since(start)
}
