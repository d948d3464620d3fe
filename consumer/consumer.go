package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/conf"
	"github.com/bentoevents/bento/internal/tracing"
	"github.com/bentoevents/bento/internal/wire"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// SubscriberFactory returns the subscriber of a consumer group, bound to the
// topic patterns of its handlers. Without Config.Partitions, each of its
// subscriptions competes for the group's messages. With Partitions, it must
// have declared the group's partition queues, and Subscribe(ctx,
// messaging.PartitionQueue(group, p)) must consume partition p, with a
// single active consumer across every instance, as the subscribers of
// rabbitmq.NewPartitionSubscriber, MemoryBus.PartitionSubscriber and
// dbbus.Bus.PartitionSubscriber do.
type SubscriberFactory func(patterns []string) (message.Subscriber, error)

// Consumer runs typed handlers for one consumer group: each message is
// decoded, deduplicated by the inbox, handled in the inbox's transaction,
// retried with backoff when it fails, and dead-lettered when it keeps
// failing or cannot be decoded. Build it with NewAMQP, NewMemory,
// NewDatabase or New, add handlers with Handle, then Run.
type Consumer struct {
	cfg       Config
	db        *gorm.DB
	inbox     *inbox.Inbox
	newSub    SubscriberFactory
	dead      message.Publisher
	deadTopic string
	closers   []func() error
	members   *members // with Partitions
	owned     atomic.Pointer[[]int]
	drainMu   sync.Mutex // one drain of parked events at a time
	// sweepFrom is where the sweeper's next window starts (its goroutine only).
	sweepFrom inbox.Aggregate
	// parkedSince is set when the instance parks an event, and cleared by
	// the sweep that starts next (see startSweeper).
	parkedSince atomic.Bool
	breaker     *breaker
	crashes     *crashLedger  // nil when MaxCrashes is off
	tap         *rabbitmq.Tap // copies of the dead letters; nil without a delivery limit
	// limited is true when the bus dead-letters a message delivered more
	// than cfg.DeliveryLimit times: RabbitMQ's quorum partition queues,
	// or the database bus with a delivery limit.
	limited   bool
	metrics   metrics
	deadDepth func(context.Context) (int, error) // messages in the dead-letter queue; nil when unknown
	live      atomic.Bool                        // subscribed, and Run has not returned
	lapsed    atomic.Bool                        // membership lapsed

	mu       sync.Mutex
	handlers map[string]handler
	started  bool
	running  chan struct{}
}

// New returns a consumer over db that reads from the subscriber
// newSub returns and publishes dead letters to deadTopic on dead. db needs
// the inbox and outbox tables (inbox.Migrate, outbox.Migrate).
//
// Errors: ErrInvalidConfig, inbox.ErrNotMigrated.
func New(db *gorm.DB, newSub SubscriberFactory, dead message.Publisher, deadTopic string, cfg *Config) (*Consumer, error) {
	return newConsumer(db, newSub, dead, deadTopic, cfg, "")
}

