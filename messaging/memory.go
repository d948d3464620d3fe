package messaging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/internal/ack"
	"github.com/bentoevents/bento/internal/clip"
	"github.com/bentoevents/bento/internal/closing"
	"github.com/bentoevents/bento/internal/tracing"
)

var (
	// ErrUnroutable is returned by [MemoryBus.Publish] when no queue is bound
	// to the topic; nothing is delivered.
	ErrUnroutable = errors.New("messaging: unroutable message")
	// ErrClosed is returned by publishers and subscribers used after Close.
	ErrClosed = errors.New("messaging: bus closed")
	// ErrInvalidConfig is returned by [MemoryBus.DeclarePartitions] for a
	// partition count outside 1..MaxPartitions or other than the group's.
	ErrInvalidConfig = errors.New("messaging: invalid config")
)

// MemoryBus is an in-process message broker with the routing semantics of a
// RabbitMQ topic exchange: durable queues named after consumer groups, bound
// to topic patterns, competing consumers, redelivery on nack. It is the
// embedded default for development and tests. A MemoryBus is safe for
// concurrent use; its queues live as long as the bus.
type MemoryBus struct {
	mu     closing.Guard // closed by Close; guards the fields below too
	queues map[string]*memQueue
	routes map[string][]route // topic -> matching queues; reset on declare
	// partitioned holds each group's partition queues (see DeclarePartitions).
	partitioned map[string]*partitionSet
	wg          sync.WaitGroup // consumer goroutines
	// inflight counts messages taken from a queue and not yet acked or put
	// back (guarded by mu).
	inflight int
	// alternate, when set, receives what no binding matches (guarded by mu).
	alternate *memQueue
}

// declared reports whether the queue exists.
func (b *MemoryBus) declared(queue string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.queues[queue] != nil
}

// MemoryUnroutableQueue is the alternate queue a new [MemoryBus] declares:
// it keeps the messages no binding matches, as the alternate exchange
// bento declares on RabbitMQ keeps them in rabbitmq.UnroutableQueue.
const MemoryUnroutableQueue = "bento.unroutable"

// DeclareAlternate makes queue the bus's alternate queue, like a RabbitMQ
// alternate exchange: a message no binding matches goes there instead of
// being refused with ErrUnroutable. Read it with Subscriber(queue). A new
// bus has [MemoryUnroutableQueue]; calling DeclareAlternate replaces it,
// and an empty queue name removes it, so that such a message fails to
// publish with ErrUnroutable.
func (b *MemoryBus) DeclareAlternate(queue string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if queue == "" {
		b.alternate = nil
		return nil
	}
	if err := ValidateGroup(queue); err != nil {
		return fmt.Errorf("declare alternate: %w", err)
	}
	q, err := b.declareLocked(queue, nil)
	if err != nil {
		return err
	}
	b.alternate = q
	return nil
}

// Idle reports whether every queue that has a consumer is empty and no
// message is delivered and unacknowledged: the consumers have handled
// everything that reached them. Queues nobody consumes (an alternate queue,
// a group not started yet) do not count. Tests use it to wait until
// consumers are quiet.
func (b *MemoryBus) Idle() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inflight > 0 {
		return false
	}
	for _, q := range b.queues {
		if q.consumers > 0 && q.head < len(q.items) {
			return false
		}
	}
	return true
}

// route is where a topic's messages go: a queue, or one queue of a
// partition set chosen by each message's partition key.
type route struct {
	q   *memQueue
	set *partitionSet
}

// partitionSet is a group's partition queues and their binding patterns.
type partitionSet struct {
	queues   []*memQueue
	patterns []string
}

// memQueue is one queue: a FIFO of messages and the patterns bound to it.
// Its fields are guarded by the bus mutex.
type memQueue struct {
	name     string
	patterns []string
	items    []*message.Message // items[head:] are waiting, oldest first
	head     int
	// waiters are the slots of the consumers waiting for a message, first
	// come first served; a waiter exists only while the queue is empty, so
	// a message goes to the consumer that has waited longest and consumers
	// share a queue fairly however the scheduler runs them.
	waiters []chan *message.Message
	// consumers counts the subscriptions reading the queue.
	consumers int
	// single, for a partition queue, lets one consumer receive at a time:
	// active, the first that subscribed and is still there; standby are
	// the others, in the order they subscribed, next in line.
	single  bool
	active  chan *message.Message
	standby []chan *message.Message
}

