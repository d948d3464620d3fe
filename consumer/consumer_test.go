package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

// OrderPlaced is schema version 2 of order.placed.
type OrderPlaced struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
}

func (OrderPlaced) EventType() string  { return "order.placed" }
func (OrderPlaced) SchemaVersion() int { return 2 }

// OrderPlacedV1 is schema version 1: one "sku:qty" string.
type OrderPlacedV1 struct {
	OrderID string `json:"order_id"`
	Item    string `json:"item"`
}

func (OrderPlacedV1) EventType() string { return "order.placed" }

type OrderPaid struct {
	OrderID string `json:"order_id"`
}

func (OrderPaid) EventType() string { return "order.paid" }

func upcastPlaced(v1 OrderPlacedV1) (OrderPlaced, error) {
	sku, qty, ok := strings.Cut(v1.Item, ":")
	if !ok {
		return OrderPlaced{}, errors.New("item is not sku:qty")
	}
	var n int
	_, err := fmt.Sscan(qty, &n)
	return OrderPlaced{OrderID: v1.OrderID, SKU: sku, Qty: n}, err
}

// suite is a consumer group on a harness with handlers that write effects.
type suite struct {
	*harness
	units *uow.Manager
	reg   *prometheus.Registry
	group string
}

func newSuite(t *testing.T, h *harness) *suite {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, outbox.Migrate(ctx, h.db))
	require.NoError(t, inbox.Migrate(ctx, h.db))
	require.NoError(t, h.db.AutoMigrate(&Effect{}, &Stock{}))
	units, err := uow.New(h.db, nil)
	require.NoError(t, err)
	return &suite{harness: h, units: units, reg: prometheus.NewRegistry(), group: "g" + aggregate.NewID()[16:]}
}

func (s *suite) config() *consumer.Config {
	cfg := consumer.DefaultConfig(s.group)
	cfg.RetryInitialInterval = 5 * time.Millisecond
	cfg.RetryMaxInterval = 20 * time.Millisecond
	cfg.Logger = quiet
	cfg.Registerer = s.reg
	return cfg
}

func (s *suite) effects(t *testing.T) int64 {
	t.Helper()
	var n int64
	require.NoError(t, s.db.Model(&Effect{}).Count(&n).Error)
	return n
}

func (s *suite) counter(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// effectHandler writes one Effect per applied order.placed.
func effectHandler(calls *atomic.Int32) consumer.HandlerFunc[OrderPlaced] {
	return func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
		calls.Add(1)
		return tx.Create(&Effect{MessageID: env.ID}).Error
	}
}

// TestConsumerAppliesDuplicatesOnce delivers messages twice — one after the
// other, and to two consumers of the group at once — and checks that each
// is applied once and every duplicate is acknowledged.
func TestConsumerAppliesDuplicatesOnce(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		var calls atomic.Int32
		for i := 0; i < 2; i++ { // two instances of the group
			c := s.newConsumer(t, s.config())
			require.NoError(t, consumer.Handle(c, effectHandler(&calls)))
			run(t, c)
		}
		var msgs []string
		var originals []*message.Message
		for i := 0; i < 20; i++ {
			m := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: fmt.Sprint(i), SKU: "apple", Qty: 1}, nil)
			msgs, originals = append(msgs, m.UUID), append(originals, m.Copy())
			s.publish(t, "order.placed", m)
			s.publish(t, "order.placed", m.Copy()) // the duplicate races the original
		}
		if h.dedupsHeld {
			// The database bus drops the copies published while it held
			// the original: only those the inbox sees are counted. Send
			// each again once the bus has released it, so that the
			// inbox sees at least 20 duplicates.
			testenv.WaitFor(t, 30*time.Second, "every message applied", func() bool {
				return s.counter(t, "bento_inbox_processed_total") == 20
			})
			dups := s.counter(t, "bento_inbox_duplicates_total")
			for _, m := range originals {
				h.released(t, m.UUID)
				s.publish(t, "order.placed", m.Copy())
			}
			testenv.WaitFor(t, 30*time.Second, "every late duplicate acknowledged", func() bool {
				return s.counter(t, "bento_inbox_duplicates_total") == dups+20
			})
		}
		// Both counters: once (under the full suite's load, on SQLite) the
		// last duplicate was counted a moment before the last original's
		// effect could be read.
		testenv.WaitFor(t, 30*time.Second, "every message applied and every duplicate acknowledged", func() bool {
			return s.counter(t, "bento_inbox_processed_total") == 20 &&
				(h.dedupsHeld || s.counter(t, "bento_inbox_duplicates_total") == 20)
		})
		assert.Equal(t, int64(20), s.effects(t))
		assert.EqualValues(t, 20, calls.Load())
		assert.Equal(t, 20.0, s.counter(t, "bento_inbox_processed_total"))
		var distinct int64
		require.NoError(t, s.db.Model(&Effect{}).Where("message_id IN ?", msgs).Distinct("message_id").Count(&distinct).Error)
		assert.Equal(t, int64(20), distinct)
	})
}

