package redisbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// MetaUnmarshalError is the metadata key under which a subscriber delivers
// a stream entry it could not read as a Watermill message (one written by
// another program, say), with a fresh UUID and the entry's fields as a JSON
// payload. bento's inbox cannot decode such a message and dead-letters it;
// watermill-redisstream alone would stop reading the stream.
const MetaUnmarshalError = "redisbus_unmarshal_error"

// NewSubscriber returns a subscriber of the consumer group group that reads
// the streams of topics, exact topics only. Before it returns, the group is
// created on each stream (and the stream too, if missing) starting at the
// stream's first entry ("0"): from then on every entry appended to those
// streams is kept for the group, whether or not a subscription is running.
// A group that already exists keeps its position.
//
// Subscribe ignores its topic argument and delivers the messages of all the
// streams on one channel. Each Subscribe call is a new Redis consumer of the
// group, named "<host>-<pid>-<random>"; several of them, in one process or
// many, compete for the group's entries. A subscription delivers one
// message per stream at a time and waits for its Ack or Nack: an acked
// entry is XACKed; a nacked one is delivered again at once, with the same
// UUID, metadata and payload. Messages of one stream come in stream order,
// except redeliveries.
//
// When the Subscribe context ends, the channel is closed; a message in the
// consumer's hands still counts its Ack or Nack until the subscriber is
// closed. An entry delivered and not acked (nacked after the context ended,
// left in hand at Close, or read ahead but never delivered) stays pending
// in the group: once it has been idle for Config.MaxIdleTime, another
// subscription of the group claims it, within Config.ClaimInterval, and
// delivers it again.
//
// Errors: ErrInvalidConfig (naming each problem), ErrTopicPattern, or the
// Redis error of creating the group.
func NewSubscriber(cfg Config, group string, topics []string) (message.Subscriber, error) {
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	s, err := newSubscriber(c, group, topics)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func newSubscriber(c Config, group string, topics []string) (*subscriber, error) {
	var errs []error
	if group == "" {
		errs = append(errs, fmt.Errorf("%w: empty group", ErrInvalidConfig))
	}
	if len(topics) == 0 {
		errs = append(errs, fmt.Errorf("%w: no topics", ErrInvalidConfig))
	}
	var streams []string
	for _, t := range topics {
		if err := checkTopic(t); err != nil {
			errs = append(errs, err)
		} else if st := c.stream(t); !slices.Contains(streams, st) {
			streams = append(streams, st)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("redisbus: new subscriber: %w", err)
	}

	client := c.client()
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	for _, st := range streams {
		err := client.XGroupCreateMkStream(ctx, st, group, "0").Err()
		if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
			return nil, fmt.Errorf("redisbus: create group %q on stream %q: %w", group, st, err)
		}
	}
	return &subscriber{cfg: c, group: group, streams: streams, closing: make(chan struct{})}, nil
}

type subscriber struct {
	cfg     Config
	group   string
	streams []string
	closers []func() error // run by Close, after the subscriptions stopped

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	subs    []*subscription
}

// Subscribe implements message.Subscriber; topic is ignored.
func (s *subscriber) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	acks := newAckHook()
	client := s.cfg.client()
	client.AddHook(acks)
	wsub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:          client,
		Unmarshaller:    tolerant{},
		Consumer:        consumerName(),
		ConsumerGroup:   s.group,
		NackResendSleep: redisstream.NoSleep,
		ClaimInterval:   s.cfg.ClaimInterval,
		MaxIdleTime:     s.cfg.MaxIdleTime,
		OldestId:        "0",
	}, s.cfg.wlog())
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("redisbus: subscribe: %w", err)
	}
	sub := &subscription{
		closing: s.closing,
		wsub:    wsub,
		acks:    acks,
		maxIdle: s.cfg.MaxIdleTime,
		out:     make(chan *message.Message),
		done:    make(chan struct{}),
	}
	// The streams are read under a context of their own, ended by
	// wsub.Close only once the messages in hand are settled, so that an Ack
	// given after ctx ended still reaches Redis.
	rctx := context.WithoutCancel(ctx)
	ins := make([]<-chan *message.Message, 0, len(s.streams))
	for _, st := range s.streams {
		in, err := wsub.Subscribe(rctx, st)
		if err != nil {
			_ = wsub.Close()
			return nil, fmt.Errorf("redisbus: subscribe to stream %q: %w", st, err)
		}
		ins = append(ins, in)
	}
	sub.start(ctx, s.streams, ins)
	s.subs = append(s.subs, sub)
	return sub.out, nil
}

// Close closes every subscription's channel, leaves the messages in hand
// pending for the group, waits for the subscriptions to stop and closes
// their connections. It is idempotent.
func (s *subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	subs := s.subs
	s.mu.Unlock()
	var errs []error
	for _, sub := range subs {
		<-sub.done
		errs = append(errs, sub.closeErr)
	}
	for _, f := range s.closers {
		errs = append(errs, f())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redisbus: close subscriber: %w", err)
	}
	return nil
}

// subscription is one Subscribe call: a watermill-redisstream subscriber
// (one Redis consumer) reading every stream, and a relay per stream into
// out.
type subscription struct {
	closing <-chan struct{} // closed by the subscriber's Close
	wsub    *redisstream.Subscriber
	acks    *ackHook
	maxIdle time.Duration
	out     chan *message.Message

	sending  sync.WaitGroup // relays that may still send to out
	settled  sync.WaitGroup // relays whose last message is not settled
	done     chan struct{}  // closed once wsub is closed and the relays returned
	closeErr error
}

