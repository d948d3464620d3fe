package bustest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// metaSeq is the metadata key of the sequence number the suite gives each
// message it publishes.
const metaSeq = "bustest_seq"

// check is the state of one running check: its TB, its Bus, the random
// prefix of its topic and group names, and the inbox its subscriptions
// deliver to.
type check struct {
	t      TB
	name   string
	bus    *Bus
	prefix string
	in     *inbox
}

// begin builds the Bus of a check.
func begin(t TB, f Factory, name string) *check {
	t.Helper()
	if f == nil {
		t.Fatalf("%s: nil Factory", name)
	}
	b := f(t)
	switch {
	case b == nil:
		t.Fatalf("%s: the Factory returned a nil Bus", name)
	case b.Publisher == nil:
		t.Fatalf("%s: Bus.Publisher is nil", name)
	case b.NewSubscriber == nil:
		t.Fatalf("%s: Bus.NewSubscriber is nil", name)
	}
	return &check{
		t:      t,
		name:   name,
		bus:    b,
		prefix: "bustest." + randomHex(6),
		in:     &inbox{out: make(chan delivery)},
	}
}

func (c *check) errorf(format string, args ...any) {
	c.t.Helper()
	c.t.Errorf(c.name+": "+format, args...)
}

func (c *check) fatalf(format string, args ...any) {
	c.t.Helper()
	c.t.Fatalf(c.name+": "+format, args...)
}

func (c *check) logf(format string, args ...any) {
	c.t.Helper()
	c.t.Logf(c.name+": "+format, args...)
}

// topic returns the check's topic named s, e.g. "bustest.1a2b3c4d5e6f.a".
func (c *check) topic(s string) string { return c.prefix + "." + s }

// group returns the check's consumer group named s.
func (c *check) group(s string) string { return c.prefix + "." + s }

// inbox gathers the deliveries of a check's subscriptions into one channel.
type inbox struct {
	out chan delivery
}

// delivery is a message and the consumer it came from.
type delivery struct {
	from *consumer
	msg  *message.Message
}

// consumer is one subscription of the check.
type consumer struct {
	c       *check
	name    string
	sub     message.Subscriber
	cancel  context.CancelFunc
	halt    chan struct{} // closed when the consumer crashes: it stops reading its channel
	closing chan struct{} // closed when the suite starts closing the consumer
	done    chan struct{} // closed when the subscription's channel is closed
	once    sync.Once
	closed  atomic.Bool
}

// subscribe creates a subscriber of group for topics, subscribes once and
// forwards its messages to the check's inbox. name says which consumer it is
// in failure messages. The consumer is closed at cleanup.
func (c *check) subscribe(name, group string, topics ...string) *consumer {
	c.t.Helper()
	sub, err := c.bus.NewSubscriber(c.t, group, topics)
	if err != nil {
		c.fatalf("NewSubscriber(%q, %q): %v", group, topics, err)
	}
	if sub == nil {
		c.fatalf("NewSubscriber(%q, %q) returned a nil subscriber", group, topics)
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &consumer{
		c:       c,
		name:    name,
		sub:     sub,
		cancel:  cancel,
		halt:    make(chan struct{}),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	ch, err := sub.Subscribe(ctx, group)
	if err != nil {
		cancel()
		_ = sub.Close()
		c.fatalf("Subscribe of %s: %v", name, err)
	}
	if ch == nil {
		cancel()
		_ = sub.Close()
		c.fatalf("Subscribe of %s returned a nil channel", name)
	}
	c.t.Cleanup(k.close)
	go k.forward(ch)
	return k
}

// forward relays the subscription's messages to the inbox until the
// channel is closed. Once the consumer is closing, it nacks what still
// comes instead, so that a subscriber that waits for its channel to be read
// can finish closing. Once the consumer crashes, it stops reading, leaving
// the message it holds neither acked nor nacked, until the consumer is
// closing.
func (k *consumer) forward(ch <-chan *message.Message) {
	defer close(k.done)
	for {
		select {
		case <-k.halt: // first, so that a crashed consumer reads no more
			<-k.closing
			for m := range ch {
				m.Nack()
			}
			return
		default:
		}
		var m *message.Message
		select {
		case <-k.halt:
			continue
		case got, ok := <-ch:
			if !ok {
				return
			}
			m = got
		}
		select {
		case <-k.closing:
			m.Nack()
			continue
		default:
		}
		select {
		case k.c.in.out <- delivery{from: k, msg: m}:
		case <-k.closing:
			m.Nack()
		case <-k.halt: // dropped, as by a crashed process
		}
	}
}

// close cancels the Subscribe context and closes the subscriber, waiting a
// bounded time for Close to return and for the channel to be closed. It
// reports problems with Errorf (it runs in cleanups). close and crash run
// once between them.
func (k *consumer) close() { k.once.Do(func() { k.shutdown(false) }) }

// crash ends the consumer as a crashed process does: it stops reading its
// channel at once, leaving what it holds neither acked nor nacked, and
// closes the subscriber without cancelling the Subscribe context, while
// messages may be waiting in the channel. Close must still return within
// closeTimeout (it is how a process shuts down after a handler failed);
// crash reports it with Errorf when it does not, and then ends the
// subscription as close does.
func (k *consumer) crash() { k.once.Do(func() { k.shutdown(true) }) }

func (k *consumer) shutdown(crash bool) {
	k.closed.Store(true)
	if crash {
		close(k.halt)
	} else {
		close(k.closing)
		k.cancel()
	}
	errc := make(chan error, 1)
	go func() { errc <- k.sub.Close() }()
	select {
	case err := <-errc:
		if err != nil {
			k.c.errorf("Close of %s: %v", k.name, err)
		}
	case <-time.After(closeTimeout):
		if !crash {
			k.c.errorf("Close of %s did not return within %v", k.name, closeTimeout)
			return
		}
		k.c.errorf("Close of %s did not return within %v while nobody read its channel and its Subscribe context was not cancelled: "+
			"a consumer whose reader stopped cannot be closed", k.name, closeTimeout)
		k.cancel() // to end it all the same
	}
	if crash {
		close(k.closing) // read what is left, to see the channel closed
	}
	select {
	case <-k.done:
	case <-time.After(closeTimeout):
		k.c.errorf("the channel of %s was not closed within %v of Close", k.name, closeTimeout)
	}
	k.cancel()
}

// next returns the next delivery of a consumer that is not closed, or false
// when none comes within d. Messages that a closed consumer still delivers
// are nacked and skipped.
func (c *check) next(d time.Duration) (delivery, bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case dl := <-c.in.out:
			if dl.from.closed.Load() {
				dl.msg.Nack()
				continue
			}
			return dl, true
		case <-timer.C:
			return delivery{}, false
		}
	}
}

