package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/internal/ack"
	"github.com/bentoevents/bento/internal/clip"
	"github.com/bentoevents/bento/internal/closing"
	"github.com/bentoevents/bento/messaging"
)

// ErrHashExchangeMissing is returned when RabbitMQ does not know the
// consistent-hash exchange type: the rabbitmq_consistent_hash_exchange
// plugin, shipped with RabbitMQ, is not enabled. Enable it with
// "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange" (no restart
// needed).
var ErrHashExchangeMissing = errors.New("rabbitmq: RabbitMQ's consistent-hash exchange is missing " +
	"(enable it: rabbitmq-plugins enable rabbitmq_consistent_hash_exchange)")

// hashExchangeType is the exchange type of the rabbitmq_consistent_hash_exchange
// plugin; a variable so a test can ask for a type the broker lacks.
var hashExchangeType = "x-consistent-hash"

// QueueType is the RabbitMQ queue type of a consumer group's partition queues.
type QueueType int

const (
	// Quorum queues (the zero value) are replicated, and dead-letter a
	// message redelivered more than PartitionSpec.DeliveryLimit times, such
	// as one that crashes its consumer each time.
	Quorum QueueType = iota
	// Classic queues are RabbitMQ's original queue type: no delivery limit,
	// so a message that crashes its consumer is redelivered forever.
	Classic
)

// String returns "quorum" or "classic".
func (t QueueType) String() string {
	if t == Classic {
		return "classic"
	}
	return "quorum"
}

// PartitionSpec describes the partitioned queues of a consumer group: Count
// queues, each with a single active consumer, between which the group's
// events are spread by their partition key (see [messaging.PartitionKey]), so that the
// events of one aggregate always land in the same queue, in the order they
// were published.
type PartitionSpec struct {
	// Group is the consumer group. It has no default: it is required.
	Group string
	// Count is the number of partitions, 1 to messaging.MaxPartitions. Every instance
	// of a group must use the same count; changing it moves aggregates
	// between partitions, so drain the queues first. It has no default: it
	// is required.
	Count int
	// Patterns are the binding patterns of the event types the group
	// consumes ("order.*"). It has no default: at least one is required.
	Patterns []string
	// QueueType is the RabbitMQ queue type, Quorum or Classic. Defaults to
	// Quorum.
	QueueType QueueType
	// DeliveryLimit, for quorum queues, is how many times a message is
	// delivered again (after its consumer died, stopped or gave it back)
	// before the broker dead-letters it to DeadExchange with routing key
	// DeadKey. Quorum queues always get one: without a limit, RabbitMQ 3.10
	// puts a message given back at the tail of a quorum queue, behind the
	// later events of its aggregate. A consumer that stops or moves a
	// partition, or a lost connection, counts one delivery against every
	// message the subscription held, started or not, so keep it far off:
	// bento's consumer counts the attempts that really died itself (see
	// consumer.Config.MaxCrashes) and dead-letters a message one delivery
	// before this limit, holding its aggregate back. Changing it later
	// fails: RabbitMQ refuses to redeclare a queue with other arguments.
	// Classic queues ignore it. Defaults to DefaultDeliveryLimit (500).
	DeliveryLimit int
	// DeadExchange and DeadKey name where the delivery limit sends a
	// message (the empty DeadExchange is the broker's default exchange,
	// which routes to the queue named DeadKey). DeadKey has no default: it
	// is required for quorum queues. DeadExchange defaults to the default
	// exchange.
	DeadExchange, DeadKey string
	// Prefetch is how many messages a subscription of
	// NewPartitionSubscriber takes before the first of them is acked, so
	// that a consumer can apply several at once (the memory bus takes it
	// as messaging.MemoryBus.PartitionSubscriber's argument). Declaring
	// ignores it. Defaults to 1.
	Prefetch int
}

// hashExchange names the group's consistent-hash exchange, bound to the
// main exchange with the group's patterns.
func hashExchange(exchange, group string) string { return exchange + ".hash." + group }

