package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
)

// checkoutStack starts minishop with short checkout timings, on the
// embedded default or on PostgreSQL with RabbitMQ.
func checkoutStack(t *testing.T, stack string, args ...string) *proc {
	t.Helper()
	args = append([]string{"-addr", "127.0.0.1:0"}, args...)
	if stack == "embedded" {
		return start(t, []string{"DATABASE_URL=", "AMQP_URL="}, append(args, "-db", t.TempDir()+"/minishop.db")...)
	}
	ex := testenv.NewExchange(t)
	_, dsn := testenv.Postgres(t)
	deleteQueues(t, ex.URL, groupQueues()...)
	ex.Queues(groupQueues()...)
	for group := range groupBindings {
		ex.Partitioned(group, consumer.DefaultPartitions)
	}
	return start(t, []string{"DATABASE_URL=" + dsn, "AMQP_URL=" + ex.URL, "MINISHOP_EXCHANGE=" + ex.Name}, args...)
}

func placeOrder(t *testing.T, base string) string {
	t.Helper()
	placed := call(t, "POST", base+"/orders", `{"customer_id":"c1","items":[{"sku":"tea","qty":1}]}`, nil)
	require.Equal(t, 201, placed.status, "%s", placed.body)
	return placed.json(t)["id"].(string)
}

func noteTexts(t *testing.T, base, id string) string {
	t.Helper()
	var texts []string
	for _, n := range notifications(t, base, id) {
		texts = append(texts, n.(map[string]any)["text"].(string))
	}
	return strings.Join(texts, "\n")
}

// TestPaymentWindow: through the binary, an order not paid within the
// payment window is cancelled with reason payment_timeout and the customer
// told; GET shows the deadline while the window is open; an order paid in
// time stays paid after its window would have closed.
func TestPaymentWindow(t *testing.T) {
	for _, stack := range []string{"embedded", "postgres+rabbitmq"} {
		t.Run(stack, func(t *testing.T) {
			t.Parallel()
			const window = 3 * time.Second
			p := checkoutStack(t, stack, "-payment-window", window.String())
			before := time.Now()
			unpaid, paid := placeOrder(t, p.url), placeOrder(t, p.url)

			var due time.Time
			testenv.WaitFor(t, 10*time.Second, "the deadline on the order", func() bool {
				v, ok := call(t, "GET", p.url+"/orders/"+unpaid, "", nil).json(t)["payment_due_at"].(string)
				if ok {
					var err error
					due, err = time.Parse(time.RFC3339Nano, v)
					require.NoError(t, err)
				}
				return ok
			})
			assert.WithinDuration(t, before.Add(window), due, 2*time.Second, "the window starts when the order is placed")

			r := call(t, "POST", p.url+"/orders/"+paid+"/pay", `{"card":"4242-4242-4242-4242"}`, nil)
			require.Equal(t, 200, r.status, "%s", r.body)
			testenv.WaitFor(t, 10*time.Second, "the paid order's deadline to go", func() bool {
				_, ok := call(t, "GET", p.url+"/orders/"+paid, "", nil).json(t)["payment_due_at"]
				return !ok
			})

			testenv.WaitFor(t, 30*time.Second, "the unpaid order cancelled", func() bool {
				return call(t, "GET", p.url+"/orders/"+unpaid, "", nil).json(t)["status"] == "cancelled"
			})
			got := call(t, "GET", p.url+"/orders/"+unpaid, "", nil).json(t)
			assert.Equal(t, "payment_timeout", got["cancel_reason"])
			assert.False(t, time.Now().Before(due), "not cancelled before its deadline")
			assert.NotContains(t, got, "payment_due_at")
			testenv.WaitFor(t, 10*time.Second, "the customer told", func() bool {
				return strings.Contains(noteTexts(t, p.url, unpaid), "cancelled (payment_timeout)")
			})

			time.Sleep(time.Second) // past the paid order's window
			assert.Equal(t, "paid", call(t, "GET", p.url+"/orders/"+paid, "", nil).json(t)["status"], "paying in time cancelled the timeout")
			assert.NotContains(t, noteTexts(t, p.url, paid), "cancelled")
		})
	}
}

// TestDeclinedCardRetrySchedule: through the binary, a declined card
// starts the retry schedule: the customer is reminded each interval, and
// after the last reminder the order is cancelled with reason
// payment_declined. An order paid after its decline gets no reminder.
func TestDeclinedCardRetrySchedule(t *testing.T) {
	for _, stack := range []string{"embedded", "postgres+rabbitmq"} {
		t.Run(stack, func(t *testing.T) {
			t.Parallel()
			p := checkoutStack(t, stack, "-payment-window", "5m", "-payment-retry-interval", "1s", "-payment-retries", "2")
			gives, pays := placeOrder(t, p.url), placeOrder(t, p.url)
			for _, id := range []string{gives, pays} {
				r := call(t, "POST", p.url+"/orders/"+id+"/pay", `{"card":"`+DeclinedCard+`"}`, nil)
				require.Equal(t, 402, r.status, "%s", r.body)
			}
			// Paid with another card right after the decline: its retry
			// schedule stops, whether the payment reaches the process
			// before the first retry falls due or the retry finds the order
			// paid.
			r := call(t, "POST", p.url+"/orders/"+pays+"/pay", `{"card":"4242-4242-4242-4242"}`, nil)
			require.Equal(t, 200, r.status, "%s", r.body)

			testenv.WaitFor(t, 30*time.Second, "the order cancelled after its reminders", func() bool {
				return call(t, "GET", p.url+"/orders/"+gives, "", nil).json(t)["status"] == "cancelled"
			})
			assert.Equal(t, "payment_declined", call(t, "GET", p.url+"/orders/"+gives, "", nil).json(t)["cancel_reason"])
			// Each note comes from its own message: the last reminder's
			// may reach the notifier after the cancellation's.
			wants := []string{"declined", "reminder 1 of 2", "reminder 2 of 2", "cancelled (payment_declined)"}
			testenv.WaitFor(t, 10*time.Second, "the customer told", func() bool {
				texts := noteTexts(t, p.url, gives)
				return !slices.ContainsFunc(wants, func(w string) bool { return !strings.Contains(texts, w) })
			})
			texts := noteTexts(t, p.url, gives)
			assert.Equal(t, 1, strings.Count(texts, "reminder 2 of 2"), "each reminder once:\n%s", texts)

			texts = noteTexts(t, p.url, pays) // the other order's whole schedule has run by now
			assert.NotContains(t, texts, "reminder", "paying stopped the schedule")
			assert.Contains(t, texts, "Payment of 600 cents received")
			assert.Equal(t, "paid", call(t, "GET", p.url+"/orders/"+pays, "", nil).json(t)["status"])
		})
	}
}
