package order_test

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/examples/minishop/order"
)

func TestPlacePricesFromCatalog(t *testing.T) {
	t.Parallel()
	o, err := order.Place("o-1", "c1", []order.Item{{SKU: "apple", Qty: 2}, {SKU: "tea", Qty: 1}}, order.DefaultCatalog())
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
		{"c1", []order.Item{{SKU: "coffee", Qty: order.MaxQty + 1}}, order.ErrBadQuantity},
		{"c1", []order.Item{{SKU: "coffee", Qty: math.MaxInt}}, order.ErrBadQuantity},
		{"c1", make([]order.Item, order.MaxItems+1), order.ErrTooManyItems},
		{strings.Repeat("c", order.MaxCustomerIDLen+1), []order.Item{{SKU: "apple", Qty: 1}}, order.ErrBadCustomer},
		{"c\xff", []order.Item{{SKU: "apple", Qty: 1}}, order.ErrBadCustomer},
		{"c\u200b1", []order.Item{{SKU: "apple", Qty: 1}}, order.ErrBadCustomer},
		{"c\n1", []order.Item{{SKU: "apple", Qty: 1}}, order.ErrBadCustomer},
	}
	for _, c := range cases {
		_, err := order.Place("o-1", c.customer, c.items, cat)
		require.ErrorIs(t, err, c.want)
	}
}

func TestPayAndCancelFollowTheStateMachine(t *testing.T) {
	t.Parallel()
	o, err := order.Place("o-1", "c1", []order.Item{{SKU: "coffee", Qty: 1}}, order.DefaultCatalog())
	require.NoError(t, err)
	require.NoError(t, o.Pay())
	require.ErrorIs(t, o.Pay(), order.ErrNotPayable)
	require.ErrorIs(t, o.Cancel(), order.ErrNotCancelable)
	assert.Equal(t, order.OrderPaid{OrderID: "o-1", AmountCents: 950}, o.PendingEvents()[1].Event)
	evs := o.PendingEvents()
	require.Len(t, evs, 2)
	assert.Equal(t, "order.paid", evs[1].Topic())
	assert.Equal(t, int64(2), o.Version)

	c, err := order.Place("o-2", "c1", []order.Item{{SKU: "tea", Qty: 1}}, order.DefaultCatalog())
	require.NoError(t, err)
	require.NoError(t, c.Cancel())
	assert.Equal(t, order.StatusCancelled, c.Status)
	require.ErrorIs(t, c.Pay(), order.ErrNotPayable)
}

// TestTotalNeverOverflows prices the largest order a catalog allows: a
// price that would overflow the total is refused with ErrOverflow, never
// wrapped around to a negative amount.
func TestTotalNeverOverflows(t *testing.T) {
	t.Parallel()
	cat := order.Catalog{"gold": math.MaxInt64 / 1000}
	o, err := order.Place("o-1", "c1", []order.Item{{SKU: "gold", Qty: 1000}}, cat)
	require.NoError(t, err)
	assert.Equal(t, int64(math.MaxInt64/1000*1000), o.TotalCents)

	_, err = order.Place("o-2", "c1", []order.Item{{SKU: "gold", Qty: 1000}, {SKU: "gold", Qty: 1}}, cat)
	require.ErrorIs(t, err, order.ErrOverflow)

	cat["gold"] = math.MaxInt64/999 + 1
	_, err = order.Place("o-3", "c1", []order.Item{{SKU: "gold", Qty: 999}}, cat)
	require.ErrorIs(t, err, order.ErrOverflow)
}

// TestPaymentFailedKeepsTheOrderPayable records a declined payment: the
// order stays placed, OrderPaymentFailed carries the amount and reason, and
// the order can be paid afterwards; a paid order cannot fail a payment.
func TestPaymentFailedKeepsTheOrderPayable(t *testing.T) {
	t.Parallel()
	o, err := order.Place("o-1", "c1", []order.Item{{SKU: "tea", Qty: 2}}, order.DefaultCatalog())
	require.NoError(t, err)
	require.NoError(t, o.PaymentFailed("card declined"))
	assert.Equal(t, order.StatusPlaced, o.Status)
	evs := o.PendingEvents()
	require.Len(t, evs, 2)
	assert.Equal(t, order.OrderPaymentFailed{OrderID: "o-1", AmountCents: 1200, Reason: "card declined"}, evs[1].Event)
	require.NoError(t, o.Pay())
	require.ErrorIs(t, o.PaymentFailed("late"), order.ErrNotPayable)
}