// validate names every bad field of s.
func (s *PartitionSpec) validate(exchange string) error {
	var errs []error
	if err := messaging.ValidateGroup(s.Group); err != nil {
		errs = append(errs, err)
	}
	if s.Count < 1 || s.Count > messaging.MaxPartitions {
		errs = append(errs, fmt.Errorf("%w: PartitionSpec.Count %d is outside 1..%d", ErrInvalidConfig, s.Count, messaging.MaxPartitions))
	}
	if err := messaging.ValidatePatterns(s.Patterns); err != nil {
		errs = append(errs, err)
	}
	if s.DeliveryLimit < 0 {
		errs = append(errs, fmt.Errorf("%w: PartitionSpec.DeliveryLimit %d is negative", ErrInvalidConfig, s.DeliveryLimit))
	}
	if s.QueueType == Quorum && s.DeadKey == "" {
		errs = append(errs, fmt.Errorf("%w: PartitionSpec.DeadKey is required for quorum queues", ErrInvalidConfig))
	}
	if s.QueueType != Quorum && s.QueueType != Classic {
		errs = append(errs, fmt.Errorf("%w: PartitionSpec.QueueType %d is unknown", ErrInvalidConfig, s.QueueType))
	}
	if exchange != "" && s.Group != "" {
		if name := hashExchange(exchange, s.Group); len(name) > messaging.MaxRoutingKeyLen {
			errs = append(errs, fmt.Errorf("%w: exchange %q and group %q make a hash exchange name longer than %d bytes",
				messaging.ErrInvalidName, clip.String(exchange), clip.String(s.Group), messaging.MaxRoutingKeyLen))
		}
	}
	return errors.Join(errs...)
}

// queueArgs are the arguments of every partition queue of s.
func (s *PartitionSpec) queueArgs() amqp.Table {
	args := amqp.Table{"x-single-active-consumer": true}
	if s.QueueType == Classic {
		return args
	}
	args["x-queue-type"] = "quorum"
	args["x-delivery-limit"] = cmp.Or(s.DeliveryLimit, DefaultDeliveryLimit)
	args["x-dead-letter-exchange"] = s.DeadExchange
	args["x-dead-letter-routing-key"] = s.DeadKey
	return args
}

// DeclarePartitions declares, on the broker at cfg.URL, the topology (see
// [DeclareTopology]) and the partitioned queues of spec.Group: a durable
// consistent-hash exchange "<exchange>.hash.<group>", bound to the main
// exchange with each of spec.Patterns and hashing each message's
// messaging.MetaPartitionKey header, and spec.Count durable queues
// messaging.PartitionQueue(group, 0..Count-1) of spec.QueueType with a single active
// consumer, bound to it with equal weights. Once it returns, every matching
// event is kept in exactly one partition queue until a consumer acks it.
// Every message bento publishes carries the header (the publishers set it
// when [messaging.NewMessage] has not); a message from another publisher without it
// lands in one partition, the same for all of them.
// Declaring is idempotent; bindings add up over calls.
//
// It returns an error wrapping [ErrHashExchangeMissing] when the broker's
// consistent-hash plugin is not enabled, [ErrTopologyMismatch] when a
// queue or exchange exists with other settings (another Count is no
// mismatch: partitions beyond it stay), [ErrInvalidConfig] for a bad cfg or
// spec, and [messaging.ErrInvalidName] for a bad group or pattern.
func DeclarePartitions(ctx context.Context, cfg *Config, spec PartitionSpec) error {
	c, err := cfg.resolve()
	if err != nil {
		return err
	}
	if err := spec.validate(c.Exchange); err != nil {
		return fmt.Errorf("declare partitions: %w", err)
	}
	return c.withChannel(ctx, func(ch *amqp.Channel) error {
		if err := declareExchanges(ch, c.Exchange); err != nil {
			return err
		}
		hx := hashExchange(c.Exchange, spec.Group)
		if err := ch.ExchangeDeclare(hx, hashExchangeType, true, false, false, false,
			amqp.Table{"hash-header": messaging.MetaPartitionKey}); err != nil {
			return hashExchangeError(hx, err)
		}
		for _, p := range spec.Patterns {
			if err := ch.ExchangeBind(hx, p, c.Exchange, false, nil); err != nil {
				return fmt.Errorf("rabbitmq: bind exchange %q to %q with %q: %w", hx, c.Exchange, p, err)
			}
		}
		for i := range spec.Count {
			if err := declarePartitionQueue(ch, hx, messaging.PartitionQueue(spec.Group, i), spec.queueArgs()); err != nil {
				return err
			}
		}
		return nil
	})
}