// TestConsumerConcurrency checks that one unpartitioned consumer with
// Subscriptions 4 handles four messages at once (on PostgreSQL each handler waits until all
// four are in flight; SQLite serialises writers, so there they only run
// side by side) and still applies each message once.
func TestConsumerConcurrency(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		const n = 4
		overlap := h.db.Dialector.Name() == "postgres"
		cfg := s.config()
		cfg.Partitions = -1 // one queue, competing subscriptions
		cfg.BatchSize = 0   // DefaultConfig's 100 is for partitions
		cfg.Subscriptions = n
		c := s.newConsumer(t, cfg)
		var inFlight, peak, calls atomic.Int32
		all := make(chan struct{})
		var once sync.Once
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			calls.Add(1)
			now := inFlight.Add(1)
			defer inFlight.Add(-1)
			for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); p = peak.Load() {
			}
			if now == n {
				once.Do(func() { close(all) })
			}
			if overlap {
				select { // hold the message until n are handled at once
				case <-all:
				case <-time.After(10 * time.Second):
					return errors.New("the other subscriptions never took a message")
				}
			}
			return tx.Create(&Effect{MessageID: env.ID}).Error
		}))
		run(t, c)
		for i := range 2 * n {
			s.publish(t, "order.placed", eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: fmt.Sprint(i), SKU: "apple", Qty: 1}, nil))
		}
		testenv.WaitFor(t, 30*time.Second, "every message applied", func() bool { return s.effects(t) == 2*n })
		if overlap {
			assert.EqualValues(t, n, peak.Load(), "messages handled at once")
		}
		assert.EqualValues(t, 2*n, calls.Load(), "each message handled once")
	})
}

// TestConsumerRetriesThenApplies: a handler failing twice, then succeeding,
// applies the message once and dead-letters nothing.
func TestConsumerRetriesThenApplies(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		var calls atomic.Int32
		c := s.newConsumer(t, s.config())
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			n := calls.Add(1)
			if err := tx.Create(&Effect{MessageID: env.ID}).Error; err != nil {
				return err
			}
			if n <= 2 {
				return fmt.Errorf("attempt %d fails", n)
			}
			return nil
		}))
		run(t, c)
		s.publish(t, "order.placed", eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o-1"}, nil))
		testenv.WaitFor(t, 20*time.Second, "the third attempt", func() bool { return s.counter(t, "bento_inbox_processed_total") == 1 })
		assert.EqualValues(t, 3, calls.Load())
		assert.Equal(t, int64(1), s.effects(t))
		var records int64
		require.NoError(t, s.db.Model(&inbox.Record{}).Count(&records).Error)
		assert.Equal(t, int64(1), records)
	})
}