// start relays each stream's channel of ins to out until ctx ends or the
// subscriber closes, then closes out, and closes wsub once the messages in
// hand are settled.
func (sub *subscription) start(ctx context.Context, streams []string, ins []<-chan *message.Message) {
	var relays sync.WaitGroup
	sub.sending.Add(len(ins))
	sub.settled.Add(len(ins))
	relays.Add(len(ins))
	for i, in := range ins {
		go func() {
			defer relays.Done()
			sub.relay(ctx, streams[i], in)
		}()
	}
	go func() {
		sub.sending.Wait()
		close(sub.out)
		sub.settled.Wait()
		sub.closeErr = sub.wsub.Close()
		relays.Wait()
		close(sub.done)
	}()
}

// relay forwards the messages of one stream to out, one at a time, until
// the Subscribe context ends, the subscriber closes, or in is closed. Then
// it stops sending, waits until the last message it delivered is settled,
// and drains in until wsub.Close closes it. What it drains stays pending.
func (sub *subscription) relay(ctx context.Context, stream string, in <-chan *message.Message) {
	var (
		last *message.Message // the last message delivered
		base uint64           // XACKs of stream before last was delivered
	)
relay:
	for {
		var m *message.Message
		select {
		case msg, ok := <-in:
			if !ok {
				break relay
			}
			m = msg
		case <-ctx.Done():
			break relay
		case <-sub.closing:
			break relay
		}
		if ctx.Err() != nil || isClosed(sub.closing) {
			break relay // m stays pending
		}
		n := sub.acks.count(stream)
		select {
		case sub.out <- m:
			last, base = m, n
		case <-ctx.Done():
			break relay
		case <-sub.closing:
			break relay
		}
		select {
		case <-m.Acked():
		case <-m.Nacked(): // wsub sends a copy at once
		case <-ctx.Done():
			break relay
		case <-sub.closing:
			break relay
		}
	}
	sub.sending.Done()
	sub.settle(stream, last, base)
	sub.settled.Done()
	for range in {
	}
}

// settle waits until last (nil: none) is nacked, or acked and its XACK
// done. An Ack given before the subscriber closed still counts; one that
// does not reach Redis within MaxIdleTime is given up, as by then another
// consumer may have claimed the entry anyway.
func (sub *subscription) settle(stream string, last *message.Message, base uint64) {
	if last == nil {
		return
	}
	select {
	case <-last.Acked():
	case <-last.Nacked():
		return
	case <-sub.closing:
		if !isClosed(last.Acked()) {
			return // left in hand: stays pending
		}
	}
	timeout := time.NewTimer(sub.maxIdle)
	defer timeout.Stop()
	for {
		n, changed := sub.acks.wait(stream)
		if n > base {
			return
		}
		select {
		case <-changed:
		case <-timeout.C:
			return
		}
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// consumerName returns a Redis consumer name unique to this subscription.
func consumerName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "redisbus"
	}
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), watermill.NewShortUUID())
}

// ackHook counts the successful XACKs of a client per stream, so a
// subscription knows when the Ack of a message has reached Redis: entries
// of one stream are acked one after the other by watermill-redisstream,
// and the next one is delivered only after the XACK of the previous. (It
// also XACKs an entry that XCLAIM finds deleted; such a rare extra count
// only shortens a wait.)
type ackHook struct {
	mu      sync.Mutex
	n       map[string]uint64
	changed chan struct{} // closed and replaced on every XACK
}

func newAckHook() *ackHook {
	return &ackHook{n: map[string]uint64{}, changed: make(chan struct{})}
}

func (h *ackHook) count(stream string) uint64 {
	n, _ := h.wait(stream)
	return n
}

// wait returns the XACK count of stream and a channel closed at the next
// XACK.
func (h *ackHook) wait(stream string) (uint64, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[stream], h.changed
}

func (h *ackHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *ackHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *ackHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil || cmd.Name() != "xack" {
			return err
		}
		if args := cmd.Args(); len(args) > 1 {
			if stream, ok := args[1].(string); ok {
				h.mu.Lock()
				h.n[stream]++
				close(h.changed)
				h.changed = make(chan struct{})
				h.mu.Unlock()
			}
		}
		return nil
	}
}

// tolerant is watermill-redisstream's default format, except that an entry
// it cannot read is delivered with a fresh UUID, its fields as a JSON
// payload and the error under MetaUnmarshalError, instead of stopping the
// stream's subscription.
type tolerant struct {
	redisstream.DefaultMarshallerUnmarshaller
}

func (t tolerant) Unmarshal(values map[string]any) (msg *message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			msg, err = t.unreadable(values, fmt.Errorf("panic: %v", r)), nil
		}
	}()
	msg, err = t.DefaultMarshallerUnmarshaller.Unmarshal(values)
	if err != nil {
		return t.unreadable(values, err), nil
	}
	return msg, nil
}

func (tolerant) unreadable(values map[string]any, cause error) *message.Message {
	payload, err := json.Marshal(values)
	if err != nil {
		payload = []byte(fmt.Sprintf("%q", fmt.Sprint(values)))
	}
	m := message.NewMessage(watermill.NewUUID(), payload)
	m.Metadata.Set(MetaUnmarshalError, cause.Error())
	return m
}
