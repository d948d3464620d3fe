package messaging

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrHashExchangeMissing is returned when RabbitMQ does not know the
// consistent-hash exchange type: the rabbitmq_consistent_hash_exchange
// plugin, shipped with RabbitMQ, is not enabled. Enable it with
// "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange" (no restart
// needed).
var ErrHashExchangeMissing = errors.New("messaging: RabbitMQ's consistent-hash exchange is missing " +
	"(enable it: rabbitmq-plugins enable rabbitmq_consistent_hash_exchange)")

// hashExchangeType is the exchange type of the rabbitmq_consistent_hash_exchange
// plugin; a variable so a test can ask for a type the broker lacks.
var hashExchangeType = "x-consistent-hash"

// MaxPartitions bounds a group's partition count.
const MaxPartitions = 1024

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
// events are spread by their partition key (see [PartitionKey]), so that the
// events of one aggregate always land in the same queue, in the order they
// were published.
type PartitionSpec struct {
	// Group is the consumer group. Required.
	Group string
	// Count is the number of partitions, 1 to MaxPartitions. Every instance
	// of a group must use the same count; changing it moves aggregates
	// between partitions, so drain the queues first. Required.
	Count int
	// Patterns are the binding patterns of the event types the group
	// consumes ("order.*"). At least one is required.
	Patterns []string
	// QueueType is the RabbitMQ queue type (Quorum, the zero value, or
	// Classic). The memory bus ignores it.
	QueueType QueueType
	// DeliveryLimit, for quorum queues, is how many times a message is
	// delivered again (after its consumer died, stopped or gave it back)
	// before the broker dead-letters it to DeadExchange with routing key
	// DeadKey. Required (at least 1) for quorum queues: without a limit,
	// RabbitMQ 3.10 puts a message given back at the tail of a quorum queue,
	// behind the later events of its aggregate. A consumer that stops or
	// moves a partition may count one delivery against the message at its
	// head, so leave room (consumer.DefaultDeliveryLimit is 20). Changing it
	// later fails: RabbitMQ refuses to redeclare a queue with other
	// arguments. Classic queues ignore it.
	DeliveryLimit int
	// DeadExchange and DeadKey name where the delivery limit sends a
	// message (the empty DeadExchange is the broker's default exchange,
	// which routes to the queue named DeadKey). DeadKey is required with a
	// DeliveryLimit.
	DeadExchange, DeadKey string
}

// PartitionQueue returns the name of partition p of group: "<group>.p<p>".
func PartitionQueue(group string, p int) string { return group + ".p" + strconv.Itoa(p) }

// hashExchange names the group's consistent-hash exchange, bound to the
// main exchange with the group's patterns.
func hashExchange(exchange, group string) string { return exchange + ".hash." + group }

// PartitionKey returns the key that chooses a message's partition: its
// MetaPartitionKey metadata, set by [NewMessage]; for a message without it,
// "tenant|aggregate type|aggregate id" for an event of an aggregate, and its
// UUID otherwise (an event without aggregate may go to any partition).
func PartitionKey(msg *message.Message) string {
	if k := msg.Metadata.Get(MetaPartitionKey); k != "" {
		return k
	}
	return partitionKey(msg.UUID, msg.Metadata.Get(MetaTenantID), msg.Metadata.Get(MetaAggregateType),
		msg.Metadata.Get(MetaAggregateID))
}

func partitionKey(id, tenant, aggType, aggID string) string {
	if aggID == "" {
		return id
	}
	return tenant + "|" + aggType + "|" + aggID
}

// partitionOf returns the partition of key among n on the memory bus.
func partitionOf(key string, n int) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum64() % uint64(n))
}