// TestOneDecodePerDelivery: the consumer decodes each delivery once, before
// its inbox: the handler's envelope is the one the message's context
// carries (messaging.EnvelopeFrom), for a single message and in a batch.
func TestOneDecodePerDelivery(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		c := s.newConsumer(t, s.config())
		var shared, handled atomic.Int32
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			if got, ok := messaging.EnvelopeFrom(ctx); ok && got == env {
				shared.Add(1)
			}
			handled.Add(1)
			return tx.Create(&Effect{MessageID: env.ID}).Error
		}))
		run(t, c)
		for v := int64(1); v <= 5; v++ { // versions 1..5 of order o-1
			m, err := messaging.NewMessage(&outbox.Message{ID: aggregate.NewID(), TenantID: "default", Topic: "order.placed",
				AggregateType: "order", AggregateID: "o-1", AggregateVersion: v, SchemaVersion: 2,
				Payload: outbox.JSON(`{"order_id":"o-1","sku":"tea","qty":1}`), OccurredAt: time.Now().UTC()})
			require.NoError(t, err)
			s.publish(t, "order.placed", m)
		}
		testenv.WaitFor(t, 20*time.Second, "five events applied", func() bool { return s.effects(t) == 5 })
		assert.EqualValues(t, 5, handled.Load())
		assert.EqualValues(t, 5, shared.Load(), "each handler got the envelope its context carries")
	})
}

// TestHandlerTxIsTheMessageTransaction: the tx a handler receives is the
// transaction of its message, the one its context carries: a write through
// it is visible through uow.DB within the attempt and rolled back with the
// attempt that fails, so the next attempt starts from nothing.
func TestHandlerTxIsTheMessageTransaction(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		var calls atomic.Int32
		seen := make(chan int64, 2)
		c := s.newConsumer(t, s.config())
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			var before int64
			if err := uow.DB(ctx, nil).Model(&Effect{}).Where("message_id = ?", env.ID).Count(&before).Error; err != nil {
				return err
			}
			seen <- before
			if err := tx.Create(&Effect{MessageID: env.ID}).Error; err != nil {
				return err
			}
			var after int64
			if err := uow.DB(ctx, nil).Model(&Effect{}).Where("message_id = ?", env.ID).Count(&after).Error; err != nil {
				return err
			}
			if after != 1 {
				return consumer.Permanent(fmt.Errorf("the write through tx is not in the context's transaction: %d rows", after))
			}
			if calls.Add(1) == 1 {
				return errors.New("the first attempt fails after writing")
			}
			return nil
		}))
		run(t, c)
		s.publish(t, "order.placed", eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o-1"}, nil))
		testenv.WaitFor(t, 20*time.Second, "the second attempt", func() bool { return s.counter(t, "bento_inbox_processed_total") == 1 })
		assert.EqualValues(t, 2, calls.Load())
		assert.Equal(t, []int64{0, 0}, []int64{<-seen, <-seen}, "each attempt starts without the failed one's write")
		assert.Equal(t, int64(1), s.effects(t))
	})
}

