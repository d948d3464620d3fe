package bustest

import (
	"time"
)

// CheckNackRedelivery publishes one message and nacks its first delivery:
// it must come back, within Bus.RedeliveryTimeout, with the same UUID,
// metadata and payload. Once that delivery is acked, the message must not
// come back (the check listens for a second).
func CheckNackRedelivery(t TB, f Factory) {
	t.Helper()
	c := begin(t, f, "CheckNackRedelivery")
	topic := c.topic("a")
	c.subscribe("the consumer of group g", c.group("g"), topic)
	b := newBatch()
	m := c.add(b, topic, 0)
	c.publish(topic, m)

	d, ok := c.next(idleTimeout)
	if !ok {
		c.fatalf("message %s was not delivered within %v", m.UUID, idleTimeout)
	}
	if d.msg.UUID != m.UUID {
		d.msg.Ack()
		c.fatalf("a message with an unknown UUID %q arrived, want %s", d.msg.UUID, m.UUID)
	}
	d.msg.Nack()

	rt := c.bus.redeliveryTimeout()
	deadline := time.Now().Add(rt)
	for {
		d, ok := c.next(time.Until(deadline))
		if !ok {
			c.fatalf("the nacked message %s did not come back within %v", m.UUID, rt)
		}
		if d.msg.UUID != m.UUID {
			d.msg.Ack()
			c.errorf("a message with an unknown UUID %q arrived", d.msg.UUID)
			continue
		}
		c.compare("the redelivered message", m, d.msg)
		d.msg.Ack()
		break
	}

	back := 0
	c.listen(ackedQuiet, func(d delivery) {
		d.msg.Ack()
		if d.msg.UUID == m.UUID {
			back++
			return
		}
		c.errorf("a message with an unknown UUID %q arrived", d.msg.UUID)
	})
	if back > 0 {
		c.errorf("message %s came back %d times within %v after it was acked", m.UUID, back, ackedQuiet)
	}
}

// CheckDroppedConnection publishes three messages to a group and receives
// the first delivery without acking it; then the consumer crashes: it
// stops reading its channel, leaving the messages it holds neither acked
// nor nacked, and its subscriber is closed while its Subscribe context
// stays live, as when a process shuts down after a handler failed or its
// connection dropped. Close must return and the channel must be closed
// within 10 s, however many messages wait in it unread. A new subscriber of
// the same group must then receive that message again, with the same UUID,
// and the other two, within Bus.RedeliveryTimeout.
func CheckDroppedConnection(t TB, f Factory) {
	t.Helper()
	c := begin(t, f, "CheckDroppedConnection")
	topic, group := c.topic("a"), c.group("g")
	first := c.subscribe("the first consumer of group g", group, topic)
	b := newBatch()
	for seq := range 3 {
		c.add(b, topic, seq)
	}
	for _, s := range b.list {
		c.publish(topic, s.msg)
	}

	d, ok := c.next(idleTimeout)
	if !ok {
		c.fatalf("no message was delivered within %v", idleTimeout)
	}
	held := d.msg.UUID
	if b.get(held) == nil {
		d.msg.Ack()
		c.fatalf("a message with an unknown UUID %q arrived", held)
	}
	first.crash() // with held delivered and neither acked nor nacked

	c.subscribe("the second consumer of group g", group, topic)
	rt := c.bus.redeliveryTimeout()
	seen := map[string]int{}
	c.receive(rt, func(d delivery) {
		d.msg.Ack()
		if b.get(d.msg.UUID) == nil {
			c.errorf("a message with an unknown UUID %q arrived", d.msg.UUID)
			return
		}
		if seen[d.msg.UUID] == 0 && d.msg.UUID == held {
			c.compare("the redelivered message", b.get(held).msg, d.msg)
		}
		seen[d.msg.UUID]++
	}, func() bool { return len(seen) == len(b.list) })

	if seen[held] == 0 {
		c.errorf("message %s, delivered to a subscriber that was closed before acking it, did not come back to the group within %v: a dropped connection would lose it",
			held, rt)
	}
	if missing := b.missing(seen); len(missing) > 0 {
		c.errorf("%d of %d messages reached the second consumer of the group (waited %v); missing: %s",
			len(b.list)-len(missing), len(b.list), rt, b.describe(missing))
	}
}
