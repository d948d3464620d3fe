package bustest_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/messaging/bustest"
)

// lossy drops every tenth message it is asked to publish, and says it
// published it.
type lossy struct {
	message.Publisher
	mu      sync.Mutex
	n       int
	dropped []string
}

func (l *lossy) Publish(topic string, msgs ...*message.Message) error {
	var keep []*message.Message
	l.mu.Lock()
	for _, m := range msgs {
		l.n++
		if l.n%10 == 0 {
			l.dropped = append(l.dropped, m.UUID)
			continue
		}
		keep = append(keep, m)
	}
	l.mu.Unlock()
	if len(keep) == 0 {
		return nil
	}
	return l.Publisher.Publish(topic, keep...)
}

func (l *lossy) droppedIDs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.dropped)
}

// lossyBus returns a Factory over the memory bus whose publisher is lossy,
// and the lossy publishers it built.
func lossyBus() (bustest.Factory, func() []*lossy) {
	var mu sync.Mutex
	var built []*lossy
	f := func(t bustest.TB) *bustest.Bus {
		b := memoryBus(t)
		l := &lossy{Publisher: b.Publisher}
		mu.Lock()
		built = append(built, l)
		mu.Unlock()
		b.Publisher = l
		return b
	}
	return f, func() []*lossy {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(built)
	}
}

// errFatal is what recorder.Fatalf panics with.
var errFatal = errors.New("recorder: Fatalf")

// recorder is a bustest.TB that records failures instead of reporting
// them, and runs its cleanups when the check returns.
type recorder struct {
	t        *testing.T
	mu       sync.Mutex
	failures []string
	fatal    bool
	cleanups []func()
}

func (r *recorder) Helper() {}

func (r *recorder) Logf(format string, args ...any) {
	r.t.Logf("recorded log: "+format, args...)
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
	r.fatal = true
	r.mu.Unlock()
	panic(errFatal)
}

func (r *recorder) Cleanup(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, fn)
}

// record runs check on f with a recorder, then its cleanups (last first),
// and returns the recorder.
func record(t *testing.T, check func(bustest.TB, bustest.Factory), f bustest.Factory) *recorder {
	r := &recorder{t: t}
	func() {
		defer func() {
			if p := recover(); p != nil && p != errFatal {
				panic(p)
			}
		}()
		defer r.runCleanups()
		check(r, f)
	}()
	return r
}

func (r *recorder) runCleanups() {
	for {
		r.mu.Lock()
		n := len(r.cleanups)
		if n == 0 {
			r.mu.Unlock()
			return
		}
		fn := r.cleanups[n-1]
		r.cleanups = r.cleanups[:n-1]
		r.mu.Unlock()
		func() {
			defer func() {
				if p := recover(); p != nil && p != errFatal {
					panic(p)
				}
			}()
			fn()
		}()
	}
}

// ulidRE matches the message ids the suite names in its failures.
var ulidRE = regexp.MustCompile(`\b[0-9A-HJKMNP-TV-Z]{26}\b`)

// TestBrokenBusFailsTheSuite runs checks against a bus that silently loses
// every tenth message: they must fail and name the lost messages. The same
// checks on a healthy bus, through the same recorder, record nothing.
func TestBrokenBusFailsTheSuite(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		check func(bustest.TB, bustest.Factory)
		// want is what the failure about the lost messages says.
		want *regexp.Regexp
	}{
		{"CheckDelivery", bustest.CheckDelivery,
			regexp.MustCompile(`^CheckDelivery: 270 of 300 messages arrived .*; missing: \[`)},
		{"CheckConsumerGroups", bustest.CheckConsumerGroups,
			regexp.MustCompile(`^CheckConsumerGroups: the consumer of group g1 got 180 of 200 messages .*; missing: \[`)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, built := lossyBus()
			r := record(t, tc.check, f)
			require.NotEmpty(t, r.failures, "the check passed a bus that loses messages")
			assert.False(t, r.fatal, "the check should report the loss, not stop: %v", r.failures)

			var dropped []string
			for _, l := range built() {
				dropped = append(dropped, l.droppedIDs()...)
			}
			require.NotEmpty(t, dropped)
			var failure string
			for _, f := range r.failures {
				if tc.want.MatchString(f) {
					failure = f
				}
			}
			require.NotEmpty(t, failure, "no failure matches %s; failures: %q", tc.want, r.failures)
			named := ulidRE.FindAllString(failure, -1)
			require.NotEmpty(t, named, "the failure names no message: %s", failure)
			for _, id := range named {
				assert.Contains(t, dropped, id, "the failure names a message that was not lost: %s", failure)
			}
			t.Logf("recorded failures:\n%s", strings.Join(r.failures, "\n"))
		})
		t.Run(tc.name+"Healthy", func(t *testing.T) {
			t.Parallel()
			r := record(t, tc.check, memoryBus)
			assert.Empty(t, r.failures, "a healthy bus failed the check")
			assert.False(t, r.fatal)
		})
	}
}

