package aggregate_test

import (
	"errors"
	"fmt"

	"github.com/bentoevents/bento/aggregate"
)

// Order is an aggregate: a GORM model that embeds aggregate.Base.
type Order struct {
	aggregate.Base
	Status string
}

// AggregateType names the aggregate on every outbox row.
func (*Order) AggregateType() string { return "order" }

// OrderPaid is a domain event: a past-tense fact with its wire name.
type OrderPaid struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// EventType is the topic the event is published under.
func (OrderPaid) EventType() string { return "order.paid" }

// Pay validates, changes state, and records what happened.
func (o *Order) Pay(amount int64) error {
	if o.Status != "placed" {
		return errors.New("only a placed order can be paid")
	}
	o.Status = "paid"
	o.Record(OrderPaid{OrderID: o.ID, AmountCents: amount})
	return nil
}

func ExampleBase_Record() {
	o := &Order{Status: "placed"}
	o.ID = "order-1"
	o.Version = 1 // as loaded from the database

	if err := o.Pay(1200); err != nil {
		fmt.Println(err)
	}
	fmt.Println(o.Pay(1200)) // the second payment is refused

	for _, ev := range o.PendingEvents() {
		fmt.Printf("%s v%d %+v\n", ev.Topic(), ev.AggregateVersion, ev.Event)
	}
	fmt.Println("stored version:", o.PersistedVersion(), "new version:", o.Version)
	// Output:
	// only a placed order can be paid
	// order.paid v2 {OrderID:order-1 AmountCents:1200}
	// stored version: 1 new version: 2
}
