package main

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/testenv"
)

// TestConcurrentPayAndCancel races a payment against a cancellation of the
// same order, through the running binary on PostgreSQL, for 20 orders:
// exactly one of the two wins (200) and the other gets 409, the order ends
// in the winner's state, and exactly one event follows order.placed, as
// version 2 of the order.
func TestConcurrentPayAndCancel(t *testing.T) {
	t.Parallel()
	db, dsn := testenv.Postgres(t)
	p := start(t, []string{"DATABASE_URL=" + dsn, "AMQP_URL="}, "-addr", "127.0.0.1:0")

	const orders = 20
	for range orders {
		placed := call(t, "POST", p.url+"/orders", `{"customer_id":"c1","items":[{"sku":"tea","qty":1}]}`, nil)
		require.Equal(t, 201, placed.status, "%s", placed.body)
		id := placed.json(t)["id"].(string)

		var wg sync.WaitGroup
		start := make(chan struct{})
		results := map[string]response{}
		var mu sync.Mutex
		for _, action := range []string{"pay", "cancel"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r := call(t, "POST", p.url+"/orders/"+id+"/"+action, "", nil)
				mu.Lock()
				results[action] = r
				mu.Unlock()
			}()
		}
		close(start)
		wg.Wait()

		pay, cancel := results["pay"], results["cancel"]
		statuses := []int{pay.status, cancel.status}
		require.ElementsMatch(t, []int{200, 409}, statuses, "pay: %s; cancel: %s", pay.body, cancel.body)
		want, event := "paid", "order.paid"
		if cancel.status == 200 {
			want, event = "cancelled", "order.cancelled"
		}
		assert.Equal(t, want, call(t, "GET", p.url+"/orders/"+id, "", nil).json(t)["status"])

		var events []struct {
			Topic            string
			AggregateVersion int64
		}
		require.NoError(t, db.Raw(`SELECT topic, aggregate_version FROM outbox_events
			WHERE aggregate_type = 'order' AND aggregate_id = ? ORDER BY aggregate_version`, id).Scan(&events).Error)
		require.Len(t, events, 2, "order.placed and the winner's event only")
		assert.Equal(t, "order.placed", events[0].Topic)
		assert.Equal(t, event, events[1].Topic)
		assert.Equal(t, int64(2), events[1].AggregateVersion)
	}
}
