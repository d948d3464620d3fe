package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/process"
	"github.com/bentoevents/bento/tenant"
	"github.com/bentoevents/bento/uow"
)

// The checkout process (package process) watches each order from
// order.placed until it is paid or cancelled:
//   - an order not paid within the payment window is cancelled with reason
//     payment_timeout (and the notification group tells the customer);
//   - paying in time, or cancelling, cancels the window's timeout;
//   - a declined card starts a retry schedule: every retry interval the
//     customer is reminded to pay (checkout.payment_reminder), and after
//     the last reminder the order is cancelled with reason payment_declined.
//
// The order aggregate decides: a timeout that fires while the order is
// being paid cancels it only if the payment has not committed, and
// otherwise changes nothing.

const (
	checkoutGroup   = "checkout"
	checkoutProcess = "checkout"
	// windowTimeout and retryTimeout name the process's two timeouts.
	windowTimeout = "payment-window"
	retryTimeout  = "payment-retry"
)

// Checkout defaults, changed with -payment-window, -payment-retries and
// -payment-retry-interval.
const (
	defaultPaymentWindow = 15 * time.Minute
	defaultRetryInterval = 4 * time.Minute
	defaultRetries       = 2
)

// checkoutConfig is the checkout process's timing.
type checkoutConfig struct {
	Window        time.Duration
	RetryInterval time.Duration
	Retries       int
}

// checkoutTable is the checkout process's state table, which the console
// shows and housekeeping purges.
const checkoutTable = "checkouts"

// Checkout is the process's state, one row per order in the checkouts
// table.
type Checkout struct {
	process.Base
	// Reminders counts the reminders sent since the first declined card.
	Reminders int
	Declines  int
}

// TableName is checkoutTable.
func (Checkout) TableName() string { return checkoutTable }

// PaymentWindowClosed is the payment window's timeout. Wire: {"order_id"}.
type PaymentWindowClosed struct {
	OrderID string `json:"order_id"`
}

// EventType implements aggregate.Event.
func (PaymentWindowClosed) EventType() string { return "checkout.payment_window_closed" }

// PaymentRetryDue is the retry schedule's timeout. Wire: {"order_id","attempt"}.
type PaymentRetryDue struct {
	OrderID string `json:"order_id"`
	Attempt int    `json:"attempt"`
}

// EventType implements aggregate.Event.
func (PaymentRetryDue) EventType() string { return "checkout.payment_retry_due" }

// PaymentReminder asks the customer to pay again after a declined card.
// Wire: {"order_id","reminder","of"}.
type PaymentReminder struct {
	OrderID  string `json:"order_id"`
	Reminder int    `json:"reminder"`
	Of       int    `json:"of"`
}

// EventType implements aggregate.Event.
func (PaymentReminder) EventType() string { return "checkout.payment_reminder" }

