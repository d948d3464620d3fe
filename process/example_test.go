package process_test

import (
	"context"
	"fmt"
	"time"

	"github.com/bentoevents/bento/bentotest"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/process"
)

// Cancel an order that is not paid within 15 minutes; paying in time
// cancels the timeout.
func Example() {
	t := &bentotest.Recorder{} // in a test, pass t (*testing.T)
	defer t.Close()
	env := bentotest.New(t, nil)
	env.Migrate(t, &Payment{})
	c := env.MustConsumer(t, "payments")
	m, err := process.New[Payment](c, process.Config{Name: "payment", Outbox: env.Outbox})
	if err != nil {
		panic(err)
	}
	_ = process.StartedBy(m, func(e OrderPlaced) string { return e.OrderID },
		func(ctx context.Context, s *process.Step[Payment], e OrderPlaced) error {
			s.State.Status = "awaiting_payment"
			return s.Schedule(ctx, "window", PaymentDue(e), outbox.After(15*time.Minute))
		})
	_ = process.Handles(m, func(e PaymentReceived) string { return e.OrderID }, process.Ignore,
		func(ctx context.Context, s *process.Step[Payment], e PaymentReceived) error {
			s.State.Status = "paid"
			s.Complete()
			return s.CancelTimeout(ctx, "window")
		})
	_ = process.OnTimeout(m, func(ctx context.Context, s *process.Step[Payment], e PaymentDue) error {
		s.State.Status = "cancelled"
		s.Complete()
		return s.Emit(ctx, OrderCancelled{OrderID: e.OrderID, Reason: "payment_timeout"})
	})
	env.Start(t, c)

	for _, id := range []string{"paid-in-time", "never-paid"} {
		env.Deliver(t, env.Message(t, OrderPlaced{OrderID: id}, nil), 1)
	}
	env.Advance(t, 5*time.Minute)
	env.Deliver(t, env.Message(t, PaymentReceived{OrderID: "paid-in-time"}, nil), 1)
	env.Advance(t, 10*time.Minute)

	for _, id := range []string{"paid-in-time", "never-paid"} {
		var p Payment
		_ = env.DB.Where("process_key = ?", id).Take(&p).Error
		fmt.Println(id, p.Status)
	}
	// Output:
	// paid-in-time paid
	// never-paid cancelled
}
