package process_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/bentotest"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/process"
)

// The suite's process: pay for an order within a window, with a retry
// schedule for declined cards.

type OrderPlaced struct {
	OrderID string `json:"order_id"`
}

func (OrderPlaced) EventType() string { return "order.placed" }

type PaymentReceived struct {
	OrderID string `json:"order_id"`
}

func (PaymentReceived) EventType() string { return "payment.received" }

type CardDeclined struct {
	OrderID string `json:"order_id"`
}

func (CardDeclined) EventType() string { return "payment.card_declined" }

type PaymentDue struct {
	OrderID string `json:"order_id"`
}

func (PaymentDue) EventType() string { return "order.payment_due" }

type RetryCapture struct {
	OrderID string `json:"order_id"`
	Attempt int    `json:"attempt"`
}

func (RetryCapture) EventType() string { return "payment.retry_capture" }

type OrderCancelled struct {
	OrderID string `json:"order_id"`
	Reason  string `json:"reason"`
}

func (OrderCancelled) EventType() string { return "order.cancelled" }

type CaptureRequested struct {
	OrderID string `json:"order_id"`
	Attempt int    `json:"attempt"`
}

func (CaptureRequested) EventType() string { return "payment.capture_requested" }

// Payment is the process's state.
type Payment struct {
	process.Base
	Status   string
	Declines int
}

const (
	window   = 15 * time.Minute
	retryGap = 10 * time.Minute
	retries  = 2
)

// fixture is a bentotest env with the process registered on group
// "payments". failOnce, when set, makes the first run of the payment
// step fail after it has done its work.
type fixture struct {
	env      *bentotest.Env
	failOnce atomic.Bool
	steps    atomic.Int64
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{env: bentotest.New(t, nil)}
	f.env.Migrate(t, &Payment{})
	c := f.env.MustConsumer(t, "payments")
	m, err := process.New[Payment](c, process.Config{Name: "payment", Outbox: f.env.Outbox})
	require.NoError(t, err)
	byOrder := func(id string) string { return id }
	require.NoError(t, process.StartedBy(m, func(e OrderPlaced) string { return byOrder(e.OrderID) },
		func(ctx context.Context, s *process.Step[Payment], e OrderPlaced) error {
			s.State.Status = "awaiting_payment"
			return s.Schedule(ctx, "window", PaymentDue(e), outbox.After(window))
		}))
	require.NoError(t, process.Handles(m, func(e PaymentReceived) string { return e.OrderID }, process.Ignore,
		func(ctx context.Context, s *process.Step[Payment], e PaymentReceived) error {
			f.steps.Add(1)
			s.State.Status = "paid"
			s.Complete()
			if err := s.CancelTimeout(ctx, "window"); err != nil {
				return err
			}
			if err := s.CancelTimeout(ctx, "retry"); err != nil {
				return err
			}
			if f.failOnce.CompareAndSwap(true, false) {
				return errors.New("the step fails after doing its work")
			}
			return nil
		}))
	require.NoError(t, process.Handles(m, func(e CardDeclined) string { return e.OrderID }, process.Fail,
		func(ctx context.Context, s *process.Step[Payment], e CardDeclined) error {
			s.State.Declines++
			if s.State.Declines > retries {
				return cancel(ctx, s, "payment_declined")
			}
			return s.Schedule(ctx, "retry", RetryCapture{OrderID: e.OrderID, Attempt: s.State.Declines}, outbox.After(retryGap))
		}))
	require.NoError(t, process.OnTimeout(m, func(ctx context.Context, s *process.Step[Payment], e PaymentDue) error {
		return cancel(ctx, s, "payment_timeout")
	}))
	require.NoError(t, process.OnTimeout(m, func(ctx context.Context, s *process.Step[Payment], e RetryCapture) error {
		return s.Emit(ctx, CaptureRequested(e))
	}))
	f.env.Start(t, c)
	return f
}

func cancel(ctx context.Context, s *process.Step[Payment], reason string) error {
	s.State.Status = "cancelled"
	s.Complete()
	if err := s.CancelTimeout(ctx, "window"); err != nil {
		return err
	}
	if err := s.CancelTimeout(ctx, "retry"); err != nil {
		return err
	}
	return s.Emit(ctx, OrderCancelled{OrderID: s.State.Key, Reason: reason})
}