// hashExchangeError wraps a failed declaration of the hash exchange, with
// ErrHashExchangeMissing when the broker does not know its type.
func hashExchangeError(name string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.CommandInvalid && strings.Contains(ae.Reason, hashExchangeType) {
		return fmt.Errorf("%w: declare exchange %q: %w", ErrHashExchangeMissing, name, err)
	}
	return declareError("exchange", name, err)
}

// declarePartitionQueue declares one partition queue and binds it to the
// hash exchange with weight 1.
func declarePartitionQueue(ch *amqp.Channel, hx, queue string, args amqp.Table) error {
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		return declareError("queue", queue, err)
	}
	if err := ch.QueueBind(queue, "1", hx, false, nil); err != nil {
		return fmt.Errorf("rabbitmq: bind queue %q to %q: %w", queue, hx, err)
	}
	return nil
}

// NewPartitionSubscriber returns a subscriber for the partition queues of
// spec.Group, declared with [DeclarePartitions] before it returns.
// Subscribe(ctx, messaging.PartitionQueue(group, p)) consumes partition p on a
// channel of its own, up to spec.Prefetch messages at a time (1 by
// default), handed out in queue order. Acks are sent in that order too: a
// message acked before the ones ahead of it waits for them, and the
// messages acked by then are acknowledged with one ack (multiple). A Nack
// of the oldest message in hand ends the subscription, as the end of ctx
// does, giving it and every later one in hand back to the head of the
// queue, in order; a Nack of a later one waits for the ones ahead of it.
// (It does not nack them: RabbitMQ 3.10's quorum queues requeue more than
// 32 messages nacked at once in no particular order.)
// With a single active consumer per queue, a second subscription to a
// partition, here or in another process, waits until the first one ends,
// then receives the partition's messages, unacked ones first.
//
// When ctx ends, the subscription stops: it cancels its consumer and closes
// its channel, which gives the messages in hand back to the head of the
// queue, in order (acks that come first still count; a Nack after ctx
// ended is the same give-back). It never nacks at all: on a quorum
// queue each give-back counts one delivery toward the delivery limit, and
// a consumer that stops costs the messages at the head of its partition at
// most one. The subscription's channel closes when ctx ends, the
// subscriber is closed (also while nobody reads the channel) or the
// connection is lost; subscribe again to resume (the subscriber dials
// again).
//
// It returns the errors of DeclarePartitions.
func NewPartitionSubscriber(ctx context.Context, cfg *Config, spec PartitionSpec) (message.Subscriber, error) {
	if err := DeclarePartitions(ctx, cfg, spec); err != nil {
		return nil, err
	}
	c, _ := cfg.resolve() // DeclarePartitions validated it
	stop, stopAll := context.WithCancel(context.Background())
	return &partitionSubscriber{cfg: c, hx: hashExchange(c.Exchange, spec.Group), args: spec.queueArgs(),
		prefetch: max(spec.Prefetch, 1), stop: stop, stopAll: stopAll}, nil
}

// partitionSubscriber consumes partition queues over one connection, dialed
// on first use and again after it is lost.
type partitionSubscriber struct {
	cfg      *Config
	hx       string
	args     amqp.Table
	prefetch int
	// stop is cancelled by Close, which ends every subscription even
	// when nobody reads its channel.
	stop    context.Context
	stopAll context.CancelFunc

	mu   closing.Guard // guards conn too
	conn *amqp.Connection
	wg   sync.WaitGroup
}

