package messaging_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/buscheck"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// waitFor bounds every wait of these tests.
const waitFor = buscheck.WaitFor

func newBus(t *testing.T) *messaging.MemoryBus {
	t.Helper()
	b := messaging.NewMemoryBus()
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func subscribe(t *testing.T, s message.Subscriber) <-chan *message.Message {
	t.Helper()
	ch, err := s.Subscribe(t.Context(), "ignored")
	require.NoError(t, err)
	return ch
}

// receive returns the next message of ch, failing the test after waitFor.
func receive(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	return buscheck.Receive(t, ch)
}

// requireClosed waits for ch to be closed, failing on any message.
func requireClosed(t *testing.T, ch <-chan *message.Message) {
	t.Helper()
	buscheck.RequireClosed(t, ch)
}

func msg(id string) *message.Message {
	return message.NewMessage(id, []byte(`{"id":"`+id+`"}`))
}

func TestMemoryBusRoutesByPatternToEachGroup(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	require.NoError(t, b.DeclareAlternate("")) // refuse what no binding matches
	billing := subscribe(t, b.Subscriber("billing", "order.*", "end"))
	audit := subscribe(t, b.Subscriber("audit", "#.paid", "end"))

	require.NoError(t, b.Publish("order.paid", msg("1")))                               // both
	require.NoError(t, b.Publish("order.created", msg("2")))                            // billing
	require.ErrorIs(t, b.Publish("order.paid.late", msg("3")), messaging.ErrUnroutable) // neither
	require.NoError(t, b.Publish("invoice.paid", msg("4")))                             // audit
	require.NoError(t, b.Publish("end", msg("end")))                                    // both, last

	collect := func(ch <-chan *message.Message) []string {
		var ids []string
		for {
			m := receive(t, ch)
			ids = append(ids, m.UUID)
			require.True(t, m.Ack())
			if m.UUID == "end" {
				return ids
			}
		}
	}
	assert.Equal(t, []string{"1", "2", "end"}, collect(billing))
	assert.Equal(t, []string{"1", "4", "end"}, collect(audit))
}

func TestMemoryBusGroupsGetOwnCopies(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	a := subscribe(t, b.Subscriber("a", "order.paid"))
	c := subscribe(t, b.Subscriber("c", "order.paid"))
	orig := msg("1")
	orig.Metadata.Set("k", "v")
	require.NoError(t, b.Publish("order.paid", orig))
	orig.Payload[0] = 'X' // the bus keeps its own bytes

	ma, mc := receive(t, a), receive(t, c)
	assert.NotSame(t, ma, mc)
	assert.NotSame(t, orig, ma)
	assert.Equal(t, `{"id":"1"}`, string(ma.Payload))
	assert.Equal(t, `{"id":"1"}`, string(mc.Payload))
	assert.Equal(t, "v", ma.Metadata.Get("k"))
	// Acking one group's copy does not ack the other's.
	ma.Ack()
	mc.Nack()
	assert.Equal(t, "1", receive(t, c).UUID)
}

func TestMemoryBusCompetingConsumers(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	const n = 300
	s1 := b.Subscriber("workers", "job.*")
	s2 := b.Subscriber("workers", "job.*")
	chans := []<-chan *message.Message{subscribe(t, s1), subscribe(t, s1), subscribe(t, s2)}

	var (
		mu   sync.Mutex
		seen = map[string]int{}
		per  = make([]int, len(chans))
		wg   sync.WaitGroup
		all  = make(chan struct{})
	)
	for i, ch := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case m := <-ch:
					mu.Lock()
					seen[m.UUID]++
					per[i]++
					done := len(seen) == n
					mu.Unlock()
					m.Ack()
					if done {
						close(all)
					}
				case <-all:
					return
				}
			}
		}()
	}
	for i := range n {
		require.NoError(t, b.Publish("job.run", msg(fmt.Sprint(i))))
	}
	select {
	case <-all:
	case <-time.After(waitFor):
		t.Fatal("not every message delivered")
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, seen, n)
	for id, c := range seen {
		assert.Equal(t, 1, c, "message %s delivered %d times", id, c)
	}
	t.Logf("deliveries per consumer: %v", per)
}

// TestMemoryBusConsumersTakeTurns checks that consumers of a group are
// served first come, first served from the moment Subscribe returns, so a
// consumer whose goroutine the scheduler runs late still gets its share
// (CI once saw one consumer of two take all 200 messages).
func TestMemoryBusConsumersTakeTurns(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	s := b.Subscriber("workers", "job.*")
	first, second := subscribe(t, s), subscribe(t, s)
	for i := range 4 {
		require.NoError(t, b.Publish("job.run", msg(fmt.Sprint(i))))
	}
	// The first consumer acks at once; the second holds its message. The
	// second must still have been handed message 1 before the first
	// consumer came back for more.
	m0 := receive(t, first)
	assert.Equal(t, "0", m0.UUID)
	m0.Ack()
	m2 := receive(t, first)
	assert.Equal(t, "2", m2.UUID, "the first consumer took the second consumer's turn")
	m1 := receive(t, second)
	assert.Equal(t, "1", m1.UUID)
	m2.Ack()
	m1.Ack()
}