// TestRecorderSeesFatal checks that the recorder stops a check at Fatalf
// and still runs its cleanups, so that TestBrokenBusFailsTheSuite can trust
// it.
func TestRecorderSeesFatal(t *testing.T) {
	t.Parallel()
	closed := make(chan struct{})
	broken := func(t bustest.TB) *bustest.Bus {
		b := memoryBus(t)
		t.Cleanup(func() { close(closed) })
		b.NewSubscriber = func(bustest.TB, string, []string) (message.Subscriber, error) {
			return nil, errors.New("no subscriptions today")
		}
		return b
	}
	r := record(t, bustest.CheckDelivery, broken)
	assert.True(t, r.fatal)
	require.Len(t, r.failures, 1)
	assert.Contains(t, r.failures[0], "no subscriptions today")
	select {
	case <-closed:
	case <-time.After(time.Second):
		t.Fatal("the Factory's cleanup did not run")
	}
}

// wrapped returns a Factory over the memory bus whose subscribers are
// wrapped with wrap.
func wrapped(wrap func(message.Subscriber) message.Subscriber) bustest.Factory {
	return func(t bustest.TB) *bustest.Bus {
		b := memoryBus(t)
		newSub := b.NewSubscriber
		b.NewSubscriber = func(t bustest.TB, group string, topics []string) (message.Subscriber, error) {
			s, err := newSub(t, group, topics)
			if err != nil {
				return nil, err
			}
			return wrap(s), nil
		}
		return b
	}
}

// forgetful is a subscriber that loses the message in hand when it is
// closed or its Subscribe context is cancelled (it acks it): the
// dropped-connection check must fail on it.
type forgetful struct {
	inner   message.Subscriber
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

func newForgetful(inner message.Subscriber) *forgetful {
	return &forgetful{inner: inner, closing: make(chan struct{})}
}

func (f *forgetful) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	// The inner subscription outlives ctx, so that the ack below reaches
	// the bus before it sees the subscription end.
	in, err := f.inner.Subscribe(context.WithoutCancel(ctx), topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer close(out)
		for {
			var m *message.Message
			select {
			case m = <-in:
			case <-ctx.Done():
				return
			case <-f.closing:
				return
			}
			select {
			case out <- m:
			case <-ctx.Done():
				m.Nack()
				return
			case <-f.closing:
				m.Nack()
				return
			}
			select {
			case <-m.Acked():
			case <-m.Nacked():
			case <-ctx.Done():
				m.Ack() // lost
				return
			case <-f.closing:
				m.Ack() // lost
				return
			}
		}
	}()
	return out, nil
}

func (f *forgetful) Close() error {
	f.once.Do(func() { close(f.closing) })
	f.wg.Wait()
	return f.inner.Close()
}

func TestForgetfulSubscriberFailsDroppedConnection(t *testing.T) {
	t.Parallel()
	f := func(t bustest.TB) *bustest.Bus {
		b := wrapped(func(s message.Subscriber) message.Subscriber { return newForgetful(s) })(t)
		b.RedeliveryTimeout = time.Second
		return b
	}
	r := record(t, bustest.CheckDroppedConnection, f)
	require.NotEmpty(t, r.failures)
	assert.Regexp(t, `^CheckDroppedConnection: message [0-9A-Z]{26}, delivered to a subscriber that was closed before acking it, did not come back`, r.failures[0])
}

// stubborn is a subscriber whose Close waits until each subscription has
// handed out the message it holds or its Subscribe context is cancelled: a
// consumer whose reader stopped cannot close it. The dropped-connection
// check must fail on it.
type stubborn struct {
	inner message.Subscriber
	wg    sync.WaitGroup
}

func (s *stubborn) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.inner.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		for m := range in {
			select {
			case out <- m:
			case <-ctx.Done():
				m.Nack()
			}
		}
	}()
	return out, nil
}

func (s *stubborn) Close() error {
	s.wg.Wait() // the bug: inner is closed only once the relay is done
	return s.inner.Close()
}

func TestStubbornSubscriberFailsDroppedConnection(t *testing.T) {
	t.Parallel()
	f := wrapped(func(s message.Subscriber) message.Subscriber { return &stubborn{inner: s} })
	r := record(t, bustest.CheckDroppedConnection, f)
	assert.False(t, r.fatal, "failures: %q", r.failures)
	require.Len(t, r.failures, 1, "failures: %q", r.failures)
	assert.Regexp(t, `^CheckDroppedConnection: Close of the first consumer of group g did not return within 10s while nobody read its channel`, r.failures[0])
}

// TestSingleActiveConsumerIsChecked runs CheckConsumerGroups on buses
// that misstate Bus.SingleActiveConsumer: competing consumers declared as a
// single active one, and partition queues (a single active consumer each)
// declared as competing. Both must fail, naming the two consumers' counts.
func TestSingleActiveConsumerIsChecked(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		f    bustest.Factory
		want string
	}{
		{"CompetingDeclaredSingle", func(t bustest.TB) *bustest.Bus {
			b := memoryBus(t)
			b.SingleActiveConsumer = true
			return b
		}, `^CheckConsumerGroups: consumer 1 of group g3 received [1-9]\d* messages and consumer 2 of group g3 [1-9]\d*: with Bus.SingleActiveConsumer exactly one`},
		{"SingleDeclaredCompeting", func(t bustest.TB) *bustest.Bus {
			b := memoryPartitions(3, 1)(t)
			b.SingleActiveConsumer = false
			return b
		}, `^CheckConsumerGroups: consumer 1 of group g3 received 200 messages and consumer 2 of group g3 0: both must receive some`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := record(t, bustest.CheckConsumerGroups, tc.f)
			assert.False(t, r.fatal, "failures: %q", r.failures)
			require.Len(t, r.failures, 1, "failures: %q", r.failures)
			assert.Regexp(t, tc.want, r.failures[0])
		})
	}
}
