package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/examples/minishop/inventory"
	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/internal/embeddb"
	"github.com/bentoevents/bento/internal/testenv"
)

// crashLease is the -lease the crash tests run minishop with, so that what
// a killed process held is taken over within seconds.
const crashLease = 5 * time.Second

// TestKilledUnderLoadOnTheEmbeddedDefault runs minishop as it is started
// with no configuration (a SQLite file, no broker), kills it with SIGKILL
// while 16 clients place orders, twice, restarts it on the same file and
// waits: every order whose order.placed committed is reserved by the
// inventory exactly once.
func TestKilledUnderLoadOnTheEmbeddedDefault(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "minishop.db")
	db, err := embeddb.Open(path, nil)
	require.NoError(t, err)
	defer func() { sqlDB, _ := db.DB(); _ = sqlDB.Close() }()
	last := killUnderLoad(t, db, []string{"DATABASE_URL=", "AMQP_URL="}, "-db", path)
	requireReservedOnce(t, db, last)
}

// TestKilledUnderLoadOnPostgresWithoutBroker is
// TestKilledUnderLoadOnTheEmbeddedDefault on PostgreSQL with no broker
// (DATABASE_URL set, AMQP_URL not).
func TestKilledUnderLoadOnPostgresWithoutBroker(t *testing.T) {
	t.Parallel()
	db, dsn := testenv.Postgres(t)
	last := killUnderLoad(t, db, []string{"DATABASE_URL=" + dsn, "AMQP_URL="})
	requireReservedOnce(t, db, last)
}

// roundOrders bounds the orders one round of killUnderLoad places, so that
// the restarted process has a bounded backlog to work off.
const roundOrders = 80

// killUnderLoad starts minishop (all modes in one process) on db with env
// and args, lets 16 clients place orders (up to roundOrders), kills it with
// SIGKILL once at least 60 have been placed and the inventory has reserved
// at least 10 of them (so some orders are applied, some relayed and in
// flight, some not relayed), and does it again; then it starts minishop
// once more, to be stopped at cleanup.
func killUnderLoad(t *testing.T, db *gorm.DB, env []string, args ...string) *proc {
	t.Helper()
	args = append(args, "-addr", "127.0.0.1:0", "-lease", crashLease.String())
	client := &http.Client{Timeout: 10 * time.Second}
	reserved := func() int64 {
		var n int64
		if err := db.Model(&inventory.Reservation{}).Count(&n).Error; err != nil {
			return 0 // not migrated yet
		}
		return n
	}
	for round := range 2 {
		p := start(t, env, args...)
		before := reserved()
		var (
			placed atomic.Int64
			halt   = make(chan struct{})
			wg     sync.WaitGroup
		)
		for c := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; placed.Load() < roundOrders; i++ {
					select {
					case <-halt:
						return
					default:
					}
					body := fmt.Sprintf(`{"customer_id":"r%d-c%d-%d","items":[{"sku":"tea","qty":%d},{"sku":"apple","qty":1}]}`, round, c, i, 1+i%3)
					res, err := client.Post(p.url+"/orders", "application/json", strings.NewReader(body))
					if err != nil {
						return // killed
					}
					_ = res.Body.Close()
					if res.StatusCode == http.StatusCreated {
						placed.Add(1)
					}
				}
			}()
		}
		// Kill in the middle of the stream: some orders relayed and
		// applied, some relayed and not yet applied, some not relayed.
		testenv.WaitFor(t, 30*time.Second, "orders placed and reserved", func() bool {
			return placed.Load() >= 60 && reserved()-before >= 10
		})
		p.kill()
		close(halt)
		wg.Wait()
		t.Logf("round %d: %d orders placed, %d reserved before the kill", round, placed.Load(), reserved()-before)
	}
	return start(t, env, args...)
}

