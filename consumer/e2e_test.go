package consumer_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/tcpproxy"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/rabbitmq"
	"github.com/bentoevents/bento/uow"
)

// Cart records order.placed events for the end-to-end run.
type Cart struct{ aggregate.Base }

func (*Cart) AggregateType() string { return "cart" }

// TestEndToEndExactlyOnce commits 10,000 events with units of work, relays
// them with two projectors, and consumes them with two instances of one
// consumer group, one of which loses its connection mid-stream (RabbitMQ:
// a TCP proxy is cut; in-memory: the instance is stopped and replaced), so
// messages in flight are redelivered. The handler's effects count exactly
// 10,000.
func TestEndToEndExactlyOnce(t *testing.T) {
	testenv.Stress(t)
	const carts, perCart = 1000, 10
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		ctx := context.Background()
		require.NoError(t, h.db.AutoMigrate(&Cart{}))
		handler := func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			return tx.Create(&Effect{MessageID: env.ID}).Error
		}
		newConsumer := func(amqpCfg *rabbitmq.Config) *consumer.Consumer {
			var c *consumer.Consumer
			if amqpCfg != nil {
				var err error
				c, err = consumer.NewAMQP(ctx, h.db, amqpCfg, s.config())
				require.NoError(t, err)
			} else {
				c = s.newConsumer(t, s.config())
			}
			require.NoError(t, consumer.Handle(c, handler))
			return c
		}

		// Consumer A (the one that loses its connection) and consumer B.
		var cut func()
		var stopA context.CancelFunc
		if h.amqp != nil {
			u, err := url.Parse(h.amqp.URL)
			require.NoError(t, err)
			proxy, err := tcpproxy.Start(u.Host)
			require.NoError(t, err)
			defer proxy.Close()
			viaProxy := *h.amqp
			pu := *u
			pu.Host = proxy.Addr()
			viaProxy.URL = pu.String()
			stopA = run(t, newConsumer(&viaProxy))
			cut = func() {
				proxy.Cut()
				time.AfterFunc(2*time.Second, proxy.Restore)
			}
		} else {
			stopA = run(t, newConsumer(nil))
			cut = func() {
				stopA() // in-flight messages go back to the queue
				run(t, newConsumer(nil))
			}
		}
		run(t, newConsumer(nil))
		_ = stopA

		// Two projectors relay while the units of work commit.
		var pub message.Publisher
		if h.amqp != nil {
			p, err := rabbitmq.NewPublisher(t.Context(), h.amqp)
			require.NoError(t, err)
			defer p.Close()
			pub = p
		} else {
			pub = h.pub
		}
		pctx, stopProjectors := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for i := 0; i < 2; i++ {
			cfg := projector.DefaultConfig()
			cfg.Logger = quiet
			cfg.BatchSize = 200
			cfg.IdleSleep = 50 * time.Millisecond
			cfg.BackoffFloor = 10 * time.Millisecond
			cfg.BackoffCeiling = 100 * time.Millisecond
			p, err := projector.New(s.units.Outbox(), pub, cfg)
			require.NoError(t, err)
			wg.Add(1)
			go func() { defer wg.Done(); assert.NoError(t, p.Run(pctx)) }()
		}
		defer func() { stopProjectors(); wg.Wait() }()

		for i := 0; i < carts; i++ {
			require.NoError(t, s.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
				c := &Cart{}
				c.ID = fmt.Sprintf("cart-%04d", i)
				for j := 0; j < perCart; j++ {
					c.Record(OrderPlaced{OrderID: c.ID, SKU: "apple", Qty: j + 1})
				}
				return u.Add(c)
			}))
			if i == carts/3 {
				testenv.WaitFor(t, 60*time.Second, "consumption to be under way", func() bool { return s.effects(t) > 1000 })
				cut()
			}
		}
		if !testenv.Poll(180*time.Second, func() bool { return s.effects(t) >= carts*perCart }) {
			var statuses []struct {
				Status string
				N      int64
			}
			h.db.Table("outbox_events").Select("status, count(*) AS n").Group("status").Scan(&statuses)
			t.Fatalf("%d of %d effects after 180s; outbox %v; dead letters: %v",
				s.effects(t), carts*perCart, statuses, s.peekDead(t))
		}
		var distinct, records int64
		require.NoError(t, h.db.Model(&Effect{}).Distinct("message_id").Count(&distinct).Error)
		require.NoError(t, h.db.Model(&inbox.Record{}).Count(&records).Error)
		assert.Equal(t, int64(carts*perCart), s.effects(t), "every event applied exactly once")
		assert.Equal(t, int64(carts*perCart), distinct)
		assert.Equal(t, int64(carts*perCart), records)
		t.Logf("%s: duplicates skipped by the inbox: %.0f", h.name, s.counter(t, "bento_inbox_duplicates_total"))
	})
}