func TestMemoryBusNackRedelivers(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	ch := subscribe(t, b.Subscriber("g", "order.*"))
	orig := msg("m1")
	orig.Metadata.Set("tenant_id", "acme")
	require.NoError(t, b.Publish("order.paid", orig, msg("m2")))

	first := receive(t, ch)
	require.Equal(t, "m1", first.UUID)
	require.True(t, first.Nack())
	select {
	case <-first.Context().Done():
	case <-time.After(waitFor):
		t.Fatal("message context not cancelled after nack")
	}

	again := receive(t, ch)
	assert.NotSame(t, first, again, "each delivery is a fresh copy")
	assert.Equal(t, "m1", again.UUID, "nacked message comes back first")
	assert.Equal(t, "acme", again.Metadata.Get("tenant_id"))
	assert.Equal(t, string(orig.Payload), string(again.Payload))
	again.Ack()
	assert.Equal(t, "m2", receive(t, ch).UUID)
}

func TestMemoryBusUnroutable(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	require.NoError(t, b.DeclareAlternate("")) // refuse what no binding matches
	err := b.Publish("invoice.sent", msg("lost"))
	require.ErrorIs(t, err, messaging.ErrUnroutable)

	require.NoError(t, b.DeclareQueue("billing", "order.*"))
	err = b.Publish("invoice.sent", msg("lost2"))
	require.ErrorIs(t, err, messaging.ErrUnroutable)

	// Binding the topic later does not bring the unroutable ones back.
	require.NoError(t, b.DeclareQueue("billing", "invoice.*"))
	require.NoError(t, b.Publish("invoice.sent", msg("kept")))
	ch := subscribe(t, b.Subscriber("billing", "order.*"))
	assert.Equal(t, "kept", receive(t, ch).UUID)
}

func TestMemoryBusBuffersBeforeConsumer(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	require.NoError(t, b.DeclareQueue("late", "order.#"))
	require.NoError(t, b.DeclareQueue("late", "order.#")) // idempotent
	for i := range 5 {
		require.NoError(t, b.Publish("order.paid", msg(fmt.Sprint(i))))
	}
	ch := subscribe(t, b.Subscriber("late", "order.#"))
	for i := range 5 {
		m := receive(t, ch)
		assert.Equal(t, fmt.Sprint(i), m.UUID)
		m.Ack()
	}
}

func TestMemoryBusFIFOPerQueue(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	ch := subscribe(t, b.Subscriber("g", "#"))
	const n = 2000 // beyond the queue's compaction threshold
	go func() {
		for i := range n {
			if err := b.Publish(fmt.Sprintf("t%d", i%3), msg(fmt.Sprint(i))); err != nil {
				panic(err)
			}
		}
	}()
	for i := range n {
		m := receive(t, ch)
		require.Equal(t, fmt.Sprint(i), m.UUID)
		if i%100 == 0 { // a nack puts the message back at the head
			m.Nack()
			m = receive(t, ch)
			require.Equal(t, fmt.Sprint(i), m.UUID)
		}
		m.Ack()
	}
}

func TestMemoryBusMessageContext(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	type key struct{}
	ctx := context.WithValue(t.Context(), key{}, "sub")
	ch, err := b.Subscriber("g", "a").Subscribe(ctx, "")
	require.NoError(t, err)
	require.NoError(t, b.Publish("a", msg("1")))
	m := receive(t, ch)
	assert.Equal(t, "sub", m.Context().Value(key{}))
	require.NoError(t, m.Context().Err())
	m.Ack()
	select {
	case <-m.Context().Done():
	case <-time.After(waitFor):
		t.Fatal("message context not cancelled after ack")
	}
}

func TestMemoryBusContextCancelRequeues(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	ctx, cancel := context.WithCancel(t.Context())
	ch1, err := b.Subscriber("g", "a").Subscribe(ctx, "")
	require.NoError(t, err)
	require.NoError(t, b.Publish("a", msg("1")))
	inflight := receive(t, ch1)
	cancel()
	requireClosed(t, ch1)

	ch2 := subscribe(t, b.Subscriber("g", "a"))
	m := receive(t, ch2)
	assert.Equal(t, "1", m.UUID, "un-acked message requeued")
	assert.NotSame(t, inflight, m)
	m.Ack()
}

