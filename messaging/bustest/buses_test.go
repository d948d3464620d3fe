package bustest_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/messaging/bustest"
	"github.com/bentoevents/bento/rabbitmq"
)

// The suite runs on every publisher and subscriber bento ships: the memory
// bus with group and partition subscribers, RabbitMQ with both
// publishers, each with group and partition subscribers, and the database
// bus (package dbbus) on PostgreSQL and SQLite, with group and partition
// subscribers.

// databaseBus returns a Factory whose every Bus is a dbbus.Bus on a fresh
// database of backend b, each group declared with its topics.
func databaseBus(b testenv.Backend) bustest.Factory {
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	return func(t bustest.TB) *bustest.Bus {
		t.Helper()
		tt, ok := t.(testing.TB)
		if !ok {
			t.Fatalf("the database bus Factory needs a testing.TB, got %T", t)
		}
		db := b.Open(tt)
		if err := dbbus.Migrate(tt.Context(), db); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		bus, err := dbbus.New(db, &dbbus.Config{Logger: discard})
		if err != nil {
			t.Fatalf("new bus: %v", err)
		}
		t.Cleanup(func() { _ = bus.Close() })
		return &bustest.Bus{
			Publisher: bus,
			NewSubscriber: func(_ bustest.TB, group string, topics []string) (message.Subscriber, error) {
				if err := dbbus.DeclareGroup(tt.Context(), db, group, topics...); err != nil {
					return nil, err
				}
				return bus.Subscriber(), nil
			},
			OrderedPerTopic: true,
		}
	}
}

// databasePartitions returns a Factory like databaseBus's whose groups are
// split into n partitions (dbbus.DeclarePartitions), each consumed with
// Bus.PartitionSubscriber(prefetch).
func databasePartitions(b testenv.Backend, n, prefetch int) bustest.Factory {
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	return func(t bustest.TB) *bustest.Bus {
		t.Helper()
		tt, ok := t.(testing.TB)
		if !ok {
			t.Fatalf("the database bus Factory needs a testing.TB, got %T", t)
		}
		db := b.Open(tt)
		if err := dbbus.Migrate(tt.Context(), db); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		bus, err := dbbus.New(db, &dbbus.Config{Logger: discard})
		if err != nil {
			t.Fatalf("new bus: %v", err)
		}
		t.Cleanup(func() { _ = bus.Close() })
		return &bustest.Bus{
			Publisher: bus,
			NewSubscriber: func(_ bustest.TB, group string, topics []string) (message.Subscriber, error) {
				if err := dbbus.DeclarePartitions(tt.Context(), db, group, n, topics...); err != nil {
					return nil, err
				}
				return &wholeGroup{sub: bus.PartitionSubscriber(prefetch), n: n}, nil
			},
			OrderedPerTopic:      true, // the suite's messages of one topic share an aggregate
			SingleActiveConsumer: true,
		}
	}
}

func TestDatabaseBusPartitionsConform(t *testing.T) {
	t.Parallel()
	for _, b := range testenv.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			bustest.Run(t, databasePartitions(b, 3, 4))
		})
	}
}

func TestDatabaseBusConforms(t *testing.T) {
	t.Parallel()
	for _, b := range testenv.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			bustest.Run(t, databaseBus(b))
		})
	}
}

// memoryBus is a Factory over a fresh messaging.MemoryBus whose groups are
// plain queues (MemoryBus.Subscriber).
func memoryBus(t bustest.TB) *bustest.Bus {
	bus := messaging.NewMemoryBus()
	t.Cleanup(func() { _ = bus.Close() })
	return &bustest.Bus{
		Publisher: bus,
		NewSubscriber: func(_ bustest.TB, group string, topics []string) (message.Subscriber, error) {
			return bus.Subscriber(group, topics...), nil
		},
		OrderedPerTopic: true,
	}
}

// memoryPartitions returns a Factory over a fresh messaging.MemoryBus
// whose groups are partitioned into n queues (MemoryBus.DeclarePartitions),
// each consumed with MemoryBus.PartitionSubscriber(prefetch).
func memoryPartitions(n, prefetch int) bustest.Factory {
	return func(t bustest.TB) *bustest.Bus {
		bus := messaging.NewMemoryBus()
		t.Cleanup(func() { _ = bus.Close() })
		return &bustest.Bus{
			Publisher: bus,
			NewSubscriber: func(_ bustest.TB, group string, topics []string) (message.Subscriber, error) {
				if err := bus.DeclarePartitions(group, n, topics...); err != nil {
					return nil, err
				}
				return &wholeGroup{sub: bus.PartitionSubscriber(prefetch), n: n}, nil
			},
			OrderedPerTopic: true, // the suite's messages of one topic share an aggregate
			// Each partition queue has a single active consumer, and a
			// consumer of the whole group subscribes to every partition.
			SingleActiveConsumer: true,
		}
	}
}

func TestMemoryBusConforms(t *testing.T) {
	t.Parallel()
	bustest.Run(t, memoryBus)
}