// TestConsumerChainsEventsAtomically consumes order.placed in a handler that
// reserves stock through a unit of work, emitting stock.reserved; its first
// attempt is killed at COMMIT. Once retried: one stock change, one outbox
// row carrying the correlation and causation ids, one inbox record.
func TestConsumerChainsEventsAtomically(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		ctx := context.Background()
		require.NoError(t, s.db.Exec(`CREATE TABLE IF NOT EXISTS targets (id INTEGER PRIMARY KEY)`).Error)
		require.NoError(t, s.db.Exec(`CREATE TABLE IF NOT EXISTS bombs (id INTEGER PRIMARY KEY,
			ref INTEGER REFERENCES targets(id) DEFERRABLE INITIALLY DEFERRED)`).Error)
		require.NoError(t, s.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			st := &Stock{}
			st.ID = "apple"
			return u.Add(st)
		}))
		var attempts atomic.Int32
		c := s.newConsumer(t, s.config())
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			n := attempts.Add(1)
			return s.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
				st, err := uow.Get[Stock](ctx, u, e.SKU)
				if err != nil {
					return err
				}
				st.Reserved += e.Qty
				st.Record(StockReserved{SKU: e.SKU, OrderID: e.OrderID})
				if n == 1 {
					return u.Tx(ctx).Exec("INSERT INTO bombs (id, ref) VALUES (1, 42)").Error
				}
				return nil
			})
		}))
		run(t, c)
		placed := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o-1", SKU: "apple", Qty: 3},
			map[string]string{messaging.MetaCorrelationID: "checkout-7"})
		s.publish(t, "order.placed", placed)
		testenv.WaitFor(t, 20*time.Second, "the retried attempt", func() bool { return s.counter(t, "bento_inbox_processed_total") == 1 })

		assert.EqualValues(t, 2, attempts.Load())
		var st Stock
		require.NoError(t, s.db.Take(&st, "id = ?", "apple").Error)
		assert.Equal(t, 3, st.Reserved)
		assert.Equal(t, int64(2), st.Version)
		var rows []outbox.Message
		require.NoError(t, s.db.Where("topic = 'stock.reserved'").Find(&rows).Error)
		require.Len(t, rows, 1)
		assert.Equal(t, "checkout-7", rows[0].Metadata[messaging.MetaCorrelationID])
		assert.Equal(t, placed.UUID, rows[0].Metadata[messaging.MetaCausationID])
		var records, bombs int64
		require.NoError(t, s.db.Model(&inbox.Record{}).Count(&records).Error)
		require.NoError(t, s.db.Table("bombs").Count(&bombs).Error)
		assert.Equal(t, int64(1), records)
		assert.Equal(t, int64(0), bombs)
	})
}

// TestConsumerDeadLetters: an always-failing handler's message goes to the
// dead-letter destination with its error after the retries while later
// messages are still applied; undecodable messages and unknown event types
// go there at once without reaching a handler.
func TestConsumerDeadLetters(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		cfg := s.config()
		cfg.MaxRetries = 2
		cfg.BatchSize = 1 // attempts counted exactly: a batch's attempt would add one
		var calls atomic.Int32
		var mu sync.Mutex
		perMessage := map[string]int{}
		c := s.newConsumer(t, cfg)
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			calls.Add(1)
			mu.Lock()
			perMessage[e.OrderID]++
			mu.Unlock()
			if e.OrderID == "poison" {
				return errors.New("stock service says no")
			}
			return tx.Create(&Effect{MessageID: env.ID}).Error
		}))
		run(t, c)

		poison := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "poison"}, nil)
		s.publish(t, "order.placed", poison)
		unknown := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "x"}, nil)
		unknown.Metadata.Set(messaging.MetaEventType, "order.exotic") // routed as order.placed, typed otherwise
		s.publish(t, "order.placed", unknown)
		malformed := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "y"}, nil)
		malformed.Payload = []byte(`{"order_id": `)
		s.publish(t, "order.placed", malformed)
		wrongShape := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "z"}, nil)
		wrongShape.Payload = []byte(`{"qty": "three"}`)
		s.publish(t, "order.placed", wrongShape)
		healthy := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "healthy"}, nil)
		s.publish(t, "order.placed", healthy)

		dead := s.deadLetters(t, s.group, 4)
		reasons := map[string]string{}
		for _, m := range dead {
			reasons[m.UUID] = m.Metadata.Get(consumer.MetaDeadReason)
		}
		assert.Contains(t, reasons[poison.UUID], "stock service says no")
		assert.Contains(t, reasons[unknown.UUID], "no handler")
		assert.Contains(t, reasons[malformed.UUID], "malformed")
		assert.Contains(t, reasons[wrongShape.UUID], "malformed payload")
		testenv.WaitFor(t, 10*time.Second, "the healthy message", func() bool { return s.effects(t) == 1 })
		mu.Lock()
		assert.Equal(t, 3, perMessage["poison"], "1 attempt + 2 retries")
		assert.Equal(t, 1, perMessage["healthy"])
		assert.Zero(t, perMessage["x"]+perMessage["y"]+perMessage["z"], "undecodable messages never reach the handler")
		mu.Unlock()
		var records int64
		require.NoError(t, s.db.Model(&inbox.Record{}).Count(&records).Error)
		assert.Equal(t, int64(1), records, "only the applied message is recorded")
	})
}

