package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/examples/minishop/inventory"
	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// groupQueues are the RabbitMQ queues of minishop's consumer groups: each
// group's partitions and dead letters (and the queue of the group itself,
// from before the groups were partitioned). Their names are part of
// minishop's contract, so the test deletes them before and after it runs.
func groupQueues() []string {
	var qs []string
	for group := range groupBindings {
		qs = append(qs, group, group+".dead")
		for p := range consumer.DefaultPartitions {
			qs = append(qs, messaging.PartitionQueue(group, p))
		}
	}
	return qs
}

func deleteQueues(t *testing.T, url string, names ...string) {
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	for _, q := range names {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
}

// TestRelayKilledOnPostgresAndRabbitMQ runs minishop as separate processes
// — serve, two workers and a relay — on PostgreSQL and RabbitMQ, places,
// pays and cancels orders over HTTP, kills the relay with SIGKILL in the
// middle of the stream and starts a new one. Afterwards every sku's
// reserved quantity equals the quantity of its placed-or-paid orders, and
// every paid order has exactly one notification.
func TestRelayKilledOnPostgresAndRabbitMQ(t *testing.T) {
	testenv.Stress(t)
	ex := testenv.NewExchange(t)
	amqpURL, exchange := ex.URL, ex.Name
	db, dsn := testenv.Postgres(t)
	deleteQueues(t, amqpURL, groupQueues()...) // left by an earlier run
	ex.Queues(groupQueues()...)
	for group := range groupBindings {
		ex.Partitioned(group, consumer.DefaultPartitions)
	}
	relayKilled(t, db, []string{"DATABASE_URL=" + dsn, "AMQP_URL=" + amqpURL, "MINISHOP_EXCHANGE=" + exchange})
}

// TestRelayKilledOnPostgresWithoutBroker is
// TestRelayKilledOnPostgresAndRabbitMQ on PostgreSQL alone: the serve,
// worker and relay processes share the database bus.
func TestRelayKilledOnPostgresWithoutBroker(t *testing.T) {
	testenv.Stress(t)
	db, dsn := testenv.Postgres(t)
	relayKilled(t, db, []string{"DATABASE_URL=" + dsn, "AMQP_URL="})
}

// relayKilled runs minishop as separate processes with env (serve, two
// workers, a relay) on db, places, pays and cancels orders over HTTP,
// kills the relay with SIGKILL mid-stream and starts a new one, and checks
// the invariants once everything is applied.
func relayKilled(t *testing.T, db *gorm.DB, env []string) {
	t.Helper()
	api := start(t, env, "-addr", "127.0.0.1:0", "serve")
	start(t, env, "worker")
	start(t, env, "worker")
	relay := start(t, env, "relay")

	const orders = 120
	skus := []string{"apple", "banana", "coffee", "tea"}
	rng := rand.New(rand.NewPCG(7, 11))
	var (
		mu  sync.Mutex
		ids []string
		wg  sync.WaitGroup
	)
	bodies := make([]string, orders)
	for i := range bodies {
		var lines []string
		for j := 0; j < 1+rng.IntN(3); j++ {
			lines = append(lines, fmt.Sprintf(`{"sku":%q,"qty":%d}`, skus[rng.IntN(len(skus))], 1+rng.IntN(5)))
		}
		bodies[i] = fmt.Sprintf(`{"customer_id":"c%d","items":[%s]}`, i, strings.Join(lines, ","))
	}
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < orders; i += 4 {
				r := call(t, "POST", api.url+"/orders", bodies[i], nil)
				if !assert.Equal(t, 201, r.status, "%s", r.body) {
					return
				}
				id := r.json(t)["id"].(string)
				switch i % 4 {
				case 1, 2:
					assert.Equal(t, 200, call(t, "POST", api.url+"/orders/"+id+"/pay", "", nil).status)
				case 3:
					assert.Equal(t, 200, call(t, "POST", api.url+"/orders/"+id+"/cancel", "", nil).status)
				}
				mu.Lock()
				ids = append(ids, id)
				n := len(ids)
				mu.Unlock()
				if n == orders/3 {
					relay.kill() // mid-stream, between a publish and its mark or not
					relay = start(t, env, "relay")
				}
			}
		}(w)
	}
	wg.Wait()
	require.Len(t, ids, orders)

	// Wait until the outbox is relayed and both groups have applied every
	// event they subscribe to (their inbox records), then check. Checking
	// the invariants alone can pass too early: an order placed and
	// cancelled whose reservation and release are both still in flight
	// leaves the sums right for a moment.
	settled := testenv.Poll(120*time.Second, func() bool {
		var pending int64
		require.NoError(t, db.Table("outbox_events").Where("status <> 'sent'").Count(&pending).Error)
		return pending == 0 && caughtUp(t, db) && checkInvariants(t, db, false)
	})
	if !settled {
		var statuses []struct {
			Status string
			Topic  string
			N      int64
		}
		db.Table("outbox_events").Select("status, topic, count(*) AS n").Group("status, topic").Scan(&statuses)
		checkInvariants(t, db, true)
		t.Fatalf("not settled after 120s; outbox %+v\nrelay log:\n%s", statuses, relay.log())
	}
	checkInvariants(t, db, true)
	var dead int64
	require.NoError(t, db.Table("outbox_events").Where("status = 'dead'").Count(&dead).Error)
	assert.Zero(t, dead)
}

// caughtUp reports whether each consumer group has an inbox record for
// every event of the topics it handles.
func caughtUp(t *testing.T, db *gorm.DB) bool {
	t.Helper()
	for group, topics := range groupBindings {
		var events, applied int64
		require.NoError(t, db.Table("outbox_events").Where("topic IN ?", topics).Count(&events).Error)
		require.NoError(t, db.Table("inbox_messages").Where("consumer = ?", group).Count(&applied).Error)
		if applied < events {
			return false
		}
	}
	return true
}

// checkInvariants compares stock reservations and notifications with the
// orders; with strict it reports every difference.
func checkInvariants(t *testing.T, db *gorm.DB, strict bool) bool {
	t.Helper()
	ctx := context.Background()
	var orders []order.Order
	require.NoError(t, db.WithContext(ctx).Find(&orders).Error)
	want := map[string]int64{}
	paid := map[string]bool{}
	for _, o := range orders {
		if o.Status == order.StatusPlaced || o.Status == order.StatusPaid {
			for _, it := range o.Items {
				want[it.SKU] += int64(it.Qty)
			}
		}
		if o.Status == order.StatusPaid {
			paid[o.ID] = true
		}
	}
	ok := true
	var stocks []inventory.Stock
	require.NoError(t, db.WithContext(ctx).Find(&stocks).Error)
	for _, s := range stocks {
		if s.Reserved != want[s.ID] {
			ok = false
			if strict {
				t.Errorf("sku %s: reserved %d, placed-or-paid orders hold %d", s.ID, s.Reserved, want[s.ID])
			}
		}
	}
	var notes []Notification
	require.NoError(t, db.WithContext(ctx).Find(&notes).Error)
	perOrder := map[string]int{}
	for _, n := range notes {
		perOrder[n.OrderID]++
	}
	for id := range paid {
		if perOrder[id] != 1 {
			ok = false
			if strict {
				t.Errorf("paid order %s has %d notifications", id, perOrder[id])
			}
		}
	}
	for id, n := range perOrder {
		if !paid[id] {
			ok = false
			if strict {
				t.Errorf("order %s is not paid but has %d notifications", id, n)
			}
		}
	}
	return ok
}