// requireReservedOnce waits until the outbox is relayed and the inventory
// has reserved every placed order, then checks that it reserved each
// exactly once: one reservation per order and, per sku, as much reserved
// stock as the orders hold. It fails with the counts when an order is
// still not reserved well after every lease a killed process held ended,
// and then logs what the running process last said and where the
// messages wait.
func requireReservedOnce(t *testing.T, db *gorm.DB, running *proc) {
	t.Helper()
	var orders, placedEvents, reservations, pending int64
	count := func() {
		require.NoError(t, db.Model(&order.Order{}).Count(&orders).Error)
		require.NoError(t, db.Table("outbox_events").Where("topic = 'order.placed'").Count(&placedEvents).Error)
		require.NoError(t, db.Model(&inventory.Reservation{}).Count(&reservations).Error)
		require.NoError(t, db.Table("outbox_events").Where("status <> 'sent'").Count(&pending).Error)
	}
	// What the killed process held is taken over crashLease after the
	// kill; the rest is the backlog of at most 2 x roundOrders orders.
	began := time.Now()
	settled := testenv.Poll(60*time.Second, func() bool {
		count()
		return pending == 0 && reservations >= orders
	})
	t.Logf("settled in %v", time.Since(began).Round(100*time.Millisecond))
	count()
	require.Positive(t, orders)
	assert.Equal(t, orders, placedEvents, "every committed order has its order.placed")
	if !assert.Zero(t, pending, "outbox rows not relayed") {
		var rows []struct {
			Topic, Status, LastError string
			Attempts                 int
		}
		require.NoError(t, db.Table("outbox_events").Select("topic, status, attempts, last_error").
			Where("status <> 'sent'").Limit(5).Scan(&rows).Error)
		t.Logf("some of them: %+v", rows)
	}
	if !settled || reservations != orders {
		logStall(t, db, running)
		var missing int64
		require.NoError(t, db.Model(&order.Order{}).
			Where("id NOT IN (?)", db.Model(&inventory.Reservation{}).Select("id")).Count(&missing).Error)
		t.Fatalf("%d orders committed, %d reserved: %d order.placed never reserved by the inventory", orders, reservations, missing)
	}
	var all []order.Order
	require.NoError(t, db.Find(&all).Error)
	want := map[string]int64{}
	for _, o := range all {
		for _, it := range o.Items {
			want[it.SKU] += int64(it.Qty)
		}
	}
	var stocks []inventory.Stock
	require.NoError(t, db.Find(&stocks).Error)
	for _, s := range stocks {
		assert.Equal(t, want[s.ID], s.Reserved, "sku %s: reserved once per order", s.ID)
	}
	var applied int64
	require.NoError(t, db.Table("inbox_messages").Where("consumer = ?", inventoryGroup).Count(&applied).Error)
	assert.Equal(t, orders, applied, "the inventory's inbox holds each order.placed once")
}

// logStall logs the end of the running process's log and, on the database
// bus, how each group's deliveries wait: what a stalled settle needs to be
// told from a slow one.
func logStall(t *testing.T, db *gorm.DB, running *proc) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(running.log()), "\n")
	t.Logf("the running minishop's last %d log lines:\n%s", min(len(lines), 40), strings.Join(lines[max(len(lines)-40, 0):], "\n"))
	var outbox []map[string]any
	if err := db.Table("outbox_events").Select("topic, status, attempts, locked_by, locked_until, available_at").
		Where("status <> 'sent'").Limit(5).Find(&outbox).Error; err == nil {
		t.Logf("outbox rows not sent: %v", outbox)
	}
	var queues []map[string]any
	if err := db.Table("dbbus_deliveries").
		Select("group_name, lease_token IS NOT NULL AS leased, count(*) AS n, max(attempts) AS max_attempts, min(leased_until) AS first_lease_end").
		Group("group_name, lease_token IS NOT NULL").Find(&queues).Error; err == nil {
		t.Logf("database bus deliveries: %v", queues)
	}
	var owners []map[string]any
	if err := db.Table("dbbus_queue_owners").Find(&owners).Error; err == nil {
		t.Logf("database bus queue owners: %v", owners)
	}
}