// TestConsumerUpcasts: a version-1 payload reaches the handler as the
// version-2 type.
func TestConsumerUpcasts(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		cfg := s.config()
		require.NoError(t, messaging.RegisterUpcaster(cfg.Registry, upcastPlaced))
		got := make(chan OrderPlaced, 2)
		c := s.newConsumer(t, cfg)
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			got <- e
			return nil
		}))
		run(t, c)
		s.publish(t, "order.placed", eventMsg(t, "order.placed", 1, OrderPlacedV1{OrderID: "o-9", Item: "tea:4"}, nil))
		s.publish(t, "order.placed", eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o-10", SKU: "coffee", Qty: 1}, nil))
		for _, want := range []OrderPlaced{{OrderID: "o-9", SKU: "tea", Qty: 4}, {OrderID: "o-10", SKU: "coffee", Qty: 1}} {
			select {
			case e := <-got:
				assert.Equal(t, want, e)
			case <-time.After(10 * time.Second):
				t.Fatal("event not handled")
			}
		}
	})
}

// TestConsumerConfig checks the config convention: a Config with only its
// Group and DefaultConfig give the documented defaults, a nil one fails
// naming Group (the one field without a default), and impossible or
// contradictory values fail with ErrInvalidConfig naming each field.
func TestConsumerConfig(t *testing.T) {
	t.Parallel()
	h := memoryHarness(t)
	require.NoError(t, inbox.Migrate(context.Background(), h.db))
	bus := messaging.NewMemoryBus()
	t.Cleanup(func() { _ = bus.Close() })

	c, err := consumer.NewMemory(h.db, bus, &consumer.Config{Group: "zero"})
	require.NoError(t, err)
	got := c.Config()
	assert.Equal(t, 5, got.MaxRetries)
	assert.Equal(t, time.Hour, got.OutageWindow)
	assert.Equal(t, 5*time.Minute, got.GapTimeout)
	assert.Equal(t, 100*time.Millisecond, got.RetryInitialInterval)
	assert.Equal(t, 10*time.Second, got.RetryMaxInterval)
	assert.Equal(t, 30*time.Second, got.CloseTimeout)
	assert.Equal(t, 16, got.Partitions)
	assert.Equal(t, 500, got.DeliveryLimit)
	assert.Equal(t, 3, got.MaxCrashes)
	assert.Equal(t, 10*time.Second, got.TakeoverTime)
	assert.Equal(t, 100, got.BatchSize)
	assert.False(t, got.DisableHoldBack, "hold-back is on")
	assert.Zero(t, got.PartitionConcurrency, "all owned partitions at once")
	assert.Zero(t, got.Subscriptions, "partitioned: no competing subscriptions")
	assert.NotNil(t, got.Registry)
	assert.NotNil(t, got.Logger)
	want := consumer.DefaultConfig("zero")
	assert.Zero(t, want.BatchSize, "DefaultConfig leaves BatchSize, which depends on Partitions, to its default")
	want.BatchSize = consumer.DefaultBatchSize
	want.Registry, want.Logger, got.Registry, got.Logger = nil, nil, nil, nil
	assert.Equal(t, *want, got, "DefaultConfig spells out the defaults")

	c, err = consumer.NewMemory(h.db, bus, &consumer.Config{Group: "flat", Partitions: -1, MaxRetries: -1})
	require.NoError(t, err)
	assert.Equal(t, 1, c.Config().Subscriptions, "unpartitioned: one subscription")
	assert.Equal(t, 1, c.Config().BatchSize, "unpartitioned: each message alone")
	assert.Equal(t, -1, c.Config().MaxRetries, "negative: no retries")

	_, err = consumer.NewMemory(h.db, bus, nil)
	require.ErrorIs(t, err, consumer.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "Group:")

	bad := &consumer.Config{
		Group: "has space", RetryInitialInterval: time.Second, RetryMaxInterval: time.Millisecond,
		Subscriptions: 4, CloseTimeout: -1,
	}
	_, err = consumer.New(h.db, func([]string) (message.Subscriber, error) { return nil, nil }, nil, "", bad)
	require.ErrorIs(t, err, consumer.ErrInvalidConfig)
	for _, f := range []string{"Group:", "RetryMaxInterval:", "Subscriptions:", "CloseTimeout:", "dead-letter"} {
		assert.Contains(t, err.Error(), f)
	}
	for field, cfg := range map[string]*consumer.Config{
		"PartitionConcurrency:": {Group: "g", Partitions: -1, PartitionConcurrency: 2},
		"BatchSize:":            {Group: "g", Partitions: -1, BatchSize: 10},
		"Subscriptions:":        {Group: "g", Partitions: -1, Subscriptions: 1000},
		"TakeoverTime:":         {Group: "g", TakeoverTime: -time.Second},
	} {
		_, err := consumer.NewMemory(h.db, bus, cfg)
		require.ErrorIs(t, err, consumer.ErrInvalidConfig, field)
		assert.Contains(t, err.Error(), field)
	}

	c = h.newConsumer(t, consumer.DefaultConfig("g1"))
	require.NoError(t, consumer.Handle(c, func(context.Context, *gorm.DB, OrderPaid, *messaging.Envelope) error { return nil }))
	require.Error(t, consumer.Handle(c, func(context.Context, *gorm.DB, OrderPaid, *messaging.Envelope) error { return nil }),
		"one handler per event type")
	assert.Equal(t, "bento-dead.g_x", consumer.DeadLetterTopic("g:x"))
}