// sent is a message the check published, with what identifies it in a
// failure message.
type sent struct {
	topic string
	seq   int
	msg   *message.Message
}

// batch is the messages a check published, by UUID.
type batch struct {
	list []sent
	byID map[string]int // index in list
}

func newBatch() *batch { return &batch{byID: map[string]int{}} }

// add builds a message of topic with sequence number seq (see newMessage)
// and records it.
func (c *check) add(b *batch, topic string, seq int) *message.Message {
	c.t.Helper()
	m := c.newMessage(topic, seq)
	b.byID[m.UUID] = len(b.list)
	b.list = append(b.list, sent{topic: topic, seq: seq, msg: m})
	return m
}

// get returns the sent message of id, or nil.
func (b *batch) get(id string) *sent {
	if i, ok := b.byID[id]; ok {
		return &b.list[i]
	}
	return nil
}

// missing returns, in publish order, the ids of the batch's messages that
// seen lacks.
func (b *batch) missing(seen map[string]int) []string {
	var out []string
	for _, s := range b.list {
		if seen[s.msg.UUID] == 0 {
			out = append(out, s.msg.UUID)
		}
	}
	return out
}

// describe lists the first maxListed ids as "id (topic #seq)".
func (b *batch) describe(ids []string) string {
	parts := make([]string, 0, min(len(ids), maxListed))
	for i, id := range ids {
		if i == maxListed {
			parts = append(parts, fmt.Sprintf("... %d more", len(ids)-maxListed))
			break
		}
		if s := b.get(id); s != nil {
			parts = append(parts, fmt.Sprintf("%s (%s #%d)", id, s.topic, s.seq))
		} else {
			parts = append(parts, id)
		}
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// newMessage builds a message the way bento's relay does, with
// [messaging.NewMessage] from an outbox row: a fresh ULID, the topic as
// event type, an aggregate per topic whose version is seq+1, and seq in
// the metadata under metaSeq.
func (c *check) newMessage(topic string, seq int) *message.Message {
	c.t.Helper()
	m, err := messaging.NewMessage(&outbox.Message{
		ID:               aggregate.NewID(),
		TenantID:         "bustest",
		Topic:            topic,
		AggregateType:    "bustest",
		AggregateID:      topic,
		AggregateVersion: int64(seq + 1),
		SchemaVersion:    1,
		Payload:          outbox.JSON(fmt.Sprintf(`{"seq":%d}`, seq)),
		Metadata:         outbox.Metadata{metaSeq: strconv.Itoa(seq)},
		OccurredAt:       time.Now(),
	})
	if err != nil {
		c.fatalf("build message: %v", err)
	}
	return m
}

// publish publishes msgs one per Publish call, in order, and fails the
// check on the first error.
func (c *check) publish(topic string, msgs ...*message.Message) {
	c.t.Helper()
	if err := publishIn(c.bus.Publisher, 1, topic, msgs); err != nil {
		c.fatalf("%v", err)
	}
}

// publishIn publishes msgs in order, size of them per Publish call (the
// last call may take fewer), and returns the first error.
func publishIn(p message.Publisher, size int, topic string, msgs []*message.Message) error {
	for i := 0; i < len(msgs); i += size {
		part := msgs[i:min(i+size, len(msgs))]
		if err := p.Publish(topic, part...); err != nil {
			if len(part) == 1 {
				return fmt.Errorf("Publish of message %d of %d (%s) to %q: %w", i+1, len(msgs), part[0].UUID, topic, err)
			}
			return fmt.Errorf("Publish of messages %d to %d of %d (%s, ...) to %q: %w", i+1, i+len(part), len(msgs), part[0].UUID, topic, err)
		}
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// receive calls fn for each delivery until done reports true, no delivery
// comes within idle, or checkTimeout passes. It reports whether done.
func (c *check) receive(idle time.Duration, fn func(delivery), done func() bool) bool {
	c.t.Helper()
	deadline := time.Now().Add(checkTimeout)
	for !done() {
		wait := min(idle, time.Until(deadline))
		if wait <= 0 {
			return false
		}
		d, ok := c.next(wait)
		if !ok {
			return false
		}
		fn(d)
	}
	return true
}

// listen calls fn for each delivery that comes within d.
func (c *check) listen(d time.Duration, fn func(delivery)) {
	c.t.Helper()
	end := time.Now().Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			return
		}
		dl, ok := c.next(left)
		if !ok {
			return
		}
		fn(dl)
	}
}