// newConsumer is New, with the messaging system named on consumer spans.
func newConsumer(db *gorm.DB, newSub SubscriberFactory, dead message.Publisher, deadTopic string, cfg *Config, system string) (*Consumer, error) {
	c, err := cfg.withDefaults()
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if newSub == nil {
		errs = append(errs, fmt.Errorf("%w: nil subscriber factory", ErrInvalidConfig))
	}
	if dead == nil || deadTopic == "" {
		errs = append(errs, fmt.Errorf("%w: dead-letter publisher and topic are required", ErrInvalidConfig))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var mem *members
	if c.Partitions > 0 {
		if mem, err = newMembers(db, c.Group, c.Partitions); err != nil {
			return nil, err
		}
	}
	icfg := &inbox.Config{Consumer: c.Group, TxOptions: c.TxOptions, Logger: c.Logger, Registerer: c.Registerer,
		TracerProvider: c.TracerProvider, Propagator: c.Propagator, System: system, Versions: c.Versions}
	if mem != nil {
		icfg.BeginTx, icfg.BeforeCommit = mem.guards(c.TakeoverTime, c.Logger)
	}
	in, err := inbox.New(db, icfg)
	if errors.Is(err, inbox.ErrNotMigrated) {
		return nil, fmt.Errorf("consumer %s: %w", c.Group, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	m, err := newMetrics(c.Registerer, c.Group)
	if err != nil {
		return nil, fmt.Errorf("consumer: metrics: %w", err)
	}
	dead = countingPublisher{Publisher: dead, dead: m.deadLettered}
	m.partitionCount.Set(float64(max(c.Partitions, 0)))
	var ledger *crashLedger
	if c.MaxCrashes > 0 {
		ledger = newCrashLedger(db, c.Group)
	}
	return &Consumer{
		cfg: c, db: db, inbox: in, newSub: newSub, dead: dead, deadTopic: deadTopic, members: mem,
		breaker: newBreaker(c.RetryInitialInterval, c.RetryMaxInterval), metrics: m, crashes: ledger,
		limited:  c.Partitions > 0 && c.QueueType == rabbitmq.Quorum,
		handlers: map[string]handler{},
		running:  make(chan struct{}),
	}, nil
}

// Config returns the consumer's configuration with defaults filled in.
func (c *Consumer) Config() Config { return c.cfg }

// DeadLetterTopic is the topic dead letters of group are published under:
// "bento-dead.<group>", with characters a topic cannot hold replaced by '_'.
// Its queue is "<group>.dead".
func DeadLetterTopic(group string) string {
	return wire.DeadLetterTopic(group)
}

// NewMemory returns a consumer of group cfg.Group on the in-memory
// bus: with Partitions, of the group's partition queues (see
// MemoryBus.DeclarePartitions), else of the queue named after the group.
// Dead letters go to the queue "<group>.dead", bound to
// DeadLetterTopic(group) on the same bus (so a consumer bound to "#" sees
// them too). cfg's zero fields take their defaults.
//
// Errors: ErrInvalidConfig.
func NewMemory(db *gorm.DB, bus *messaging.MemoryBus, cfg *Config) (*Consumer, error) {
	if bus == nil {
		return nil, fmt.Errorf("%w: nil bus", ErrInvalidConfig)
	}
	resolved, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg = &resolved
	topic := DeadLetterTopic(cfg.Group)
	if err := bus.DeclareQueue(DeadLetterQueue(cfg.Group), topic); err != nil {
		return nil, fmt.Errorf("consumer: declare dead-letter queue: %w", err)
	}
	newSub := func(patterns []string) (message.Subscriber, error) {
		if cfg.Partitions > 0 {
			if err := bus.DeclarePartitions(cfg.Group, cfg.Partitions, patterns...); err != nil {
				return nil, err
			}
			return bus.PartitionSubscriber(cfg.BatchSize), nil
		}
		if err := bus.DeclareQueue(cfg.Group, patterns...); err != nil {
			return nil, err
		}
		return bus.Subscriber(cfg.Group, patterns...), nil
	}
	c, err := newConsumer(db, newSub, bus, topic, cfg, tracing.SystemMemory)
	if err != nil {
		return nil, err
	}
	deadQueue := DeadLetterQueue(cfg.Group)
	c.deadDepth = func(context.Context) (int, error) { return bus.Depth(deadQueue) }
	return c, nil
}

// NewDatabase returns a consumer of group cfg.Group on the database bus
// (package dbbus), whose tables live in the database bus's db (dbbus.Migrate
// created them; it may be db itself): with Partitions, of the group's
// partition queues (dbbus.DeclarePartitions, bound by Run to the event
// types of its handlers), each consumed with bus.PartitionSubscriber, a
// single active consumer per partition across every process; without, of
// the group declared with dbbus.DeclareGroup, its subscriptions competing.
// Dead letters are published on bus under DeadLetterTopic(group), bound to
// the group DeadLetterQueue(group), declared here. cfg's zero fields take
// their defaults, but for DeliveryLimit: the bus's own
// (dbbus.Bus.DeliveryLimit), to which a larger one is lowered too, so that
// the consumer dead-letters a message that keeps coming back, holding its
// aggregate, before the bus would; it reads the bus's count of a
// message's earlier deliveries from messaging.MetaDeliveryCount.
//
// Errors: ErrInvalidConfig, dbbus.ErrTopologyMismatch (the group is
// declared with another partition count, or partitioned where cfg is not,
// or the reverse; Run returns it too), or the database's error.
func NewDatabase(db *gorm.DB, bus *dbbus.Bus, cfg *Config) (*Consumer, error) {
	if bus == nil {
		return nil, fmt.Errorf("%w: nil bus", ErrInvalidConfig)
	}
	ownLimit := cfg != nil && cfg.DeliveryLimit != 0
	resolved, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if busLimit := bus.DeliveryLimit(); busLimit >= 0 && (!ownLimit || resolved.DeliveryLimit > busLimit) {
		resolved.DeliveryLimit = busLimit
	}
	cfg = &resolved
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic := DeadLetterTopic(cfg.Group)
	deadQueue := DeadLetterQueue(cfg.Group)
	if err := dbbus.DeclareGroup(ctx, bus.DB(), deadQueue, topic); err != nil {
		return nil, fmt.Errorf("consumer: declare dead-letter queue: %w", err)
	}
	newSub := func(patterns []string) (message.Subscriber, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if cfg.Partitions > 0 {
			if err := dbbus.DeclarePartitions(ctx, bus.DB(), cfg.Group, cfg.Partitions, patterns...); err != nil {
				return nil, err
			}
			return bus.PartitionSubscriber(cfg.BatchSize), nil
		}
		if err := dbbus.DeclareGroup(ctx, bus.DB(), cfg.Group, patterns...); err != nil {
			return nil, err
		}
		// Competing subscriptions share the messages out as a broker's
		// round-robin does: each claims a batch (one message, unless
		// BatchSize says otherwise), not every message that is ready.
		return bus.BatchSubscriber(cfg.BatchSize), nil
	}
	c, err := newConsumer(db, newSub, bus, topic, cfg, tracing.SystemDatabase)
	if err != nil {
		return nil, err
	}
	c.limited = bus.DeliveryLimit() >= 0
	c.deadDepth = func(ctx context.Context) (int, error) { return dbbus.Depth(ctx, bus.DB(), deadQueue) }
	return c, nil
}

// NewAMQP returns a consumer of group cfg.Group on RabbitMQ. It declares
// what Declare does, with the event types of its handlers: with
// cfg.Partitions, it reads the group's partition queues, declared by Run
// and bound on amqpCfg.Exchange to those types; it needs RabbitMQ's
// consistent-hash exchange plugin, and Run fails with
// rabbitmq.ErrHashExchangeMissing without it. Without Partitions, it reads
// the durable queue named after the group. Dead letters go to the exchange
// "<exchange>.dead" with routing key DeadLetterTopic(group), bound to the
// durable queue "<group>.dead", declared here, so they never mix with
// events; the partition queues' delivery limit sends poison there too,
// and a copy of each to DeadLetterTap(group), declared here as well.
// The zero fields of amqpCfg and cfg take their defaults.
//
// Errors: ErrInvalidConfig, rabbitmq.ErrInvalidConfig (a nil amqpCfg
// names no URL), rabbitmq.ErrTopologyMismatch (a queue declared with
// another Config; Run returns it too), or the broker's error.
func NewAMQP(ctx context.Context, db *gorm.DB, amqpCfg *rabbitmq.Config, cfg *Config) (*Consumer, error) {
	resolved, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg = &resolved
	if err := declareDeadLetters(ctx, amqpCfg, cfg); err != nil {
		return nil, err
	}
	topic := DeadLetterTopic(cfg.Group)
	dead, err := rabbitmq.NewPublisher(ctx, deadLetterConfig(amqpCfg))
	if err != nil {
		return nil, fmt.Errorf("consumer: dead-letter publisher: %w", err)
	}
	newSub := func(patterns []string) (message.Subscriber, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if cfg.Partitions > 0 {
			spec := partitionSpec(amqpCfg.ExchangeName(), cfg, patterns) // what Declare declares
			spec.Prefetch = cfg.BatchSize
			subCfg := conf.Value(amqpCfg)
			subCfg.Heartbeat = partitionHeartbeat(amqpCfg, cfg.TakeoverTime)
			return rabbitmq.NewPartitionSubscriber(ctx, &subCfg, spec)
		}
		return rabbitmq.NewSubscriber(ctx, amqpCfg, cfg.Group, patterns...) // declares what rabbitmq.DeclareQueue does
	}
	c, err := newConsumer(db, newSub, dead, topic, cfg, tracing.SystemRabbitMQ)
	if err != nil {
		_ = dead.Close()
		return nil, err
	}
	c.closers = append(c.closers, dead.Close)
	if hasTap(cfg) {
		c.tap = rabbitmq.NewTap(deadLetterConfig(amqpCfg), DeadLetterTap(cfg.Group))
		c.closers = append(c.closers, c.tap.Close)
	}
	deadQueue := DeadLetterQueue(cfg.Group)
	c.deadDepth = func(ctx context.Context) (int, error) { return rabbitmq.QueueDepth(ctx, amqpCfg, deadQueue) }
	return c, nil
}

// minPartitionHeartbeat bounds how short partitionHeartbeat makes the
// heartbeat on its own: on a loaded host, shorter ones are missed and
// healthy links dropped, each drop a give-back of every partition.
const minPartitionHeartbeat = 5 * time.Second

// partitionHeartbeat is the AMQP heartbeat of the partition subscriptions:
// amqpCfg's, at most half of TakeoverTime but not below
// minPartitionHeartbeat unless amqpCfg's is (in whole seconds, at least
// one), so that the broker drops the link of an instance that froze, and
// hands its partitions on, about when its membership expires.
func partitionHeartbeat(amqpCfg *rabbitmq.Config, takeover time.Duration) time.Duration {
	h := rabbitmq.DefaultHeartbeat
	if amqpCfg != nil && amqpCfg.Heartbeat != 0 {
		h = amqpCfg.Heartbeat
	}
	return max(min(h, max(takeover/2, minPartitionHeartbeat)).Truncate(time.Second), time.Second)
}

// PartitionSpec returns the partition queues of the consumer group cfg
// describes, on the exchange named exchange: what NewAMQP's consumer
// declares, with Patterns left empty. Declare declares them, with the
// rest of the group's objects, in one call; this is for code that
// declares them itself with rabbitmq.DeclarePartitions. cfg's zero fields
// take their defaults (a nil cfg is a zero Config).
func PartitionSpec(exchange string, cfg *Config) rabbitmq.PartitionSpec {
	c, _ := cfg.withDefaults() // a bad config fails when the spec is declared
	return partitionSpec(exchange, &c, nil)
}

// Group returns the consumer group.
func (c *Consumer) Group() string { return c.cfg.Group }

// DeadLetterTopic returns the topic dead letters are published under.
func (c *Consumer) DeadLetterTopic() string { return c.deadTopic }

// Partitions returns the partitions this instance handles now, in order:
// none before Run, after it returns, or while its membership has lapsed,
// and none for a consumer without Config.Partitions.
func (c *Consumer) Partitions() []int {
	if p := c.owned.Load(); p != nil {
		return slices.Clone(*p)
	}
	return nil
}

// Running is closed once Run has subscribed and messages flow.
func (c *Consumer) Running() <-chan struct{} { return c.running }

// Health returns nil while the consumer runs: Run has subscribed and not
// returned, and, for a partitioned group, its membership is current.
//
// Errors: ErrNotRunning, ErrMembershipLapsed.
func (c *Consumer) Health() error {
	switch {
	case !c.live.Load():
		return ErrNotRunning
	case c.lapsed.Load():
		return ErrMembershipLapsed
	}
	return nil
}

// markRunning marks the consumer subscribed: Running and Health say so.
func (c *Consumer) markRunning() {
	c.live.Store(true)
	close(c.running)
}

// Run subscribes and handles messages until ctx ends, then waits up to
// CloseTimeout for the handlers in flight and returns. A consumer runs once.
func (c *Consumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.started {
		c.mu.Unlock()
		return ErrRunning
	}
	c.started = true
	patterns := c.cfg.Registry.Types()
	var bound []string
	for _, p := range patterns {
		if _, ok := c.handlers[p]; ok {
			bound = append(bound, p)
		}
	}
	c.mu.Unlock()
	defer func() {
		c.live.Store(false)
		for _, f := range c.closers {
			_ = f()
		}
	}()
	if len(bound) == 0 {
		return fmt.Errorf("%w: consumer %s has no handlers", ErrInvalidConfig, c.cfg.Group)
	}
	gctx, stopGauges := context.WithCancel(ctx)
	gaugesDone := make(chan struct{})
	go func() {
		defer close(gaugesDone)
		c.refreshGauges(gctx)
	}()
	defer func() {
		stopGauges()
		<-gaugesDone
	}()
	if c.cfg.Partitions > 0 {
		handle, err := c.chain()
		if err != nil {
			return err
		}
		return c.runPartitioned(ctx, handle, bound)
	}
	sub, err := c.newSub(bound)
	if err != nil {
		return fmt.Errorf("consumer: subscribe %s: %w", c.cfg.Group, err)
	}
	defer sub.Close()

	wlog := watermill.NewSlogLogger(c.cfg.Logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: c.cfg.CloseTimeout}, wlog)
	if err != nil {
		return fmt.Errorf("consumer: router: %w", err)
	}
	poison, err := c.poison()
	if err != nil {
		return err
	}
	router.AddMiddleware(poison, c.guard, c.retry, middleware.Recoverer, c.inbox.Middleware)
	for i := range c.cfg.Subscriptions { // competing subscriptions to the group's queue
		name := c.cfg.Group
		if i > 0 {
			name = fmt.Sprintf("%s#%d", c.cfg.Group, i+1)
		}
		router.AddConsumerHandler(name, c.cfg.Group, sub, c.dispatch)
	}

	go func() {
		select {
		case <-router.Running():
			c.markRunning()
		case <-ctx.Done():
		}
	}()
	if err := router.Run(ctx); err != nil {
		return fmt.Errorf("consumer: consumer %s: %w", c.cfg.Group, err)
	}
	return nil
}
