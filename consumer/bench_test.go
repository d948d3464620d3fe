package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
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
	"github.com/bentoevents/bento/rabbitmq"
)

// BenchmarkPartitionedInstances measures how a partitioned group scales out
// on RabbitMQ and PostgreSQL with an I/O-bound handler (it waits 5 ms per
// message): the same 32 quorum partitions handled by 1 and by 4 instances
// of concurrency 1 and 8, and classic ones by 1 instance of concurrency 8,
// each instance with a pool of its own of 10 connections, as
// separate processes would have. The events wait in the queues; the clock
// runs from the start of the instances (their membership settling
// included) until every event is applied. It reports msg/s; compare the
// two in one run:
//
//	go test ./consumer -run '^$' -bench PartitionedInstances -benchtime 2x
func BenchmarkPartitionedInstances(b *testing.B) {
	cases := []struct {
		queue                  rabbitmq.QueueType
		concurrency, instances int
	}{
		{rabbitmq.Quorum, 1, 1}, {rabbitmq.Quorum, 1, 4}, {rabbitmq.Quorum, 8, 1}, {rabbitmq.Quorum, 8, 4},
		{rabbitmq.Classic, 8, 1}, // what the quorum default costs at the CPU ceiling
	}
	for _, tc := range cases {
		name := fmt.Sprintf("queue=%s/concurrency=%d/instances=%d", tc.queue, tc.concurrency, tc.instances)
		b.Run(name, func(b *testing.B) {
			var total time.Duration
			const messages = 400 * 8
			for range b.N {
				total += partitionedRun(b, tc.queue, tc.instances, tc.concurrency, messages)
			}
			b.ReportMetric(float64(messages*b.N)/total.Seconds(), "msg/s")
		})
	}
}

// partitionedRun starts instances consumers of a fresh group, publishes
// messages (over 400 aggregates) and returns how long they took to apply.
func partitionedRun(b *testing.B, queue rabbitmq.QueueType, instances, concurrency, messages int) time.Duration {
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
	amqpCfg := &rabbitmq.Config{URL: ex.URL, Exchange: ex.Name, Logger: quiet}
	spec := consumer.PartitionSpec(ex.Name, &consumer.Config{Group: group, Partitions: partitions, QueueType: queue})
	spec.Patterns = []string{Step{}.EventType()}
	require.NoError(b, rabbitmq.DeclarePartitions(ctx, amqpCfg, spec))
	pub, err := rabbitmq.NewConfirmPublisher(ctx, amqpCfg)
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
		cfg.Partitions, cfg.PartitionConcurrency, cfg.TakeoverTime, cfg.Logger = partitions, concurrency, 2*time.Second, quiet
		cfg.QueueType = queue
		c, err := consumer.NewAMQP(ctx, idb, amqpCfg, cfg)
		require.NoError(b, err)
		require.NoError(b, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e Step, env *messaging.Envelope) error {
			time.Sleep(5 * time.Millisecond)
			return nil
		}))
		go func() { done <- c.Run(runCtx) }()
	}
	testenv.WaitFor(b, 5*time.Minute, "every message applied", func() bool {
		var n int64
		require.NoError(b, db.Raw(`SELECT count(*) FROM inbox_messages WHERE consumer = ?`, group).Scan(&n).Error)
		return n == int64(messages)
	})
	b.StopTimer()
	return time.Since(start)
}

// BenchmarkBatchLatency measures what batches cost in latency at a steady
// 200 and 1,000 events/s: the same 16-partition group on RabbitMQ and
// PostgreSQL, with BatchSize 1, 20 and 100 (BatchWait 0), and 100 with
// BatchWait 5ms, a handler that writes one row, and 3 seconds of events
// published at an even pace. Each
// event carries the time it was published; the handler reports
// publish-to-handler p50 and p99 in ms. Compare them in one run:
//
//	go test ./consumer -run '^$' -bench BatchLatency -benchtime 2x
func BenchmarkBatchLatency(b *testing.B) {
	for _, tc := range []struct {
		rate, size int
		wait       time.Duration
	}{
		{200, 1, 0}, {200, 20, 0}, {200, 100, 0}, {200, 100, 5 * time.Millisecond},
		{1000, 1, 0}, {1000, 20, 0}, {1000, 100, 0}, {1000, 100, 5 * time.Millisecond},
	} {
		b.Run(fmt.Sprintf("rate=%d/batch=%d/wait=%v", tc.rate, tc.size, tc.wait), func(b *testing.B) {
			var all []time.Duration
			for range b.N {
				all = append(all, latencyRun(b, tc.rate, tc.size, tc.wait)...)
			}
			slices.Sort(all)
			b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}

// latencyRun publishes 3 seconds of events at rate to a fresh group
// consumed with BatchSize size and BatchWait wait and returns each one's
// publish-to-handler latency.
func latencyRun(b *testing.B, rate, size int, wait time.Duration) []time.Duration {
	b.StopTimer()
	defer b.StartTimer()
	const partitions = 16
	events := 3 * rate
	ex := testenv.NewExchange(b)
	db, _ := testenv.Postgres(b)
	ctx := context.Background()
	require.NoError(b, inbox.Migrate(ctx, db))
	require.NoError(b, outbox.Migrate(ctx, db))
	require.NoError(b, db.AutoMigrate(&Effect{}))
	group := "lat" + ex.Name[3:]
	ex.Partitioned(group, partitions)
	amqpCfg := &rabbitmq.Config{URL: ex.URL, Exchange: ex.Name, Logger: quiet}
	cfg := consumer.DefaultConfig(group)
	cfg.Partitions, cfg.BatchSize, cfg.BatchWait, cfg.Logger = partitions, size, wait, quiet
	c, err := consumer.NewAMQP(ctx, db, amqpCfg, cfg)
	require.NoError(b, err)
	var (
		mu  sync.Mutex
		lat []time.Duration
	)
	require.NoError(b, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e Step, env *messaging.Envelope) error {
		sent, err := time.Parse(time.RFC3339Nano, env.Metadata["sent_at"])
		if err != nil {
			return consumer.Permanent(err)
		}
		if err := tx.Create(&Effect{MessageID: env.ID}).Error; err != nil {
			return err
		}
		mu.Lock()
		lat = append(lat, time.Since(sent))
		mu.Unlock()
		return nil
	}))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()
	<-c.Running()
	pub, err := rabbitmq.NewPublisher(b.Context(), amqpCfg)
	require.NoError(b, err)
	defer pub.Close()
	b.StartTimer()
	start := time.Now()
	for i := range events {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
		m := stepMsg(b, i%400, int64(i/400+1))
		m.Metadata.Set("sent_at", time.Now().UTC().Format(time.RFC3339Nano))
		require.NoError(b, pub.Publish(Step{}.EventType(), m))
	}
	testenv.WaitFor(b, time.Minute, "every event handled", func() bool {
		var n int64
		require.NoError(b, db.Model(&Effect{}).Count(&n).Error)
		return n == int64(events)
	})
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(lat)
}
