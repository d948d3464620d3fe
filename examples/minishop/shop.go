package main

import (
	"context"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/uow"
)

// PlaceOrder places a new order: the order and its order.placed event
// commit together (in the idempotency ledger's transaction when the request
// carries an Idempotency-Key).
func (a *App) PlaceOrder(ctx context.Context, customerID string, items []order.Item) (*order.Order, error) {
	o, err := order.Place(aggregate.NewID(), customerID, items, a.catalog, nil)
	if err != nil {
		return nil, err
	}
	if err := a.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(o) }); err != nil {
		return nil, err
	}
	return o, nil
}

// PayOrder pays an order for its total.
func (a *App) PayOrder(ctx context.Context, id string) (*order.Order, error) {
	return a.changeOrder(ctx, id, (*order.Order).Pay)
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