// deliver hands ev to the consumer as the broker would and drains.
func (f *fixture) deliver(t *testing.T, ev aggregate.Event) {
	t.Helper()
	f.env.Deliver(t, f.env.Message(t, ev, nil), 1)
}

func (f *fixture) state(t *testing.T, id string) Payment {
	t.Helper()
	var p Payment
	require.NoError(t, f.env.DB.Where("process_key = ?", id).Take(&p).Error)
	return p
}

// emitted lists the payloads of the events of topic in the outbox.
func (f *fixture) emitted(t *testing.T, topic string) []string {
	t.Helper()
	var out []string
	for _, e := range f.env.Committed(t) {
		if e.Topic == topic {
			out = append(out, string(e.Payload))
		}
	}
	return out
}

// TestUnpaidOrderTimesOut: the payment window's timeout cancels the order
// when it falls due, not a second before, and completes the process.
func TestUnpaidOrderTimesOut(t *testing.T) {
	f := newFixture(t)
	f.deliver(t, OrderPlaced{OrderID: "o-1"})
	p := f.state(t, "o-1")
	assert.Equal(t, "awaiting_payment", p.Status)
	require.Contains(t, p.Timeouts, "window")
	require.Len(t, f.env.Scheduled(t), 1)
	assert.True(t, f.env.Scheduled(t)[0].DueAt.Equal(f.env.Clock.Now().Add(window)))

	f.env.Advance(t, window-time.Second)
	assert.Empty(t, f.emitted(t, "order.cancelled"))
	f.env.Advance(t, time.Second)
	assert.Equal(t, []string{`{"order_id":"o-1","reason":"payment_timeout"}`}, f.emitted(t, "order.cancelled"))
	p = f.state(t, "o-1")
	assert.Equal(t, "cancelled", p.Status)
	assert.True(t, p.Completed)
	assert.Empty(t, p.Timeouts)
	assert.Equal(t, int64(2), p.Version, "started, then timed out")

	f.deliver(t, PaymentReceived{OrderID: "o-1"})
	assert.Equal(t, "cancelled", f.state(t, "o-1").Status, "a message for a completed process is dropped")
	f.deliver(t, OrderPlaced{OrderID: "o-1"})
	assert.True(t, f.state(t, "o-1").Completed, "and never restarts it")
}

// TestPaymentInTimeCancelsTheTimeout: paying within the window cancels the
// scheduled timeout in the same transaction, so it never fires.
func TestPaymentInTimeCancelsTheTimeout(t *testing.T) {
	f := newFixture(t)
	f.deliver(t, OrderPlaced{OrderID: "o-2"})
	f.env.Advance(t, 5*time.Minute)
	f.deliver(t, PaymentReceived{OrderID: "o-2"})
	assert.Empty(t, f.env.Scheduled(t), "the cancel deleted the timeout")
	f.env.Advance(t, time.Hour)
	assert.Empty(t, f.emitted(t, "order.cancelled"))
	assert.Equal(t, "paid", f.state(t, "o-2").Status)
}

// TestTimeoutRacingThePayment: the timeout's message is released for
// delivery, then the payment is handled before it: the payment's cancel
// comes too late to stop the message, but the step removed the timeout's
// token, so the timeout is dropped when it arrives.
func TestTimeoutRacingThePayment(t *testing.T) {
	f := newFixture(t)
	f.deliver(t, OrderPlaced{OrderID: "o-3"})
	f.env.Clock.Advance(window)
	r, err := f.env.Outbox.ReleaseDue(context.Background(), outbox.ReleaseOpts{})
	require.NoError(t, err)
	require.Equal(t, 1, r.Released, "the timeout is on its way")

	f.deliver(t, PaymentReceived{OrderID: "o-3"}) // handled first; Deliver drains, so the timeout follows
	assert.Empty(t, f.emitted(t, "order.cancelled"), "the stale timeout was dropped")
	p := f.state(t, "o-3")
	assert.Equal(t, "paid", p.Status)
	assert.Equal(t, int64(2), p.Version, "the dropped timeout changed nothing")
}