// validate names every bad field of s.
func (s *PartitionSpec) validate(exchange string) error {
	var errs []error
	if err := validateGroup(s.Group); err != nil {
		errs = append(errs, err)
	}
	if s.Count < 1 || s.Count > MaxPartitions {
		errs = append(errs, fmt.Errorf("%w: PartitionSpec.Count %d is outside 1..%d", ErrInvalidConfig, s.Count, MaxPartitions))
	}
	if err := validatePatterns(s.Patterns); err != nil {
		errs = append(errs, err)
	}
	if s.QueueType == Quorum && (s.DeliveryLimit < 1 || s.DeadKey == "") {
		errs = append(errs, fmt.Errorf("%w: PartitionSpec.DeliveryLimit (%d) must be positive, with a DeadKey, for quorum queues",
			ErrInvalidConfig, s.DeliveryLimit))
	}
	if s.QueueType != Quorum && s.QueueType != Classic {
		errs = append(errs, fmt.Errorf("%w: PartitionSpec.QueueType %d is unknown", ErrInvalidConfig, s.QueueType))
	}
	if exchange != "" && s.Group != "" {
		if name := hashExchange(exchange, s.Group); len(name) > maxRoutingKeyLen {
			errs = append(errs, fmt.Errorf("%w: exchange %q and group %q make a hash exchange name longer than %d bytes",
				ErrInvalidName, clip(exchange), clip(s.Group), maxRoutingKeyLen))
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
	args["x-delivery-limit"] = s.DeliveryLimit
	args["x-dead-letter-exchange"] = s.DeadExchange
	args["x-dead-letter-routing-key"] = s.DeadKey
	return args
}

// DeclarePartitions declares, on the broker at cfg.URL, the topology (see
// [DeclareTopology]) and the partitioned queues of spec.Group: a durable
// consistent-hash exchange "<exchange>.hash.<group>", bound to the main
// exchange with each of spec.Patterns and hashing each message's
// MetaPartitionKey header, and spec.Count durable queues
// PartitionQueue(group, 0..Count-1) of spec.QueueType with a single active
// consumer, bound to it with equal weights. Once it returns, every matching
// event is kept in exactly one partition queue until a consumer acks it.
// Every message bento publishes carries the header ([NewMessage] sets it);
// the broker drops a message without it (from another publisher) without a
// trace, so publish to the exchange only through bento.
// Declaring is idempotent; bindings add up over calls.
//
// It returns an error wrapping [ErrHashExchangeMissing] when the broker's
// consistent-hash plugin is not enabled, [ErrInvalidConfig] for a bad cfg or
// spec, and [ErrInvalidName] for a bad group or pattern.
func DeclarePartitions(ctx context.Context, cfg *AMQPConfig, spec PartitionSpec) error {
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
			amqp.Table{"hash-header": MetaPartitionKey}); err != nil {
			return hashExchangeError(hx, err)
		}
		for _, p := range spec.Patterns {
			if err := ch.ExchangeBind(hx, p, c.Exchange, false, nil); err != nil {
				return fmt.Errorf("messaging: bind exchange %q to %q with %q: %w", hx, c.Exchange, p, err)
			}
		}
		for i := range spec.Count {
			if err := declarePartitionQueue(ch, hx, PartitionQueue(spec.Group, i), spec.queueArgs()); err != nil {
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
	return fmt.Errorf("messaging: declare exchange %q: %w", name, err)
}

// declarePartitionQueue declares one partition queue and binds it to the
// hash exchange with weight 1.
func declarePartitionQueue(ch *amqp.Channel, hx, queue string, args amqp.Table) error {
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		return fmt.Errorf("messaging: declare queue %q (if it exists with other arguments, "+
			"delete it once drained or keep its settings): %w", queue, err)
	}
	if err := ch.QueueBind(queue, "1", hx, false, nil); err != nil {
		return fmt.Errorf("messaging: bind queue %q to %q: %w", queue, hx, err)
	}
	return nil
}

// NewPartitionSubscriber connects a subscriber for the partition queues of
// spec.Group, declared with [DeclarePartitions] before it returns.
// Subscribe(ctx, PartitionQueue(group, p)) consumes partition p: messages
// one at a time (prefetch 1, so a message given back by a dying consumer
// is the only one whose delivery count grows), each acked or nacked
// (requeued at the head of its queue) before the next arrives. With a single
// active consumer per queue, a second subscription to a partition, here or
// in another process, waits until the first one ends and then receives the
// partition's messages, unacked ones first. The subscriber reconnects on its
// own and redeclares the partition queue it consumes.
//
// It returns the errors of DeclarePartitions.
func NewPartitionSubscriber(ctx context.Context, cfg *AMQPConfig, spec PartitionSpec) (message.Subscriber, error) {
	if err := DeclarePartitions(ctx, cfg, spec); err != nil {
		return nil, err
	}
	c, _ := cfg.resolve() // DeclarePartitions validated it
	wc := c.wamqpConfig(partitionTopology{hx: hashExchange(c.Exchange, spec.Group), args: spec.queueArgs()})
	wc.Queue.GenerateName = wamqp.GenerateQueueNameTopicName
	wc.Consume.Qos = wamqp.QosConfig{PrefetchCount: 1}
	sub, err := wamqp.NewSubscriber(wc, watermill.NewSlogLogger(c.Logger))
	if err != nil {
		return nil, fmt.Errorf("new partition subscriber: %w", err)
	}
	return &partitionSubscriber{sub: sub}, nil
}

// partitionSubscriber closes each subscription's channel as soon as its
// context ends (see untilDone).
type partitionSubscriber struct{ sub *wamqp.Subscriber }

func (s *partitionSubscriber) Subscribe(ctx context.Context, queue string) (<-chan *message.Message, error) {
	in, err := s.sub.Subscribe(ctx, queue)
	if err != nil {
		return nil, fmt.Errorf("subscribe %q: %w", queue, err)
	}
	return untilDone(ctx, in), nil
}

func (s *partitionSubscriber) Close() error { return s.sub.Close() }

// partitionTopology redeclares, on each subscribe and reconnect, the
// partition queue consumed, with its arguments and binding.
type partitionTopology struct {
	hx   string
	args amqp.Table
}

var _ wamqp.TopologyBuilder = partitionTopology{}

func (partitionTopology) ExchangeDeclare(ch *amqp.Channel, exchange string, _ wamqp.Config) error {
	return declareMainExchange(ch, exchange)
}

func (t partitionTopology) BuildTopology(ch *amqp.Channel, queue, _ string, _ wamqp.Config, _ watermill.LoggerAdapter) error {
	return declarePartitionQueue(ch, t.hx, queue, t.args)
}
