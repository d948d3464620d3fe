package redisbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
)

var (
	// ErrInvalidConfig is wrapped by every problem found in a Config, a
	// group name or a topic list; the message names each one.
	ErrInvalidConfig = errors.New("redisbus: invalid config")
	// ErrTopicPattern is returned for a topic holding '*' or '#': a Redis
	// stream is read by its exact name, there are no topic patterns.
	ErrTopicPattern = errors.New("redisbus: topic patterns are not supported")
	// ErrClosed is returned by a publisher or subscriber used after Close.
	ErrClosed = errors.New("redisbus: closed")
)

// Defaults of Config.
const (
	DefaultClaimInterval = 500 * time.Millisecond
	DefaultMaxIdleTime   = 2 * time.Second
)

// setupTimeout bounds the consumer-group creation NewSubscriber does.
const setupTimeout = 10 * time.Second

// Config configures the Redis publisher and subscribers. Addr is required;
// zero fields take their defaults.
type Config struct {
	// Addr is the Redis server, host:port, e.g. "127.0.0.1:6379". Required.
	Addr string
	// DB is the Redis logical database. Defaults to 0.
	DB int
	// StreamPrefix is prepended to every topic to form its stream name, so
	// several applications (or tests) can share one Redis database. It
	// must not hold '*' or '#'. Defaults to none: the stream is named after
	// the topic, the event type.
	StreamPrefix string
	// Logger receives the logs of watermill-redisstream. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// ClaimInterval is how often each subscription looks for pending
	// entries of its group that a consumer took and did not ack for
	// MaxIdleTime, and claims them for redelivery. Defaults to 500ms.
	ClaimInterval time.Duration
	// MaxIdleTime is how long a delivered, un-acked entry stays with its
	// consumer before another consumer of the group may claim it: the
	// redelivery delay after a consumer died or closed. It must exceed the
	// longest time a message spends in a handler, retries included, or a
	// slow message is redelivered while still in hand (the inbox absorbs
	// the duplicate). Defaults to 2s.
	MaxIdleTime time.Duration
}

// resolve returns a validated copy of c with the defaults filled in.
func (c Config) resolve() (Config, error) {
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("Addr: required (host:port, e.g. 127.0.0.1:6379)"))
	}
	if c.DB < 0 {
		errs = append(errs, fmt.Errorf("DB: %d is negative", c.DB))
	}
	if strings.ContainsAny(c.StreamPrefix, "*#") {
		errs = append(errs, fmt.Errorf("StreamPrefix: %q holds '*' or '#'", c.StreamPrefix))
	}
	if c.ClaimInterval < 0 {
		errs = append(errs, fmt.Errorf("ClaimInterval: %v is negative", c.ClaimInterval))
	}
	if c.MaxIdleTime < 0 {
		errs = append(errs, fmt.Errorf("MaxIdleTime: %v is negative", c.MaxIdleTime))
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.ClaimInterval == 0 {
		c.ClaimInterval = DefaultClaimInterval
	}
	if c.MaxIdleTime == 0 {
		c.MaxIdleTime = DefaultMaxIdleTime
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// client returns a new Redis client; it connects on first use.
func (c Config) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: c.Addr, DB: c.DB})
}

// stream returns the stream name of topic.
func (c Config) stream(topic string) string { return c.StreamPrefix + topic }

// wlog is the Watermill logger of c, with the error a closed client reports
// at shutdown turned into a debug line.
func (c Config) wlog() watermill.LoggerAdapter {
	return closeQuiet{watermill.NewSlogLogger(c.Logger)}
}

// checkTopic returns what is wrong with a topic.
func checkTopic(topic string) error {
	switch {
	case topic == "":
		return fmt.Errorf("%w: empty topic", ErrInvalidConfig)
	case strings.ContainsAny(topic, "*#"):
		return fmt.Errorf("%w: %q (subscribe to exact event types)", ErrTopicPattern, topic)
	}
	return nil
}