func TestMemoryBusSubscriberClose(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	s := b.Subscriber("g", "a")
	ch1, ch2 := subscribe(t, s), subscribe(t, s)
	require.NoError(t, b.Publish("a", msg("1")))
	var inflight *message.Message
	select {
	case inflight = <-ch1:
	case inflight = <-ch2:
	case <-time.After(waitFor):
		t.Fatal("no message")
	}
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	requireClosed(t, ch1)
	requireClosed(t, ch2)
	_, err := s.Subscribe(t.Context(), "")
	require.ErrorIs(t, err, messaging.ErrClosed)

	// The bus lives on; the un-acked message waits for the next consumer.
	require.NoError(t, b.Publish("a", msg("2")))
	ch3 := subscribe(t, b.Subscriber("g", "a"))
	assert.Equal(t, inflight.UUID, receive(t, ch3).UUID)
}

func TestMemoryBusClose(t *testing.T) {
	t.Parallel()
	b := messaging.NewMemoryBus()
	idle := subscribe(t, b.Subscriber("idle", "a"))
	busy := subscribe(t, b.Subscriber("busy", "b"))
	require.NoError(t, b.Publish("b", msg("1")))
	_ = receive(t, busy) // in flight, never acked

	require.NoError(t, b.Close())
	require.NoError(t, b.Close())
	requireClosed(t, idle)
	requireClosed(t, busy)
	require.ErrorIs(t, b.Publish("a", msg("2")), messaging.ErrClosed)
	require.ErrorIs(t, b.DeclareQueue("g", "a"), messaging.ErrClosed)
	_, err := b.Subscriber("g", "a").Subscribe(t.Context(), "")
	require.ErrorIs(t, err, messaging.ErrClosed)
}

func TestMemoryBusRejectsBadNames(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	for _, tc := range []struct {
		group    string
		patterns []string
	}{
		{"", []string{"a"}},
		{"amq.g", []string{"a"}},
		{"has space", []string{"a"}},
		{"g", nil},
		{"g", []string{""}},
		{"g", []string{"order..paid"}},
		{"g", []string{"order.pa*"}},
		{"g", []string{"order.paid."}},
	} {
		require.ErrorIs(t, b.DeclareQueue(tc.group, tc.patterns...), messaging.ErrInvalidName, "%q %q", tc.group, tc.patterns)
		_, err := b.Subscriber(tc.group, tc.patterns...).Subscribe(t.Context(), "")
		require.ErrorIs(t, err, messaging.ErrInvalidName, "%q %q", tc.group, tc.patterns)
	}
	require.NoError(t, b.DeclareQueue("g", "#"))
	for _, topic := range []string{"", "order.*", "order.#", "order..paid", "has space"} {
		require.ErrorIs(t, b.Publish(topic, msg("1")), messaging.ErrInvalidName, "%q", topic)
	}
}

func TestMemoryBusIdle(t *testing.T) {
	t.Parallel()
	bus := messaging.NewMemoryBus()
	defer bus.Close()
	require.NoError(t, bus.DeclareQueue("unconsumed", "t.a"))
	require.NoError(t, bus.Publish("t.a", message.NewMessage("m-0", []byte(`{}`))))
	assert.True(t, bus.Idle(), "a queue nobody consumes does not count")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := bus.Subscriber("g", "t.b").Subscribe(ctx, "")
	require.NoError(t, err)
	require.NoError(t, bus.Publish("t.b", message.NewMessage("m-1", []byte(`{}`))))
	m := <-msgs
	assert.False(t, bus.Idle(), "a delivered, unacked message")
	m.Nack()
	m = <-msgs
	m.Ack()
	assert.True(t, testenv.Poll(waitFor, bus.Idle), "acked: idle")
}

func TestMemoryBusAlternateQueue(t *testing.T) {
	t.Parallel()
	bus := messaging.NewMemoryBus()
	defer bus.Close()
	// A new bus parks what no binding matches in MemoryUnroutableQueue.
	require.NoError(t, bus.DeclareQueue("g", "order.*"))
	require.NoError(t, bus.Publish("nobody.listens", message.NewMessage("m-1", []byte(`{}`))))
	require.NoError(t, bus.Publish("order.paid", message.NewMessage("m-2", []byte(`{}`))))
	// Another alternate queue replaces it; "" removes it.
	require.NoError(t, bus.DeclareAlternate("unroutable"))
	require.NoError(t, bus.Publish("nobody.listens", message.NewMessage("m-3", []byte(`{}`))))
	require.NoError(t, bus.DeclareAlternate(""))
	require.ErrorIs(t, bus.Publish("nobody.listens", message.NewMessage("m-4", []byte(`{}`))), messaging.ErrUnroutable)
	require.ErrorIs(t, bus.DeclareAlternate("bad name!"), messaging.ErrInvalidName)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for queue, want := range map[string]string{messaging.MemoryUnroutableQueue: "m-1", "unroutable": "m-3"} {
		alt, err := bus.Subscriber(queue).Subscribe(ctx, "")
		require.NoError(t, err)
		m := <-alt
		assert.Equal(t, want, m.UUID, "%s: only what no binding matched", queue)
		m.Ack()
		select {
		case extra := <-alt:
			t.Fatalf("%s: message %s should not be there", queue, extra.UUID)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