// checkoutConsumer runs the checkout process on its own group, partitioned
// by order like the others: an order's events, and the timeouts its steps
// schedule, reach one partition in order.
func (a *App) checkoutConsumer() (*consumer.Consumer, error) {
	c, err := a.bus.newConsumer(a.db, a.consumerConfig(checkoutGroup))
	if err != nil {
		return nil, err
	}
	m, err := process.New[Checkout](c, process.Config{Name: checkoutProcess, Outbox: a.units.Outbox(), Logger: a.log})
	if err != nil {
		return nil, err
	}
	cfg := a.checkout
	finish := func(ctx context.Context, s *process.Step[Checkout]) error {
		s.Complete()
		if err := s.CancelTimeout(ctx, windowTimeout); err != nil {
			return err
		}
		return s.CancelTimeout(ctx, retryTimeout)
	}
	// cancelOrder cancels the order for reason in the step's transaction
	// (the unit of work joins it) and finishes the process. An order paid
	// or cancelled meanwhile is left as it is: its event finishes the
	// process too.
	cancelOrder := func(ctx context.Context, s *process.Step[Checkout], reason string) error {
		err := a.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			o, err := uow.Get[order.Order](ctx, u, s.State.Key)
			if err != nil {
				return err
			}
			return o.CancelBecause(reason)
		})
		if errors.Is(err, order.ErrNotCancelable) {
			a.log.Info("checkout: order no longer placed, left as it is", "order", s.State.Key, "reason", reason)
		} else if err != nil {
			return err
		}
		return finish(ctx, s)
	}
	errs := []error{
		process.StartedBy(m, func(e order.OrderPlaced) string { return e.OrderID },
			func(ctx context.Context, s *process.Step[Checkout], e order.OrderPlaced) error {
				if !s.New() {
					return nil // a redelivery of the start after a crash: already scheduled
				}
				return s.Schedule(ctx, windowTimeout, PaymentWindowClosed{OrderID: e.OrderID}, outbox.After(cfg.Window))
			}),
		process.Handles(m, func(e order.OrderPaid) string { return e.OrderID }, process.Ignore,
			func(ctx context.Context, s *process.Step[Checkout], _ order.OrderPaid) error { return finish(ctx, s) }),
		process.Handles(m, func(e order.OrderCancelled) string { return e.OrderID }, process.Ignore,
			func(ctx context.Context, s *process.Step[Checkout], _ order.OrderCancelled) error {
				return finish(ctx, s)
			}),
		process.Handles(m, func(e order.OrderPaymentFailed) string { return e.OrderID }, process.Ignore,
			func(ctx context.Context, s *process.Step[Checkout], e order.OrderPaymentFailed) error {
				s.State.Declines++
				if s.State.Declines > 1 {
					return nil // the retry schedule runs already
				}
				return s.Schedule(ctx, retryTimeout, PaymentRetryDue{OrderID: e.OrderID, Attempt: 1}, outbox.After(cfg.RetryInterval))
			}),
		process.OnTimeout(m, func(ctx context.Context, s *process.Step[Checkout], e PaymentWindowClosed) error {
			return cancelOrder(ctx, s, "payment_timeout")
		}),
		process.OnTimeout(m, func(ctx context.Context, s *process.Step[Checkout], e PaymentRetryDue) error {
			// The order decides: paid (or cancelled) while this timeout was
			// on its way, before its event reached the process, it needs
			// no reminder.
			var o order.Order
			if err := s.Tx.Take(&o, "id = ?", e.OrderID).Error; err != nil {
				return err
			}
			if o.Status != order.StatusPlaced {
				return finish(ctx, s)
			}
			if e.Attempt > cfg.Retries {
				return cancelOrder(ctx, s, "payment_declined")
			}
			s.State.Reminders = e.Attempt
			if err := s.Emit(ctx, PaymentReminder{OrderID: e.OrderID, Reminder: e.Attempt, Of: cfg.Retries}); err != nil {
				return err
			}
			return s.Schedule(ctx, retryTimeout, PaymentRetryDue{OrderID: e.OrderID, Attempt: e.Attempt + 1}, outbox.After(cfg.RetryInterval))
		}),
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("checkout process: %w", err)
	}
	return c, nil
}

func (a *App) checkoutRunner() (runner, error) {
	c, err := a.checkoutConsumer()
	if err != nil {
		return runner{}, err
	}
	a.consumers = append(a.consumers, c)
	return runner{name: checkoutGroup, run: c.Run}, nil
}

// paymentDeadline returns when the order's payment window closes, and
// whether it is open.
func (a *App) paymentDeadline(ctx context.Context, orderID string) (time.Time, bool, error) {
	var c Checkout
	err := a.db.WithContext(ctx).Where("tenant_id = ? AND process_key = ?", tenant.Default, orderID).Limit(1).Find(&c).Error
	if err != nil || c.Key == "" || c.Completed {
		return time.Time{}, false, err
	}
	return process.Deadline(ctx, a.units.Outbox(), &c.Base, checkoutProcess, windowTimeout)
}