// TestDeclinedCardRetriesThenCancels: each decline schedules a capture
// retry; after the last the order is cancelled and the window's timeout
// with it.
func TestDeclinedCardRetriesThenCancels(t *testing.T) {
	f := newFixture(t)
	f.deliver(t, OrderPlaced{OrderID: "o-4"})
	f.deliver(t, CardDeclined{OrderID: "o-4"})
	f.env.Advance(t, retryGap)
	assert.Equal(t, []string{`{"order_id":"o-4","attempt":1}`}, f.emitted(t, "payment.capture_requested"))
	f.deliver(t, CardDeclined{OrderID: "o-4"})
	f.env.Advance(t, retryGap-time.Minute) // 19 minutes in: the window's timeout would have fired by now
	assert.Len(t, f.emitted(t, "payment.capture_requested"), 1, "the second retry is not due")
	assert.Equal(t, []string{`{"order_id":"o-4","reason":"payment_timeout"}`}, f.emitted(t, "order.cancelled"),
		"the window still runs beside the retries")
	f.deliver(t, CardDeclined{OrderID: "o-4"})
	f.env.Advance(t, time.Hour)
	assert.Len(t, f.emitted(t, "payment.capture_requested"), 1, "the retry scheduled before the timeout was cancelled with it")
	assert.Len(t, f.emitted(t, "order.cancelled"), 1)
}

// TestDeclinesRunOutBeforeTheWindow: three declines in the window cancel
// the order for the declines, and the window's timeout never fires.
func TestDeclinesRunOutBeforeTheWindow(t *testing.T) {
	f := newFixture(t)
	f.deliver(t, OrderPlaced{OrderID: "o-5"})
	for range retries + 1 {
		f.deliver(t, CardDeclined{OrderID: "o-5"})
	}
	f.env.Advance(t, time.Hour)
	assert.Equal(t, []string{`{"order_id":"o-5","reason":"payment_declined"}`}, f.emitted(t, "order.cancelled"))
	assert.Empty(t, f.emitted(t, "payment.capture_requested"), "the retry schedule was cancelled")
	assert.Empty(t, f.env.Scheduled(t))
}

// TestFailedStepIsRetriedWhole: a step that fails after cancelling the
// timeout and completing the process leaves nothing behind; its retry does
// it all once.
func TestFailedStepIsRetriedWhole(t *testing.T) {
	f := newFixture(t)
	f.deliver(t, OrderPlaced{OrderID: "o-6"})
	f.failOnce.Store(true)
	f.deliver(t, PaymentReceived{OrderID: "o-6"})
	assert.Equal(t, int64(2), f.steps.Load(), "failed once, then retried")
	p := f.state(t, "o-6")
	assert.Equal(t, "paid", p.Status)
	assert.Equal(t, int64(2), p.Version, "one step committed")
	assert.Empty(t, f.env.Scheduled(t))
	f.env.Advance(t, time.Hour)
	assert.Empty(t, f.emitted(t, "order.cancelled"))
}

// TestMissingProcessPolicies: a payment for an order never placed is
// dropped (Ignore); a decline for one is failed and dead-lettered (Fail).
func TestMissingProcessPolicies(t *testing.T) {
	f := newFixture(t)
	f.deliver(t, PaymentReceived{OrderID: "nope"})
	assert.Zero(t, f.steps.Load())
	var n int64
	require.NoError(t, f.env.DB.Model(&Payment{}).Count(&n).Error)
	assert.Zero(t, n, "nothing started")

	decline := f.env.Message(t, CardDeclined{OrderID: "nope"}, nil)
	f.env.Deliver(t, decline, 1)
	q := consumer.DeadLetterQueue("payments")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	dead, err := f.env.Bus.Subscriber(q).Subscribe(ctx, q)
	require.NoError(t, err)
	select {
	case m := <-dead:
		m.Ack()
		assert.Equal(t, decline.UUID, m.UUID, "the decline was dead-lettered")
		assert.Contains(t, m.Metadata.Get(consumer.MetaDeadReason), "no such process")
	case <-time.After(5 * time.Second):
		t.Fatal("no dead letter")
	}
}

// TestNewRejectsBadConfig: a bad name or a missing outbox is a typed
// error.
func TestNewRejectsBadConfig(t *testing.T) {
	env := bentotest.New(t, nil)
	c := env.MustConsumer(t, "x")
	_, err := process.New[Payment](c, process.Config{Name: "bad name", Outbox: env.Outbox})
	require.ErrorIs(t, err, process.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "Name")
	_, err = process.New[Payment](c, process.Config{Name: "ok"})
	require.ErrorIs(t, err, process.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "Outbox")
}
