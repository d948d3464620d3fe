package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/testenv"
)

// TestDeclinedCardLeavesTheOrderPayable pays an order with the declined
// test card through the running binary: 402, the order stays placed, the
// failure is an event (order.payment_failed) the notification group tells
// the customer about, and a second payment with another card succeeds.
// A pay body that is not one JSON object of the documented shape is
// refused like an order's.
func TestDeclinedCardLeavesTheOrderPayable(t *testing.T) {
	t.Parallel()
	p := startEmbedded(t)
	placed := call(t, "POST", p.url+"/orders", `{"customer_id":"c1","items":[{"sku":"tea","qty":1}]}`, nil)
	require.Equal(t, 201, placed.status, "%s", placed.body)
	id := placed.json(t)["id"].(string)
	pay := p.url + "/orders/" + id + "/pay"

	declined := call(t, "POST", pay, `{"card":"`+DeclinedCard+`"}`, nil)
	require.Equal(t, http.StatusPaymentRequired, declined.status, "%s", declined.body)
	assert.Equal(t, "application/problem+json", declined.header.Get("Content-Type"))
	assert.Equal(t, "placed", call(t, "GET", p.url+"/orders/"+id, "", nil).json(t)["status"], "still payable")
	testenv.WaitFor(t, 10*time.Second, "the declined-payment notification", func() bool { return len(notifications(t, p.url, id)) == 1 })
	note := notifications(t, p.url, id)[0].(map[string]any)
	assert.Contains(t, note["text"], "declined")

	for name, c := range map[string]struct {
		body, contentType string
		status            int
	}{
		"unknown member": {`{"card":"4242-4242-4242-4242","cvv":"123"}`, "application/json", 400},
		"trailing data":  {`{"card":"4242-4242-4242-4242"} x`, "application/json", 400},
		"text/plain":     {`{"card":"4242-4242-4242-4242"}`, "text/plain", 415},
	} {
		r := call(t, "POST", pay, c.body, map[string]string{"Content-Type": c.contentType})
		assert.Equal(t, c.status, r.status, "%s: %s", name, r.body)
	}
	assert.Equal(t, "placed", call(t, "GET", p.url+"/orders/"+id, "", nil).json(t)["status"], "refused bodies change nothing")

	paid := call(t, "POST", pay, `{"card":"4242-4242-4242-4242"}`, nil)
	require.Equal(t, 200, paid.status, "%s", paid.body)
	assert.Equal(t, "paid", paid.json(t)["status"])
	testenv.WaitFor(t, 10*time.Second, "the payment notification", func() bool { return len(notifications(t, p.url, id)) == 2 })
	texts := []string{}
	for _, n := range notifications(t, p.url, id) {
		texts = append(texts, n.(map[string]any)["text"].(string))
	}
	assert.True(t, strings.Contains(strings.Join(texts, "\n"), "Payment of 600 cents received"), "%v", texts)
}
