package consumer_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/rabbitmq"
)

var quiet = slog.New(slog.DiscardHandler)

// harness is a database and a bus a consumer suite runs on.
type harness struct {
	name string
	db   *gorm.DB
	// newConsumer builds a consumer of cfg.Group.
	newConsumer func(t *testing.T, cfg *consumer.Config) *consumer.Consumer
	// publish sends msg with routing key topic.
	publish func(t *testing.T, topic string, msg *message.Message)
	// deadLetters waits for n dead letters of group and returns them with
	// any others there are.
	deadLetters func(t *testing.T, group string, n int) []*message.Message
	// amqp is the broker config (nil on the in-memory bus).
	amqp *rabbitmq.Config
	// bus is the in-memory bus (nil on RabbitMQ and the database bus).
	bus *messaging.MemoryBus
	// dbus is the database bus (nil on the other buses).
	dbus *dbbus.Bus
	// pub publishes to the bus, on the in-memory and database buses (nil
	// on RabbitMQ, whose tests choose their publisher).
	pub message.Publisher
	// system is the messaging.system attribute of the bus's spans.
	system string
	// declarePartitions declares cfg's partition queues, bound to
	// patterns, before a consumer runs.
	declarePartitions func(t *testing.T, cfg *consumer.Config, patterns ...string)
	// dedupsHeld reports that the bus itself drops a publish of a message
	// (by UUID and topic) it still holds: the database bus does, so a
	// duplicate published before the original was acked never reaches the
	// inbox. Tests of the inbox's deduplication wait for released first.
	dedupsHeld bool
}

// released waits until the bus holds no delivery of the message with id:
// on a bus that drops a publish of a message it still holds (dedupsHeld),
// a copy published after it returns is delivered again. Other buses
// deliver every publish; it returns at once.
func (h *harness) released(t *testing.T, id string) {
	t.Helper()
	if !h.dedupsHeld {
		return
	}
	testenv.WaitFor(t, 20*time.Second, "the bus to release message "+id, func() bool {
		var n int64
		require.NoError(t, h.db.Raw(`SELECT count(*) FROM dbbus_messages WHERE id = ?`, id).Scan(&n).Error)
		return n == 0
	})
}

// harnesses returns RabbitMQ with PostgreSQL, the in-memory bus with
// SQLite, and the database bus on PostgreSQL and on SQLite.
func harnesses() map[string]func(t *testing.T) *harness {
	return map[string]func(t *testing.T) *harness{
		"rabbitmq+postgres": rabbitHarness,
		"memory+sqlite":     memoryHarness,
		"dbbus+postgres": func(t *testing.T) *harness {
			db, _ := testenv.Postgres(t)
			return databaseHarness(t, "dbbus+postgres", db)
		},
		"dbbus+sqlite": func(t *testing.T) *harness { return databaseHarness(t, "dbbus+sqlite", testenv.SQLite(t)) },
	}
}

func forEachHarness(t *testing.T, fn func(t *testing.T, h *harness)) {
	for name, mk := range harnesses() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, mk(t))
		})
	}
}

func memoryHarness(t *testing.T) *harness {
	db := testenv.SQLite(t)
	bus := messaging.NewMemoryBus()
	t.Cleanup(func() { _ = bus.Close() })
	return &harness{
		name:   "memory+sqlite",
		db:     db,
		bus:    bus,
		pub:    bus,
		system: "bento_memory",
		declarePartitions: func(t *testing.T, cfg *consumer.Config, patterns ...string) {
			require.NoError(t, bus.DeclarePartitions(cfg.Group, cfg.Partitions, patterns...))
		},
		newConsumer: func(t *testing.T, cfg *consumer.Config) *consumer.Consumer {
			c, err := consumer.NewMemory(db, bus, cfg)
			require.NoError(t, err)
			return c
		},
		publish: func(t *testing.T, topic string, msg *message.Message) {
			require.NoError(t, bus.Publish(topic, msg))
		},
		deadLetters: func(t *testing.T, group string, n int) []*message.Message {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			msgs, err := bus.Subscriber(group+".dead", consumer.DeadLetterTopic(group)).Subscribe(ctx, "")
			require.NoError(t, err)
			return takeDead(t, ctx, msgs, n)
		},
	}
}