// TestStoppingConsumerDoesNotDeadLetter stops a consumer while its handler
// is applying a message: the cancelled handler's message must go back to the
// queue and be applied by the next consumer, never to the dead letters.
func TestStoppingConsumerDoesNotDeadLetter(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		entered := make(chan struct{}, 1)
		cfg := s.config()
		cfg.CloseTimeout = time.Second // the handler only returns once cancelled
		first := s.newConsumer(t, cfg)
		require.NoError(t, consumer.Handle(first, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			entered <- struct{}{}
			<-ctx.Done() // shutting down mid-handler
			return ctx.Err()
		}))
		stop := run(t, first)
		msg := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o-1"}, nil)
		s.publish(t, "order.placed", msg)
		select {
		case <-entered:
		case <-time.After(20 * time.Second):
			t.Fatal("the handler never ran")
		}
		stop()

		var calls atomic.Int32
		second := s.newConsumer(t, s.config())
		require.NoError(t, consumer.Handle(second, effectHandler(&calls)))
		run(t, second)
		testenv.WaitFor(t, 30*time.Second, "the message applied by the next consumer", func() bool { return s.effects(t) == 1 })
		assert.EqualValues(t, 1, calls.Load())
		if h.bus != nil {
			assert.Empty(t, s.peekDead(t), "nothing was dead-lettered")
		}
	})
}

// TestNewNeedsInboxMigrate: a consumer over a database without the inbox
// tables is refused at construction with inbox.ErrNotMigrated, not at its
// first message.
func TestNewNeedsInboxMigrate(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		bus := messaging.NewMemoryBus()
		t.Cleanup(func() { _ = bus.Close() })
		_, err := consumer.NewMemory(db, bus, consumer.DefaultConfig("billing"))
		require.ErrorIs(t, err, inbox.ErrNotMigrated)
		require.NoError(t, inbox.Migrate(context.Background(), db))
		_, err = consumer.NewMemory(db, bus, consumer.DefaultConfig("billing"))
		require.NoError(t, err)
	})
}
