package bustest

// CheckConsumerGroups publishes 200 messages to one topic with three groups
// subscribed: g1 and g2 with one consumer each, g3 with two. Each of g1 and
// g2 must get every message (fan-out across groups). In g3 every message
// must be acked exactly once across its two consumers, and each consumer
// must have received some (competing consumers within a group). With
// Bus.SingleActiveConsumer, exactly one of g3's consumers must have received
// messages, all of them, and the other none (it stands by).
func CheckConsumerGroups(t TB, f Factory) {
	t.Helper()
	c := begin(t, f, "CheckConsumerGroups")
	topic := c.topic("a")
	g1 := c.subscribe("the consumer of group g1", c.group("g1"), topic)
	g2 := c.subscribe("the consumer of group g2", c.group("g2"), topic)
	g3a := c.subscribe("consumer 1 of group g3", c.group("g3"), topic)
	g3b := c.subscribe("consumer 2 of group g3", c.group("g3"), topic)

	const n = 200
	b := newBatch()
	for seq := range n {
		c.publish(topic, c.add(b, topic, seq))
	}

	seen := map[*consumer]map[string]int{g1: {}, g2: {}, g3a: {}, g3b: {}}
	acked3 := map[string]int{} // acks per message across g3's consumers
	var unknown []string
	take := func(d delivery) {
		id := d.msg.UUID
		d.msg.Ack()
		if b.get(id) == nil {
			unknown = append(unknown, id)
			return
		}
		seen[d.from][id]++
		if d.from == g3a || d.from == g3b {
			acked3[id]++
		}
	}
	done := func() bool { return len(seen[g1]) == n && len(seen[g2]) == n && len(acked3) == n }
	if c.receive(idleTimeout, take, done) {
		c.listen(quietPeriod, take)
	}

	for _, g := range []*consumer{g1, g2} {
		if missing := b.missing(seen[g]); len(missing) > 0 {
			c.errorf("%s got %d of %d messages (waited %v after the last one); missing: %s",
				g.name, n-len(missing), n, idleTimeout, b.describe(missing))
		}
	}
	if missing := b.missing(acked3); len(missing) > 0 {
		c.errorf("group g3 (two consumers) got %d of %d messages (waited %v after the last one); missing: %s",
			n-len(missing), n, idleTimeout, b.describe(missing))
	}
	var twice []string
	for _, s := range b.list {
		if acked3[s.msg.UUID] > 1 {
			twice = append(twice, s.msg.UUID)
		}
	}
	if len(twice) > 0 {
		c.errorf("%d messages were acked more than once across the two consumers of group g3, which must share the group's messages: %s",
			len(twice), b.describe(twice))
	}
	switch {
	case c.bus.SingleActiveConsumer:
		if (len(seen[g3a]) == 0) == (len(seen[g3b]) == 0) {
			c.errorf("%s received %d messages and %s %d: with Bus.SingleActiveConsumer exactly one of them must receive the group's messages",
				g3a.name, len(seen[g3a]), g3b.name, len(seen[g3b]))
		}
	case len(seen[g3a]) == 0 || len(seen[g3b]) == 0:
		c.errorf("%s received %d messages and %s %d: both must receive some of the %d (competing consumers; set Bus.SingleActiveConsumer for a bus whose consumers do not compete)",
			g3a.name, len(seen[g3a]), g3b.name, len(seen[g3b]), n)
	default:
		c.logf("group g3 split %d messages %d/%d", n, len(seen[g3a]), len(seen[g3b]))
	}
	if len(unknown) > 0 {
		c.errorf("%d messages with an unknown UUID arrived: %s", len(unknown), b.describe(unknown))
	}
}