// databaseHarness is the database bus on db, which also holds the inbox.
func databaseHarness(t *testing.T, name string, db *gorm.DB) *harness {
	require.NoError(t, dbbus.Migrate(t.Context(), db))
	bus, err := dbbus.New(db, &dbbus.Config{Logger: quiet, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = bus.Close() })
	return &harness{
		name:   name,
		db:     db,
		dbus:   bus,
		pub:    bus,
		system: "bento_database",
		// Publish drops a message it still holds: see released.
		dedupsHeld: true,
		declarePartitions: func(t *testing.T, cfg *consumer.Config, patterns ...string) {
			require.NoError(t, dbbus.DeclarePartitions(t.Context(), db, cfg.Group, cfg.Partitions, patterns...))
		},
		newConsumer: func(t *testing.T, cfg *consumer.Config) *consumer.Consumer {
			c, err := consumer.NewDatabase(db, bus, cfg)
			require.NoError(t, err)
			return c
		},
		publish: func(t *testing.T, topic string, msg *message.Message) {
			require.NoError(t, bus.Publish(topic, msg))
		},
		deadLetters: func(t *testing.T, group string, n int) []*message.Message {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			sub := bus.Subscriber()
			defer sub.Close()
			msgs, err := sub.Subscribe(ctx, consumer.DeadLetterQueue(group))
			require.NoError(t, err)
			out := takeDead(t, ctx, msgs, n)
			for _, m := range out {
				// A delivered message's context ends once it is settled,
				// and the database bus publishes under the message's
				// context: the tests replay these.
				m.SetContext(context.Background())
			}
			return out
		},
	}
}

// takeDead acks and returns the dead letters msgs delivers: at least n,
// and any others that arrive within 200 ms after the n-th.
func takeDead(t *testing.T, ctx context.Context, msgs <-chan *message.Message, n int) []*message.Message {
	t.Helper()
	var out []*message.Message
	for {
		idle := time.After(200 * time.Millisecond) // then what else is there
		if len(out) < n {
			idle = nil
		}
		select {
		case m := <-msgs:
			m.Ack()
			out = append(out, m)
		case <-idle:
			return out
		case <-ctx.Done():
			t.Fatalf("%d of %d dead letters arrived", len(out), n)
		}
	}
}

func rabbitHarness(t *testing.T) *harness {
	ex := testenv.NewExchange(t)
	u := ex.URL
	db, _ := testenv.Postgres(t)
	cfg := &rabbitmq.Config{URL: u, Exchange: ex.Name, Logger: quiet}
	pub, err := rabbitmq.NewPublisher(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return &harness{
		name:   "rabbitmq+postgres",
		db:     db,
		amqp:   cfg,
		system: "rabbitmq",
		declarePartitions: func(t *testing.T, ccfg *consumer.Config, patterns ...string) {
			spec := consumer.PartitionSpec(cfg.Exchange, ccfg)
			spec.Patterns = patterns
			require.NoError(t, rabbitmq.DeclarePartitions(t.Context(), cfg, spec))
		},
		newConsumer: func(t *testing.T, ccfg *consumer.Config) *consumer.Consumer {
			ex.Queues(ccfg.Group, ccfg.Group+".dead")
			ex.Partitioned(ccfg.Group, ccfg.Partitions)
			c, err := consumer.NewAMQP(context.Background(), db, cfg, ccfg)
			require.NoError(t, err)
			return c
		},
		publish: func(t *testing.T, topic string, msg *message.Message) {
			require.NoError(t, pub.Publish(topic, msg))
		},
		deadLetters: func(t *testing.T, group string, n int) []*message.Message {
			conn, err := amqp.Dial(u)
			require.NoError(t, err)
			defer conn.Close()
			ch, err := conn.Channel()
			require.NoError(t, err)
			var out []*message.Message
			testenv.WaitFor(t, 20*time.Second, "dead letters", func() bool {
				for {
					d, ok, err := ch.Get(group+".dead", true)
					require.NoError(t, err)
					if !ok {
						break
					}
					m := message.NewMessage(d.MessageId, d.Body)
					for k, v := range d.Headers {
						if s, ok := v.(string); ok {
							m.Metadata.Set(k, s)
						}
					}
					out = append(out, m)
				}
				return len(out) >= n
			})
			return out
		},
	}
}

// peekDead returns up to 3 dead-letter reasons of the suite's group without
// waiting (in-memory bus only).
func (s *suite) peekDead(t *testing.T) []string {
	if s.bus == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := s.bus.Subscriber(s.group+".dead", consumer.DeadLetterTopic(s.group)).Subscribe(ctx, "")
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for len(out) < 3 {
		select {
		case m := <-msgs:
			out = append(out, m.Metadata.Get(consumer.MetaDeadReason))
			m.Nack()
		case <-time.After(200 * time.Millisecond):
			return out
		}
	}
	return out
}

// run runs c until the test ends, returning once it is subscribed.
func run(t *testing.T, c *consumer.Consumer) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-c.Running():
	case err := <-done:
		t.Fatalf("consumer stopped: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("consumer did not start")
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			require.NoError(t, <-done)
		}
	}
	t.Cleanup(stop)
	return stop
}

// eventMsg builds the message a projector would publish for an event.
func eventMsg(t *testing.T, topic string, version int, payload any, meta map[string]string) *message.Message {
	t.Helper()
	body, err := json.Marshal(payload)
	require.NoError(t, err)
	m, err := messaging.NewMessage(&outbox.Message{
		ID: aggregate.NewID(), TenantID: "default", Topic: topic, AggregateType: "order",
		AggregateID: "o-1", AggregateVersion: 1, SchemaVersion: version, Payload: body,
		Metadata: meta, OccurredAt: time.Now().UTC(),
	})
	require.NoError(t, err)
	return m
}
