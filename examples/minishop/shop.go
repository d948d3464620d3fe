package main

import (
	"context"
	"errors"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/uow"
)

// PlaceOrder places a new order: the order and its order.placed event
// commit together (in the idempotency ledger's transaction when the request
// carries an Idempotency-Key).
func (a *App) PlaceOrder(ctx context.Context, customerID string, items []order.Item) (*order.Order, error) {
	o, err := order.Place(aggregate.NewID(), customerID, items, a.catalog)
	if err != nil {
		return nil, err
	}
	if err := a.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(o) }); err != nil {
		return nil, err
	}
	return o, nil
}

// DeclinedCard is the test card whose payments are always declined: paying
// with it records order.payment_failed and leaves the order payable.
const DeclinedCard = "4000-0000-0000-0002"

// ErrPaymentDeclined is returned by PayOrderWith when the card is declined;
// the failure was recorded (order.payment_failed) and the order is still
// placed.
var ErrPaymentDeclined = errors.New("minishop: payment declined")

// PayOrder pays an order for its total.
func (a *App) PayOrder(ctx context.Context, id string) (*order.Order, error) {
	return a.changeOrder(ctx, id, (*order.Order).Pay)
}

// PayOrderWith pays an order with card. A declined card (DeclinedCard)
// commits order.payment_failed and returns the order with
// ErrPaymentDeclined.
func (a *App) PayOrderWith(ctx context.Context, id, card string) (*order.Order, error) {
	if card != DeclinedCard {
		return a.PayOrder(ctx, id)
	}
	o, err := a.changeOrder(ctx, id, func(o *order.Order) error { return o.PaymentFailed("card declined") })
	if err != nil {
		return o, err
	}
	return o, ErrPaymentDeclined
}

// CancelOrder cancels an order.
func (a *App) CancelOrder(ctx context.Context, id string) (*order.Order, error) {
	return a.changeOrder(ctx, id, (*order.Order).Cancel)
}

func (a *App) changeOrder(ctx context.Context, id string, change func(*order.Order) error) (*order.Order, error) {
	var o *order.Order
	err := a.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
		var err error
		if o, err = uow.Get[order.Order](ctx, u, id); err != nil {
			return err
		}
		return change(o)
	})
	return o, err
}
