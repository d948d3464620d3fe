// Package bentotest is the kit for testing code built on bento: aggregates,
// commands and consumer handlers, in milliseconds, with no services.
//
// [New] gives an [Env]: a migrated SQLite database in a temporary directory,
// the in-memory bus, a unit-of-work manager and an outbox projector, all on a
// fake [Clock] with deterministic ids. A test then reads like the system
// works:
//
//	env := bentotest.New(t, nil)
//	env.Migrate(t, &Order{})
//	notifications := env.MustConsumer(t, "notification")
//	consumer.Handle(notifications, handleOrderPaid)
//	env.Start(t, notifications)
//
//	payOrder(ctx, env.Units, id)        // the command
//	env.Drain(t)                        // relay everything, run the consumers until quiet
//	env.RequirePublished(t, bentotest.Want{Topic: "order.paid", AggregateID: id})
//	// ... assert the handler's effect
//
// Assertions: [RequireRecorded] (an aggregate's pending events),
// [Env.RequireCommitted] (the outbox), [Env.RequirePublished] (what reached
// the bus), each matching events by topic, aggregate and payload (a Go value
// compared as JSON). [Env.RequireAppliedOnce] delivers one message several
// times, in sequence and concurrently, and checks that its effect happened
// once.
//
// Every helper takes a [TB], the small part of testing.TB it uses, so the kit
// works with any test framework; [Recorder] is a TB that records failures,
// for examples and for testing assertions themselves.
package bentotest