// NewMemoryBus returns a bus with no consumer queues and the alternate
// queue [MemoryUnroutableQueue], so an event no group consumes is parked
// there, as on RabbitMQ, instead of failing to publish. Parked messages stay
// in memory until a subscriber of that queue acks them.
func NewMemoryBus() *MemoryBus {
	alt := &memQueue{name: MemoryUnroutableQueue}
	return &MemoryBus{
		queues:      map[string]*memQueue{alt.name: alt},
		routes:      map[string][]route{},
		partitioned: map[string]*partitionSet{},
		alternate:   alt,
	}
}

// DeclareQueue declares the queue of the consumer group group, if it does not
// exist yet, and binds it to each pattern (see [MatchTopic]). Bindings add up
// over calls, as on RabbitMQ. From then on every message published to a
// matching topic is kept in the queue until a consumer of the group acks it,
// whether or not a consumer is attached.
//
// It returns an error wrapping [ErrInvalidName] for a bad group or pattern,
// and [ErrClosed] after Close.
func (b *MemoryBus) DeclareQueue(group string, patterns ...string) error {
	if err := errors.Join(ValidateGroup(group), ValidatePatterns(patterns)); err != nil {
		return fmt.Errorf("declare queue: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	_, err := b.declareLocked(group, patterns)
	return err
}

func (b *MemoryBus) declareLocked(group string, patterns []string) (*memQueue, error) {
	if b.mu.Closed() {
		return nil, ErrClosed
	}
	q := b.queues[group]
	if q == nil {
		q = &memQueue{name: group}
		b.queues[group] = q
	}
	for _, p := range patterns {
		if !slices.Contains(q.patterns, p) {
			q.patterns = append(q.patterns, p)
			clear(b.routes)
		}
	}
	return q, nil
}

// Publish routes each message, with topic as the routing key, to every queue
// bound to a matching pattern; each queue gets its own copy. Publish
// implements message.Publisher; it does not block on consumers.
//
// When no queue matches, the message goes to the alternate queue
// ([MemoryUnroutableQueue] unless DeclareAlternate changed it); with none,
// Publish returns an error wrapping [ErrUnroutable] and delivers nothing, so
// that a relay does not count the message as published.
// It returns an error wrapping [ErrInvalidName] for a malformed topic, and
// [ErrClosed] after Close.
func (b *MemoryBus) Publish(topic string, msgs ...*message.Message) error {
	if err := ValidateTopic(topic); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	if slices.Contains(msgs, nil) {
		return fmt.Errorf("publish to %q: nil message", topic)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.Closed() {
		return ErrClosed
	}
	routes, ok := b.routes[topic]
	if !ok {
		routes = b.routesLocked(topic)
		b.routes[topic] = routes
	}
	if len(routes) == 0 && b.alternate != nil {
		routes = []route{{q: b.alternate}}
	}
	if len(routes) == 0 {
		return fmt.Errorf("publish to %q: %w: no queue is bound to a matching pattern", topic, ErrUnroutable)
	}
	for _, r := range routes {
		for _, m := range msgs {
			q := r.q
			if r.set != nil {
				q = r.set.queues[PartitionOf(PartitionKey(m), len(r.set.queues))]
			}
			q.items = append(q.items, copyMessage(m))
			b.dispatchLocked(q)
		}
	}
	return nil
}

// routesLocked finds where topic's messages go: every queue bound to a
// matching pattern, and every partition set bound to one. The bus mutex
// must be held.
func (b *MemoryBus) routesLocked(topic string) []route {
	var routes []route
	matches := func(p string) bool { return MatchTopic(p, topic) }
	for _, name := range slices.Sorted(maps.Keys(b.queues)) {
		if q := b.queues[name]; slices.ContainsFunc(q.patterns, matches) {
			routes = append(routes, route{q: q})
		}
	}
	for _, group := range slices.Sorted(maps.Keys(b.partitioned)) {
		if set := b.partitioned[group]; slices.ContainsFunc(set.patterns, matches) {
			routes = append(routes, route{set: set})
		}
	}
	return routes
}

// DeclarePartitions declares the n partition queues of group,
// PartitionQueue(group, 0..n-1), if they do not exist yet, and binds them,
// as a set, to each pattern: a matching message goes to exactly one of them,
// chosen by its partition key (see [PartitionKey]), so an aggregate's events
// stay in one queue in the order they were published. Each partition queue
// has a single active consumer, as declared by rabbitmq.DeclarePartitions on
// RabbitMQ: of the subscriptions to it (Subscriber(PartitionQueue(group, p))
// with no patterns), the first receives its messages, one at a time; the
// next takes over, unacked messages first, when it ends.
//
// It returns an error wrapping [ErrInvalidName] for a bad group or pattern,
// [ErrInvalidConfig] for a count outside 1..MaxPartitions or other than the
// group's declared count, and [ErrClosed] after Close.
func (b *MemoryBus) DeclarePartitions(group string, n int, patterns ...string) error {
	if err := errors.Join(ValidateGroup(group), ValidatePatterns(patterns)); err != nil {
		return fmt.Errorf("declare partitions: %w", err)
	}
	if n < 1 || n > MaxPartitions {
		return fmt.Errorf("declare partitions: %w: count %d is outside 1..%d", ErrInvalidConfig, n, MaxPartitions)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.Closed() {
		return ErrClosed
	}
	set := b.partitioned[group]
	if set == nil {
		set = &partitionSet{}
		for i := range n {
			q, err := b.declareLocked(PartitionQueue(group, i), nil)
			if err != nil {
				return err
			}
			q.single = true
			set.queues = append(set.queues, q)
		}
		b.partitioned[group] = set
	} else if len(set.queues) != n {
		return fmt.Errorf("declare partitions: %w: group %q has %d partitions, not %d", ErrInvalidConfig, group, len(set.queues), n)
	}
	for _, p := range patterns {
		if !slices.Contains(set.patterns, p) {
			set.patterns = append(set.patterns, p)
			clear(b.routes)
		}
	}
	return nil
}

// copyMessage returns a copy of m with its own payload bytes, acks and no
// context.
func copyMessage(m *message.Message) *message.Message {
	c := m.Copy()
	c.Payload = bytes.Clone(m.Payload)
	return c
}

// dispatchLocked hands q's oldest messages to its waiting consumers, the
// longest waiting first. The bus mutex must be held.
func (b *MemoryBus) dispatchLocked(q *memQueue) {
	for len(q.waiters) > 0 {
		m := q.take()
		if m == nil {
			return
		}
		w := q.waiters[0]
		q.waiters = q.waiters[1:]
		b.inflight++
		w <- m // a waiting slot is empty and has room for one
	}
}

// next returns the oldest message for a consumer whose slot is slot, or, when
// the queue is empty or other consumers are waiting, registers slot as a
// waiter and returns nil. The bus mutex must be held.
func (b *MemoryBus) nextLocked(q *memQueue, slot chan *message.Message) *message.Message {
	if q.single && q.active != slot {
		return nil // on standby; promote hands it its first message
	}
	if len(q.waiters) == 0 {
		if m := q.take(); m != nil {
			b.inflight++
			return m
		}
	}
	q.waiters = append(q.waiters, slot)
	return nil
}

// leaveLocked unregisters slot and puts back, at the head of q in this
// order, the messages back (handed out, not acked) and a message handed to
// slot but not delivered. The bus mutex must be held.
func (b *MemoryBus) leaveLocked(q *memQueue, slot chan *message.Message, back []*message.Message) {
	if i := slices.Index(q.waiters, slot); i >= 0 {
		q.waiters = slices.Delete(q.waiters, i, i+1)
	}
	if i := slices.Index(q.standby, slot); i >= 0 {
		q.standby = slices.Delete(q.standby, i, i+1)
	}
	if q.active == slot {
		q.active = nil
	}
	select {
	case m := <-slot:
		b.inflight--
		back = append(back, m)
	default:
	}
	b.requeueAllLocked(q, back)
	if q.single && q.active == nil && len(q.standby) > 0 {
		q.active, q.standby = q.standby[0], q.standby[1:]
		if m := b.nextLocked(q, q.active); m != nil {
			q.active <- m
		}
	}
}

// joinLocked registers slot as a consumer of q: on a single-active-consumer
// queue, as the active one if there is none, else on standby. The bus
// mutex must be held.
func (b *MemoryBus) joinLocked(q *memQueue, slot chan *message.Message) {
	q.consumers++
	if q.single {
		if q.active != nil {
			q.standby = append(q.standby, slot)
			return
		}
		q.active = slot
	}
	if m := b.nextLocked(q, slot); m != nil {
		slot <- m // the queue had messages and no waiters: start on the oldest
	}
}

// take pops the oldest message, or returns nil when the queue is empty. The
// bus mutex must be held.
func (q *memQueue) take() *message.Message {
	if q.head == len(q.items) {
		return nil
	}
	m := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head >= 1024 && q.head*2 >= len(q.items) {
		q.items = append(q.items[:0], q.items[q.head:]...)
		q.head = 0
	}
	return m
}

// requeueAllLocked puts ms back at the head of q, in their order, where
// RabbitMQ puts rejected messages, and hands them to waiting consumers. The
// bus mutex must be held.
func (b *MemoryBus) requeueAllLocked(q *memQueue, ms []*message.Message) {
	if len(ms) == 0 {
		return
	}
	if q.head >= len(ms) {
		q.head -= len(ms)
		copy(q.items[q.head:], ms)
	} else {
		q.items = slices.Insert(q.items[q.head:], 0, ms...)
		q.head = 0
	}
	b.dispatchLocked(q)
}

// Close closes the bus: publishing fails with [ErrClosed], every
// subscription's channel is closed, and messages delivered but not yet acked
// stay in their queue. Close waits for the consumer goroutines to stop. It is
// idempotent.
func (b *MemoryBus) Close() error {
	_ = b.mu.Close(nil)
	b.wg.Wait()
	return nil
}

// Subscriber returns a message.Subscriber that consumes the queue of the
// consumer group group, declared with [MemoryBus.DeclareQueue](group,
// patterns...) on every Subscribe. The topic argument of Subscribe is
// ignored: a group's subscription receives what its bindings route to its
// queue.
//
// Several Subscribe calls for one group, on one Subscriber or several, are
// competing consumers: each message goes to one of them. Each subscription
// delivers one message at a time and waits for its Ack or Nack. A nacked
// message goes back to the head of the queue and is redelivered, to any
// consumer of the group, with the same UUID, metadata and payload; an acked
// one is dropped. Each delivery is a fresh copy whose context derives from
// the Subscribe context and is cancelled once the message is acked or
// nacked. When that context is cancelled, or the Subscriber or bus is
// closed, the subscription's channel is closed and a message delivered but
// not yet acked is put back in the queue.
func (b *MemoryBus) Subscriber(group string, patterns ...string) message.Subscriber {
	return &memSubscriber{
		bus:      b,
		group:    group,
		patterns: slices.Clone(patterns),
		prefetch: 1,
	}
}

// PartitionSubscriber returns a message.Subscriber whose Subscribe(ctx,
// queue) consumes the existing queue named by its topic argument, such as a
// partition queue (see [MemoryBus.DeclarePartitions]), as Subscriber(queue)
// does, but with up to prefetch messages in hand at a time (0 means 1):
// they are handed out in queue order, acked ones are dropped in that order,
// and a Nack gives back the nacked message and every later one in hand, in
// order. It is the memory bus's counterpart of rabbitmq.NewPartitionSubscriber.
func (b *MemoryBus) PartitionSubscriber(prefetch int) message.Subscriber {
	return &queueSubscriber{bus: b, prefetch: max(prefetch, 1)}
}

// queueSubscriber subscribes to the queue its topic names.
type queueSubscriber struct {
	bus      *MemoryBus
	prefetch int
	mu       sync.Mutex
	subs     []message.Subscriber
}

func (s *queueSubscriber) Subscribe(ctx context.Context, queue string) (<-chan *message.Message, error) {
	if !s.bus.declared(queue) {
		return nil, fmt.Errorf("subscribe: %w: queue %q is not declared", ErrInvalidName, clip.String(queue))
	}
	sub := s.bus.Subscriber(queue).(*memSubscriber)
	sub.prefetch = s.prefetch
	s.mu.Lock()
	s.subs = append(s.subs, sub)
	s.mu.Unlock()
	return sub.Subscribe(ctx, queue)
}

func (s *queueSubscriber) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sub := range s.subs {
		_ = sub.Close()
	}
	return nil
}

type memSubscriber struct {
	bus      *MemoryBus
	group    string
	patterns []string
	prefetch int // at least 1

	mu closing.Guard // closed by Close
	wg sync.WaitGroup
}

// Subscribe implements message.Subscriber; topic is ignored.
func (s *memSubscriber) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	if err := ValidateGroup(s.group); err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	if len(s.patterns) > 0 || !s.bus.declared(s.group) {
		if err := ValidatePatterns(s.patterns); err != nil {
			return nil, fmt.Errorf("subscribe: %w", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.Closed() {
		return nil, ErrClosed
	}
	b := s.bus
	b.mu.Lock()
	var q *memQueue
	var err error
	if len(s.patterns) == 0 && b.queues[s.group] != nil {
		q = b.queues[s.group] // an existing queue, such as the alternate one
	} else {
		q, err = b.declareLocked(s.group, s.patterns)
	}
	// The consumer takes its place in the queue before Subscribe returns:
	// it gets its turn at the next message (or the oldest waiting one) even
	// before its goroutine first runs.
	slot := make(chan *message.Message, 1)
	if err == nil {
		b.wg.Add(1)
		b.joinLocked(q, slot)
	}
	b.mu.Unlock()
	if err != nil {
		return nil, err
	}
	// Buffered so that a consumer taking several at once finds them there.
	out := make(chan *message.Message, s.prefetch-1)
	s.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer s.wg.Done()
		defer close(out)
		s.consume(ctx, q, slot, out)
	}()
	return out, nil
}

// handed is a message a subscription handed out and has not settled:
// orig is the queue's, d the copy delivered.
type handed struct {
	orig, d *message.Message
	cancel  context.CancelFunc
}

// consume delivers q's messages to out, up to s.prefetch unsettled at a
// time, until ctx is done or the subscriber or bus closes. It starts
// registered on slot, where the queue hands it messages. Acked messages are
// dropped in delivery order; a nack gives back the nacked message and every
// later one in hand, in order.
func (s *memSubscriber) consume(ctx context.Context, q *memQueue, slot chan *message.Message, out chan<- *message.Message) {
	b := s.bus
	var (
		window  []handed // handed out, unsettled, in delivery order
		next    *handed  // taken from the queue, not handed out yet
		waiting = true   // registered on slot, a message may come
	)
	deliver := func(m *message.Message) *handed {
		d := copyMessage(m)
		dctx, cancel := context.WithCancel(ctx)
		d.SetContext(dctx)
		return &handed{orig: m, d: d, cancel: cancel}
	}
	// giveBack returns the unacked messages from window[i:] and next to
	// the queue, in order. The bus mutex must be held.
	giveBack := func(i int) []*message.Message {
		var back []*message.Message
		for _, h := range window[i:] {
			h.cancel()
			b.inflight--
			if !ack.Acked(h.d) { // an ack that raced with the end still counts
				back = append(back, h.orig)
			}
		}
		window = window[:i]
		if next != nil {
			next.cancel()
			b.inflight--
			back = append(back, next.orig)
			next = nil
		}
		return back
	}
	defer func() {
		b.mu.Lock()
		b.leaveLocked(q, slot, giveBack(0))
		q.consumers--
		b.mu.Unlock()
	}()
	for {
		if next == nil && !waiting && len(window) < s.prefetch && !s.stopping(ctx) {
			b.mu.Lock()
			if m := b.nextLocked(q, slot); m != nil {
				next = deliver(m)
			} else {
				waiting = true
			}
			b.mu.Unlock()
		}
		var (
			receive       <-chan *message.Message
			send          chan<- *message.Message
			sending       *message.Message
			acked, nacked <-chan struct{}
		)
		if next == nil && waiting {
			receive = slot
		}
		if next != nil {
			send, sending = out, next.d
		}
		if len(window) > 0 {
			acked, nacked = window[0].d.Acked(), window[0].d.Nacked()
		}
		select {
		case m := <-receive:
			waiting = false
			next = deliver(m)
		case send <- sending:
			window = append(window, *next)
			next = nil
		case <-acked:
			b.mu.Lock()
			for len(window) > 0 && ack.Acked(window[0].d) {
				window[0].cancel()
				b.inflight--
				window = window[1:]
			}
			b.mu.Unlock()
		case <-nacked:
			b.mu.Lock()
			// Give back the nacked one and what came after it, in order;
			// take a message the queue had handed us first.
			back := giveBack(0)
			if waiting {
				select {
				case m := <-slot:
					b.inflight--
					back = append(back, m)
					waiting = false
				default:
				}
			}
			if i := slices.Index(q.waiters, slot); i >= 0 {
				q.waiters = slices.Delete(q.waiters, i, i+1)
				waiting = false
			}
			b.requeueAllLocked(q, back)
			b.mu.Unlock()
		case <-ctx.Done():
			return
		case <-s.mu.Done():
			return
		case <-b.mu.Done():
			return
		}
	}
}

// stopping reports whether the subscription must end: ctx is done or the
// subscriber or the bus is closed.
func (s *memSubscriber) stopping(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	case <-s.mu.Done():
		return true
	case <-s.bus.mu.Done():
		return true
	default:
		return false
	}
}

// Close closes the subscriber's subscriptions and waits for them to stop.
// Messages delivered but not acked go back to their queue. It is idempotent.
func (s *memSubscriber) Close() error {
	_ = s.mu.Close(nil)
	s.wg.Wait()
	return nil
}

// MessagingSystem returns "bento_memory", the bus's messaging.system name
// in traces.
func (b *MemoryBus) MessagingSystem() string { return tracing.SystemMemory }