// channel opens a channel on the subscriber's connection, dialing it if
// needed.
func (s *partitionSubscriber) channel(ctx context.Context) (*amqp.Channel, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.Closed() {
		return nil, messaging.ErrClosed
	}
	if s.conn == nil || s.conn.IsClosed() {
		conn, err := s.cfg.dial(ctx)
		if err != nil {
			return nil, err
		}
		s.conn = conn
	}
	ch, err := s.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: open AMQP channel: %w", err)
	}
	return ch, nil
}

// inHand is a delivery handed out and not settled yet.
type inHand struct {
	d      amqp.Delivery
	msg    *message.Message
	cancel context.CancelFunc
}

func (s *partitionSubscriber) Subscribe(ctx context.Context, queue string) (<-chan *message.Message, error) {
	ch, err := s.channel(ctx)
	if err != nil {
		return nil, fmt.Errorf("subscribe %q: %w", queue, err)
	}
	deliveries, err := func() (<-chan amqp.Delivery, error) {
		if err := ch.Qos(s.prefetch, 0, false); err != nil {
			return nil, err
		}
		if err := declarePartitionQueue(ch, s.hx, queue, s.args); err != nil {
			return nil, err
		}
		return ch.Consume(queue, "", false, false, false, false, nil)
	}()
	if err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("subscribe %q: %w", queue, err)
	}
	// Buffered so that a consumer taking several at once finds them there.
	out := make(chan *message.Message, s.prefetch-1)
	ctx, cancel := context.WithCancel(ctx)
	unhook := context.AfterFunc(s.stop, cancel)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer func() { _ = ch.Close() }() // gives back what was delivered and not acked
		defer unhook()
		defer cancel()
		consumePartition(ctx, deliveries, out)
	}()
	return out, nil
}

// consumePartition hands deliveries out in order and settles them in
// order, until ctx ends, the deliveries end, or a settlement fails.
func consumePartition(ctx context.Context, deliveries <-chan amqp.Delivery, out chan<- *message.Message) {
	var (
		window []inHand // handed out, unsettled, in delivery order
		next   *inHand  // received, not handed out yet
	)
	defer func() {
		settleAcked(window) // an ack that raced with the end still counts
		for _, h := range window {
			h.cancel()
		}
		if next != nil {
			next.cancel()
		}
	}()
	for {
		var (
			receive       <-chan amqp.Delivery
			send          chan<- *message.Message
			sending       *message.Message
			acked, nacked <-chan struct{}
		)
		if next == nil {
			receive = deliveries
		} else {
			send, sending = out, next.msg
		}
		if len(window) > 0 {
			acked, nacked = window[0].msg.Acked(), window[0].msg.Nacked()
		}
		select {
		case <-ctx.Done():
			return
		case d, ok := <-receive:
			if !ok {
				return
			}
			msg, _ := marshaler{}.Unmarshal(d)
			mctx, cancel := context.WithCancel(ctx)
			msg.SetContext(mctx)
			next = &inHand{d: d, msg: msg, cancel: cancel}
		case send <- sending:
			window = append(window, *next)
			next = nil
		case <-acked:
			n, err := settleAcked(window)
			window = window[n:]
			if err != nil {
				return
			}
		case <-nacked:
			// Give back the nacked message and every later one in hand by
			// closing the channel, which returns them to the head of the
			// queue in order. A nack (multiple) would not: RabbitMQ 3.10's
			// quorum queues requeue more than 32 messages nacked at once
			// in no particular order.
			return
		}
	}
}

// settleAcked acknowledges, with one ack, the longest run of acked
// messages at the head of window, and returns its length.
func settleAcked(window []inHand) (int, error) {
	n := 0
	for n < len(window) && ack.Acked(window[n].msg) {
		window[n].cancel()
		n++
	}
	if n == 0 {
		return 0, nil
	}
	return n, window[n-1].d.Ack(n > 1)
}

// Close ends every subscription, as the end of its context does, also
// one whose channel nobody reads, closes the connection, and waits for
// them.
func (s *partitionSubscriber) Close() error {
	var conn *amqp.Connection
	_ = s.mu.Close(func() error { conn = s.conn; return nil })
	s.stopAll()
	if conn != nil {
		_ = conn.Close()
	}
	s.wg.Wait()
	return nil
}
