package order_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/examples/minishop/order"
)

func TestPlacePricesFromCatalog(t *testing.T) {
	t.Parallel()
	o, err := order.Place("o-1", "c1", []order.Item{{SKU: "apple", Qty: 2}, {SKU: "tea", Qty: 1}}, order.DefaultCatalog(), nil)
	require.NoError(t, err)
	assert.Equal(t, int64(2*120+600), o.TotalCents)
	assert.Equal(t, order.StatusPlaced, o.Status)
	evs := o.PendingEvents()
	require.Len(t, evs, 1)
	placed := evs[0].Event.(order.OrderPlaced)
	assert.Equal(t, "order.placed", evs[0].Topic())
	assert.Equal(t, int64(840), placed.TotalCents)
	assert.Equal(t, int64(120), placed.Items[0].PriceCents)
}

func TestPlaceRejectsBadInput(t *testing.T) {
	t.Parallel()
	cat := order.DefaultCatalog()
	cases := []struct {
		customer string
		items    []order.Item
		want     error
	}{
		{"c1", nil, order.ErrNoItems},
		{"", []order.Item{{SKU: "apple", Qty: 1}}, order.ErrNoCustomer},
		{"c1", []order.Item{{SKU: "apple", Qty: 0}}, order.ErrBadQuantity},
		{"c1", []order.Item{{SKU: "durian", Qty: 1}}, order.ErrUnknownSKU},
	}
	for _, c := range cases {
		_, err := order.Place("o-1", c.customer, c.items, cat, nil)
		require.ErrorIs(t, err, c.want)
	}
}

func TestPayAndCancelFollowTheStateMachine(t *testing.T) {
	t.Parallel()
	o, err := order.Place("o-1", "c1", []order.Item{{SKU: "coffee", Qty: 1}}, order.DefaultCatalog(), nil)
	require.NoError(t, err)
	require.NoError(t, o.Pay())
	require.ErrorIs(t, o.Pay(), order.ErrNotPayable)
	require.ErrorIs(t, o.Cancel(), order.ErrNotCancelable)
	assert.Equal(t, order.OrderPaid{OrderID: "o-1", AmountCents: 950}, o.PendingEvents()[1].Event)
	evs := o.PendingEvents()
	require.Len(t, evs, 2)
	assert.Equal(t, "order.paid", evs[1].Topic())
	assert.Equal(t, int64(2), o.Version)

	c, err := order.Place("o-2", "c1", []order.Item{{SKU: "tea", Qty: 1}}, order.DefaultCatalog(), nil)
	require.NoError(t, err)
	require.NoError(t, c.Cancel())
	assert.Equal(t, order.StatusCancelled, c.Status)
	require.ErrorIs(t, c.Pay(), order.ErrNotPayable)
}