// NewPublisher returns a publisher that appends each message, with XADD, to
// the stream named after its topic (prefixed with Config.StreamPrefix).
// The entry holds the message UUID, its metadata (msgpack) and its payload,
// watermill-redisstream's default format. Publish returns once Redis has
// appended every message; streams are not trimmed. The publisher connects
// on first use and is safe for concurrent use.
//
// Publish returns an error wrapping ErrTopicPattern for a topic with a
// wildcard, ErrInvalidConfig for an empty one, and ErrClosed after Close.
//
// Errors: ErrInvalidConfig.
func NewPublisher(cfg Config) (message.Publisher, error) {
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: c.client()}, c.wlog())
	if err != nil {
		return nil, fmt.Errorf("redisbus: new publisher: %w", err)
	}
	return &publisher{pub: pub, cfg: c}, nil
}

type publisher struct {
	pub *redisstream.Publisher
	cfg Config

	// mu makes Close wait for the Publish calls in progress;
	// watermill-redisstream's publisher does not guard its closed flag.
	mu     sync.RWMutex
	closed bool
}

// Publish implements message.Publisher.
func (p *publisher) Publish(topic string, msgs ...*message.Message) error {
	if err := checkTopic(topic); err != nil {
		return fmt.Errorf("redisbus: publish: %w", err)
	}
	if slices.Contains(msgs, nil) {
		return fmt.Errorf("redisbus: publish to %q: nil message", topic)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	if err := p.pub.Publish(p.cfg.stream(topic), msgs...); err != nil {
		return fmt.Errorf("redisbus: publish to %q: %w", topic, err)
	}
	return nil
}

// MessagingSystem returns "redis", the messaging.system attribute the
// projector gives the spans of its publishes (projector.SystemNamer).
func (p *publisher) MessagingSystem() string { return "redis" }

// Close waits for the Publish calls in progress and closes the connections.
// It is idempotent.
func (p *publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if err := p.pub.Close(); err != nil {
		return fmt.Errorf("redisbus: close publisher: %w", err)
	}
	return nil
}

// NewConsumer returns an inbox consumer of the group ccfg.Group over Redis:
// its subscriber reads the streams of the event types its handlers handle
// (see NewSubscriber), and its dead letters are appended to the stream
// consumer.DeadLetterTopic(group) (prefixed with Config.StreamPrefix) through
// NewPublisher. The dead-letter publisher is closed when the consumer's Run
// returns. db needs the inbox and outbox tables (inbox.Migrate,
// outbox.Migrate). This bus has no partitions: the consumer runs without
// them whatever ccfg.Partitions, ccfg.PartitionConcurrency and
// ccfg.BatchSize say, with ccfg.Subscriptions competing readers and no
// order across them. ccfg's zero fields take their defaults; it needs a
// Group.
//
// Errors: ErrInvalidConfig, consumer.ErrInvalidConfig.
func NewConsumer(db *gorm.DB, cfg Config, ccfg *consumer.Config) (*consumer.Consumer, error) {
	var unpartitioned consumer.Config
	if ccfg != nil {
		unpartitioned = *ccfg
	}
	unpartitioned.Partitions, unpartitioned.PartitionConcurrency, unpartitioned.BatchSize = -1, 0, 0
	ccfg = &unpartitioned
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	dead, err := NewPublisher(c)
	if err != nil {
		return nil, err
	}
	group := ccfg.Group
	newSub := func(topics []string) (message.Subscriber, error) {
		s, err := newSubscriber(c, group, topics)
		if err != nil {
			_ = dead.Close()
			return nil, err
		}
		s.closers = append(s.closers, dead.Close)
		return s, nil
	}
	consumer, err := consumer.New(db, newSub, dead, consumer.DeadLetterTopic(group), ccfg)
	if err != nil {
		_ = dead.Close()
		return nil, err
	}
	return consumer, nil
}

// closeQuiet logs the errors of a closing subscription at debug level:
// watermill-redisstream's reader, blocked in XREADGROUP, reports one when
// Close cancels its context or closes the connection under it.
type closeQuiet struct{ watermill.LoggerAdapter }

func (l closeQuiet) Error(msg string, err error, fields watermill.LogFields) {
	if errors.Is(err, context.Canceled) || errors.Is(err, redis.ErrClosed) || errors.Is(err, net.ErrClosed) {
		l.LoggerAdapter.Debug(msg, fields.Add(watermill.LogFields{"err": err}))
		return
	}
	l.LoggerAdapter.Error(msg, err, fields)
}

func (l closeQuiet) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return closeQuiet{l.LoggerAdapter.With(fields)}
}
