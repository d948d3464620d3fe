package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/internal/testenv"
)

// TestBadOrdersAreRefused sends the running binary orders a careless API
// would accept: each gets its 4xx problem, never a 5xx, and none of them
// creates an order, reserves stock or queues an event.
func TestBadOrdersAreRefused(t *testing.T) {
	t.Parallel()
	p := startEmbedded(t)
	item := func(sku, qty string) string { return `{"sku":"` + sku + `","qty":` + qty + `}` }
	orderOf := func(customer string, items ...string) string {
		return `{"customer_id":"` + customer + `","items":[` + strings.Join(items, ",") + `]}`
	}
	manyItems := make([]string, order.MaxItems+1)
	for i := range manyItems {
		manyItems[i] = item("tea", "1")
	}
	// A body just under the limit: a customer id that fills it.
	pad := maxBody - len(orderOf("", item("tea", "1")))
	nearLimit := orderOf(strings.Repeat("c", pad), item("tea", "1"))
	require.Len(t, nearLimit, maxBody)

	cases := []struct {
		name        string
		body        string
		contentType string // default application/json
		status      int
	}{
		// Amounts and bounds.
		{"quantity that overflows the total", orderOf("c1", item("coffee", "9223372036854775807")), "", 422},
		{"quantity above the bound", orderOf("c1", item("coffee", "1001")), "", 422},
		{"negative quantity", orderOf("c1", item("coffee", "-1")), "", 422},
		{"quantity past int64", orderOf("c1", item("coffee", "92233720368547758070")), "", 400},
		{"fractional quantity", orderOf("c1", item("coffee", "1.5")), "", 400},
		{"too many lines", orderOf("c1", manyItems...), "", 422},
		// The customer id.
		{"customer id with invalid UTF-8", orderOf("c\xff1", item("tea", "1")), "", 400},
		{"customer id with a control character", orderOf(`c\u00071`, item("tea", "1")), "", 422},
		{"customer id over 64 bytes", orderOf(strings.Repeat("c", order.MaxCustomerIDLen+1), item("tea", "1")), "", 422},
		{"body just under the size limit", nearLimit, "", 422},
		{"body over the size limit", orderOf(strings.Repeat("c", pad+1), item("tea", "1")), "", 413},
		// Strict JSON.
		{"trailing object", orderOf("c1", item("tea", "1")) + `{}`, "", 400},
		{"trailing garbage", orderOf("c1", item("tea", "1")) + `x`, "", 400},
		{"duplicate key", `{"customer_id":"c1","customer_id":"c2","items":[` + item("tea", "1") + `]}`, "", 400},
		{"duplicate key by case", `{"customer_id":"c1","Customer_ID":"c2","items":[` + item("tea", "1") + `]}`, "", 400},
		{"duplicate key in an item", `{"customer_id":"c1","items":[{"sku":"tea","sku":"coffee","qty":1}]}`, "", 400},
		{"unknown field", `{"customer_id":"c1","coupon":"FREE","items":[` + item("tea", "1") + `]}`, "", 400},
		{"unknown field in an item", `{"customer_id":"c1","items":[{"sku":"tea","qty":1,"price_cents":1}]}`, "", 400},
		{"wrong type", `{"customer_id":"c1","items":[{"sku":"tea","qty":"1"}]}`, "", 400},
		{"array", `[` + orderOf("c1", item("tea", "1")) + `]`, "", 400},
		{"null", `null`, "", 400},
		{"empty body", ``, "", 400},
		// Media type.
		{"text/plain", orderOf("c1", item("tea", "1")), "text/plain", 415},
		{"form", orderOf("c1", item("tea", "1")), "application/x-www-form-urlencoded", 415},
		{"no content type", orderOf("c1", item("tea", "1")), "-", 415},
		{"JSON in another charset", orderOf("c1", item("tea", "1")), "application/json; charset=latin1", 415},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest("POST", p.url+"/orders", strings.NewReader(c.body))
			require.NoError(t, err)
			switch c.contentType {
			case "":
				req.Header.Set("Content-Type", "application/json")
			case "-":
			default:
				req.Header.Set("Content-Type", c.contentType)
			}
			r := do(t, req)
			assert.Equal(t, c.status, r.status, "%.300s", r.body)
			assert.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
			assert.Empty(t, r.header.Get("Location"), "no order was created")
		})
	}

	// Nothing was reserved, and the outbox holds no event: a good order
	// afterwards is the first one.
	assert.Zero(t, reserved(t, p.url, "coffee"))
	assert.Zero(t, reserved(t, p.url, "tea"))
	ok := call(t, "POST", p.url+"/orders", orderOf("c1", item("tea", "2")), map[string]string{"Content-Type": "application/json; charset=utf-8"})
	require.Equal(t, http.StatusCreated, ok.status, "%s", ok.body)
	id := ok.json(t)["id"].(string)
	testenv.WaitFor(t, 10*time.Second, "the good order's reservation", func() bool { return reserved(t, p.url, "tea") == 2 })
	assert.Zero(t, reserved(t, p.url, "coffee"), "no refused order reached the consumers")
	assert.Equal(t, float64(1200), call(t, "GET", p.url+"/orders/"+id, "", nil).json(t)["total_cents"])
}
