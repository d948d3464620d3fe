package bustest

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// CheckDelivery publishes 300 messages over 3 topics, from 3 goroutines (one
// per topic), to a group subscribed to the 3 topics: one message per
// Publish call to the first topic, 10 per call to the second, and all 100
// in one call to the third (Publish takes several messages, and a
// publisher may pipeline them). Every message must arrive at least once
// (each delivery is acked), and nothing else may arrive: a message with a
// UUID the check did not publish is a failure. Duplicates are logged, not
// failed.
func CheckDelivery(t TB, f Factory) {
	t.Helper()
	c := begin(t, f, "CheckDelivery")
	topics := []string{c.topic("a"), c.topic("b"), c.topic("c")}
	c.subscribe("the consumer of group g", c.group("g"), topics...)

	const perTopic = 100
	b := newBatch()
	msgs := make([][]*message.Message, len(topics))
	for i, topic := range topics {
		for seq := range perTopic {
			msgs[i] = append(msgs[i], c.add(b, topic, seq))
		}
	}
	total := len(b.list)

	sizes := []int{1, 10, perTopic} // messages per Publish call, by topic
	errs := make([]error, len(topics))
	var wg sync.WaitGroup
	for i, topic := range topics {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = publishIn(c.bus.Publisher, sizes[i], topic, msgs[i])
		}()
	}
	published := make(chan struct{})
	go func() { wg.Wait(); close(published) }()

	seen := map[string]int{}
	var unknown []string
	duplicates := 0
	take := func(d delivery) {
		id := d.msg.UUID
		d.msg.Ack()
		if b.get(id) == nil {
			unknown = append(unknown, id)
			return
		}
		if seen[id] > 0 {
			duplicates++
		}
		seen[id]++
	}
	c.receive(idleTimeout, take, func() bool { return len(seen) == total })

	select {
	case <-published:
	case <-time.After(idleTimeout):
		c.fatalf("the Publish calls did not return within %v of the last delivery", idleTimeout)
	}
	if err := errors.Join(errs...); err != nil {
		c.fatalf("publishing failed: %v", err)
	}
	if len(seen) == total {
		c.listen(quietPeriod, take)
	}

	if missing := b.missing(seen); len(missing) > 0 {
		c.errorf("%d of %d messages arrived (waited %v after the last one); missing: %s",
			total-len(missing), total, idleTimeout, b.describe(missing))
	}
	if len(unknown) > 0 {
		c.errorf("%d messages with an unknown UUID arrived: %s", len(unknown), b.describe(unknown))
	}
	if duplicates > 0 {
		c.logf("%d duplicate deliveries (allowed: delivery is at least once)", duplicates)
	}
}

// CheckOrderPerTopic checks, when Bus.OrderedPerTopic is set, that one
// consumer receives 200 messages of one topic, published one after the
// other (the first 100 one per Publish call, the others 20 per call), in
// publish order: the sequence numbers the check puts in the metadata of its
// messages must increase along the first delivery of each message. Redeliveries may come later; all 200 must arrive. When the bus
// does not promise order, the check logs that and returns.
func CheckOrderPerTopic(t TB, f Factory) {
	t.Helper()
	c := begin(t, f, "CheckOrderPerTopic")
	if !c.bus.OrderedPerTopic {
		c.logf("skipped: Bus.OrderedPerTopic is false")
		return
	}
	topic := c.topic("a")
	c.subscribe("the consumer of group g", c.group("g"), topic)

	const n = 200
	b := newBatch()
	var msgs []*message.Message
	for seq := range n {
		msgs = append(msgs, c.add(b, topic, seq))
	}
	c.publish(topic, msgs[:n/2]...)
	if err := publishIn(c.bus.Publisher, 20, topic, msgs[n/2:]); err != nil {
		c.fatalf("%v", err)
	}

	seen := map[string]int{}
	var firsts []*sent // first deliveries, in arrival order
	var unknown []string
	var badSeq []string
	take := func(d delivery) {
		id := d.msg.UUID
		d.msg.Ack()
		s := b.get(id)
		if s == nil {
			unknown = append(unknown, id)
			return
		}
		seen[id]++
		if seen[id] > 1 {
			return
		}
		if got, want := d.msg.Metadata.Get(metaSeq), fmt.Sprint(s.seq); got != want {
			badSeq = append(badSeq, fmt.Sprintf("%s: %s %q, want %q", id, metaSeq, got, want))
		}
		firsts = append(firsts, s)
	}
	c.receive(idleTimeout, take, func() bool { return len(seen) == n })

	if missing := b.missing(seen); len(missing) > 0 {
		c.errorf("%d of %d messages arrived (waited %v after the last one); missing: %s",
			n-len(missing), n, idleTimeout, b.describe(missing))
	}
	if len(unknown) > 0 {
		c.errorf("%d messages with an unknown UUID arrived: %s", len(unknown), b.describe(unknown))
	}
	if len(badSeq) > 0 {
		c.errorf("%d messages arrived with another sequence number than published: %v", len(badSeq), badSeq[:min(len(badSeq), maxListed)])
	}
	late := 0
	var first string
	var highest *sent
	for _, s := range firsts {
		if highest != nil && s.seq < highest.seq {
			if late == 0 {
				first = fmt.Sprintf("#%d (%s) arrived after #%d (%s)", s.seq, s.msg.UUID, highest.seq, highest.msg.UUID)
			}
			late++
			continue
		}
		highest = s
	}
	if late > 0 {
		c.errorf("%d of %d messages arrived out of publish order; first: %s", late, len(firsts), first)
	}
}
