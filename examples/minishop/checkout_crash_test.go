package main

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/internal/embeddb"
	"github.com/bentoevents/bento/internal/testenv"
)

// TestTimeoutsFallDueAcrossKills: on the embedded default, on PostgreSQL
// without a broker and on PostgreSQL with RabbitMQ, orders are placed with a two-second payment
// window and about half are paid at random moments around their deadline,
// while minishop is killed with SIGKILL as the timeouts fall due, twice.
// After a restart every order ends paid or cancelled for payment_timeout:
// no due timeout is lost; none took effect twice (one cancellation notice
// per cancelled order); and no order whose payment committed was
// cancelled, since a timeout cancels only a placed order.
func TestTimeoutsFallDueAcrossKills(t *testing.T) {
	// Kills and restarts of three stacks, one after the other: in the
	// non-race pass, not beside the race pass's other crash tests.
	testenv.Stress(t)
	t.Run("embedded", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "minishop.db")
		db, err := embeddb.Open(path, nil)
		require.NoError(t, err)
		defer func() { sqlDB, _ := db.DB(); _ = sqlDB.Close() }()
		timeoutsAcrossKills(t, db, []string{"DATABASE_URL=", "AMQP_URL="}, "-db", path)
	})
	t.Run("postgres", func(t *testing.T) {
		db, dsn := testenv.Postgres(t)
		timeoutsAcrossKills(t, db, []string{"DATABASE_URL=" + dsn, "AMQP_URL="})
	})
	t.Run("postgres+rabbitmq", func(t *testing.T) {
		ex := testenv.NewExchange(t)
		db, dsn := testenv.Postgres(t)
		deleteQueues(t, ex.URL, groupQueues()...)
		ex.Queues(groupQueues()...)
		for group := range groupBindings {
			ex.Partitioned(group, consumer.DefaultPartitions)
		}
		timeoutsAcrossKills(t, db, []string{"DATABASE_URL=" + dsn, "AMQP_URL=" + ex.URL, "MINISHOP_EXCHANGE=" + ex.Name})
	})
}

func timeoutsAcrossKills(t *testing.T, db *gorm.DB, env []string, args ...string) {
	const (
		window = 2 * time.Second
		orders = 30
	)
	args = append(args, "-addr", "127.0.0.1:0", "-lease", crashLease.String(), "-payment-window", window.String())
	client := &http.Client{Timeout: 10 * time.Second}
	var (
		mu   sync.Mutex
		paid = map[string]bool{} // orders whose payment was answered 200
		all  []string
	)
	for round := range 2 {
		p := start(t, env, args...)
		var wg sync.WaitGroup
		for i := range orders / 2 {
			body := fmt.Sprintf(`{"customer_id":"k%d-%d","items":[{"sku":"tea","qty":1}]}`, round, i)
			res, err := client.Post(p.url+"/orders", "application/json", strings.NewReader(body))
			require.NoError(t, err)
			r := response{status: res.StatusCode}
			_ = res.Body.Close()
			require.Equal(t, 201, r.status)
			id := strings.TrimPrefix(res.Header.Get("Location"), "/orders/")
			all = append(all, id)
			if i%2 == 0 {
				continue // never paid
			}
			wg.Add(1)
			go func() { // paid around its deadline, racing its timeout
				defer wg.Done()
				time.Sleep(window - 500*time.Millisecond + rand.N(time.Second))
				res, err := client.Post(p.url+"/orders/"+id+"/pay", "application/json", strings.NewReader(`{"card":"4242-4242-4242-4242"}`))
				if err != nil {
					return // killed first
				}
				_ = res.Body.Close()
				if res.StatusCode == http.StatusOK {
					mu.Lock()
					paid[id] = true
					mu.Unlock()
				}
			}()
		}
		time.Sleep(window + 200*time.Millisecond) // as the timeouts fall due
		p.kill()
		wg.Wait()
	}
	start(t, env, args...)

	status := func() map[string]order.Order {
		var os []order.Order
		require.NoError(t, db.Find(&os).Error)
		out := map[string]order.Order{}
		for _, o := range os {
			out[o.ID] = o
		}
		return out
	}
	settled := testenv.Poll(60*time.Second, func() bool {
		for _, o := range status() {
			if o.Status == order.StatusPlaced {
				return false
			}
		}
		return true
	})
	got := status()
	require.Len(t, got, len(all))
	var cancelled, paidN int
	for _, id := range all {
		o := got[id]
		switch o.Status {
		case order.StatusPaid:
			paidN++
		case order.StatusCancelled:
			cancelled++
			assert.Equal(t, "payment_timeout", o.CancelReason, "order %s", id)
			assert.False(t, paid[id], "order %s was cancelled after its payment was accepted", id)
		default:
			t.Errorf("order %s still %s: its timeout was lost", id, o.Status)
		}
	}
	require.True(t, settled, "orders still placed a minute after the restart")
	testenv.WaitFor(t, 30*time.Second, "a notice per cancelled order", func() bool {
		var n int64
		require.NoError(t, db.Model(&Notification{}).Where("text LIKE ?", "%cancelled (payment_timeout)%").Count(&n).Error)
		return n >= int64(cancelled)
	})
	var dup []struct {
		OrderID string
		N       int
	}
	require.NoError(t, db.Model(&Notification{}).Select("order_id, count(*) AS n").
		Where("text LIKE ?", "%cancelled (payment_timeout)%").Group("order_id").Having("count(*) > 1").Scan(&dup).Error)
	assert.Empty(t, dup, "a timeout took effect twice")
	var open int64
	require.NoError(t, db.Model(&Checkout{}).Where("completed = ?", false).Count(&open).Error)
	assert.Zero(t, open, "every checkout completed")
	t.Logf("%d orders: %d paid (%d payments accepted), %d cancelled by their timeout", len(all), paidN, len(paid), cancelled)
	assert.Positive(t, cancelled)
}
