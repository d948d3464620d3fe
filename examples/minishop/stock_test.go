package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/examples/minishop/inventory"
	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/internal/testenv"
)

// TestStockNeverGoesNegative orders, through the running binary, one more
// order of coffee than the shop has: eleven orders of 100,000 units against
// 1,000,000 on hand. Ten are reserved; the one that finds too little
// reserves nothing, is cancelled by the ordering group with the reason, and
// its customer is told; paying it gets 409. Reserved stock never passes
// what is on hand.
func TestStockNeverGoesNegative(t *testing.T) {
	t.Parallel()
	p := startEmbedded(t)
	line := `{"sku":"coffee","qty":` + "1000" + `}`
	lines := strings.TrimSuffix(strings.Repeat(line+",", order.MaxItems), ",")
	const orders = inventory.SeedOnHand/(order.MaxItems*order.MaxQty) + 1
	var ids []string
	for range orders {
		r := call(t, "POST", p.url+"/orders", `{"customer_id":"c1","items":[`+lines+`]}`, nil)
		require.Equal(t, 201, r.status, "%s", r.body)
		ids = append(ids, r.json(t)["id"].(string))
	}

	var cancelled []string
	testenv.WaitFor(t, 20*time.Second, "every order reserved or cancelled", func() bool {
		cancelled = cancelled[:0]
		for _, id := range ids {
			if call(t, "GET", p.url+"/orders/"+id, "", nil).json(t)["status"] == order.StatusCancelled {
				cancelled = append(cancelled, id)
			}
		}
		return len(cancelled) == 1 && reserved(t, p.url, "coffee") == inventory.SeedOnHand
	})
	assert.Equal(t, float64(inventory.SeedOnHand), reserved(t, p.url, "coffee"), "never more reserved than on hand")

	rejected := call(t, "GET", p.url+"/orders/"+cancelled[0], "", nil).json(t)
	assert.Contains(t, rejected["cancel_reason"], "out of stock")
	testenv.WaitFor(t, 10*time.Second, "the customer's notification", func() bool { return len(notifications(t, p.url, cancelled[0])) == 1 })
	note := notifications(t, p.url, cancelled[0])[0].(map[string]any)
	assert.Contains(t, note["text"], "cancelled")
	assert.Equal(t, 409, call(t, "POST", p.url+"/orders/"+cancelled[0]+"/pay", "", nil).status, "a rejected order cannot be paid")

	for _, id := range ids {
		if id != cancelled[0] {
			require.Equal(t, 200, call(t, "POST", p.url+"/orders/"+id+"/pay", "", nil).status, "a reserved order can be paid")
			break
		}
	}
}