func TestMemoryBusPartitionsConform(t *testing.T) {
	t.Parallel()
	t.Run("Prefetch1", func(t *testing.T) {
		t.Parallel()
		bustest.Run(t, memoryPartitions(3, 1))
	})
	t.Run("Prefetch8", func(t *testing.T) {
		t.Parallel()
		bustest.Run(t, memoryPartitions(3, 8))
	})
}

// wholeGroup subscribes to a whole partitioned group, as a consumer that
// owns every partition does: Subscribe(ctx, group) subscribes sub to each
// of the group's n partition queues and merges their deliveries into one
// channel, closed once all of theirs are.
type wholeGroup struct {
	sub message.Subscriber // Subscribe(ctx, queue) consumes one partition queue
	n   int
	// again subscribes a partition again when its subscription ends while
	// ctx lives: RabbitMQ's ends on a give-back (a Nack).
	again bool
}

func (w *wholeGroup) Subscribe(ctx context.Context, group string) (<-chan *message.Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan *message.Message)
	var wg sync.WaitGroup
	defer func() {
		go func() {
			wg.Wait()
			cancel()
			close(out)
		}()
	}()
	for p := range w.n {
		in, err := w.sub.Subscribe(ctx, messaging.PartitionQueue(group, p))
		if err != nil {
			cancel() // ends the partitions subscribed so far
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				for m := range in {
					select {
					case out <- m:
					case <-ctx.Done():
						m.Nack() // a reader that stopped reading gives it back
					}
				}
				// A give-back (a Nack) ends a RabbitMQ partition
				// subscription: subscribe again, as bento's consumer does,
				// until the context ends or the subscriber is closed.
				if !w.again || ctx.Err() != nil {
					return
				}
				var err error
				if in, err = w.sub.Subscribe(ctx, messaging.PartitionQueue(group, p)); err != nil {
					return
				}
			}
		}()
	}
	return out, nil
}

func (w *wholeGroup) Close() error { return w.sub.Close() }

// amqpBus describes how a RabbitMQ Bus publishes and subscribes.
type amqpBus struct {
	// publisher builds the Bus's publisher.
	publisher func(context.Context, *rabbitmq.Config) (message.Publisher, error)
	// partitions, when positive, makes each group that many partition
	// queues consumed with rabbitmq.NewPartitionSubscriber, prefetch
	// messages at a time; zero means a group queue consumed with
	// rabbitmq.NewSubscriber.
	partitions, prefetch int
}

func plainPublisher(ctx context.Context, cfg *rabbitmq.Config) (message.Publisher, error) {
	return rabbitmq.NewPublisher(ctx, cfg)
}

func confirmPublisher(ctx context.Context, cfg *rabbitmq.Config) (message.Publisher, error) {
	return rabbitmq.NewConfirmPublisher(ctx, cfg)
}

// rabbitMQ returns a Factory whose every Bus has its own exchange on the
// test broker (a testenv.Exchange), deleted with its queues at cleanup. It
// needs the *testing.T that Run hands the Factory.
func rabbitMQ(kind amqpBus) bustest.Factory {
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	return func(t bustest.TB) *bustest.Bus {
		t.Helper()
		tt, ok := t.(testing.TB)
		if !ok {
			t.Fatalf("the RabbitMQ Factory needs a testing.TB, got %T", t)
		}
		ex := testenv.NewExchange(tt)
		cfg := &rabbitmq.Config{URL: ex.URL, Exchange: ex.Name, Logger: discard}
		pub, err := kind.publisher(tt.Context(), cfg)
		if err != nil {
			t.Fatalf("new publisher: %v", err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		b := &bustest.Bus{Publisher: pub, OrderedPerTopic: true}
		if kind.partitions == 0 {
			b.NewSubscriber = func(_ bustest.TB, group string, topics []string) (message.Subscriber, error) {
				ex.Queues(group)
				return rabbitmq.NewSubscriber(tt.Context(), cfg, group, topics...)
			}
			return b
		}
		b.SingleActiveConsumer = true
		b.NewSubscriber = func(_ bustest.TB, group string, topics []string) (message.Subscriber, error) {
			ex.Partitioned(group, kind.partitions)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			sub, err := rabbitmq.NewPartitionSubscriber(ctx, cfg, rabbitmq.PartitionSpec{
				Group: group, Count: kind.partitions, Patterns: topics,
				DeliveryLimit: 20, DeadKey: group + ".dead", Prefetch: kind.prefetch,
			})
			if err != nil {
				return nil, err
			}
			return &wholeGroup{sub: sub, n: kind.partitions, again: true}, nil
		}
		return b
	}
}

func TestRabbitMQConforms(t *testing.T) {
	t.Parallel()
	testenv.RequireAMQP(t)
	for _, tc := range []struct {
		name string
		kind amqpBus
	}{
		{"AMQPPublisher", amqpBus{publisher: plainPublisher}},
		{"ConfirmPublisher", amqpBus{publisher: confirmPublisher}},
		{"AMQPPublisherPartitions", amqpBus{publisher: plainPublisher, partitions: 2, prefetch: 1}},
		{"ConfirmPublisherPartitions", amqpBus{publisher: confirmPublisher, partitions: 2, prefetch: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bustest.Run(t, rabbitMQ(tc.kind))
		})
	}
}
