package rabbitmq_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/tcpproxy"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// viaProxy returns a copy of cfg that reaches the broker through an AMQP
// test proxy.
func viaProxy(t *testing.T, cfg *rabbitmq.Config) (*rabbitmq.Config, *tcpproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(cfg.URL)
	require.NoError(t, err)
	proxy, err := tcpproxy.StartAMQP(u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	via := *cfg
	pu := *u
	pu.Host = proxy.Addr()
	via.URL = pu.String()
	return &via, proxy
}

var orderSeq atomic.Int64

// orders returns n messages under "order.paid", with ids unique in the
// test binary.
func orders(n int) []messaging.Outgoing {
	out := outgoing(n, func(int) string { return "order.paid" })
	for _, o := range out {
		o.Message.UUID = fmt.Sprintf("order-%06d", orderSeq.Add(1))
	}
	return out
}

// requirePublished requires every outcome to be nil.
func requirePublished(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		require.NoError(t, err, "message %d", i)
	}
}

// within runs fn and fails the test if it took longer than limit.
func within(t *testing.T, limit time.Duration, what string, fn func()) {
	t.Helper()
	start := time.Now()
	fn()
	assert.Less(t, time.Since(start), limit, what)
}

// TestConfirmPublisherSilentLink stalls the link to the broker without
// closing it: PublishBatch returns at its context's deadline, whether it
// waits for confirms or is stuck writing, and reports every message as
// failed with the context's error; once the link is back the next batch
// reconnects and succeeds, and Close does not hang on a silent link either.
func TestConfirmPublisherSilentLink(t *testing.T) {
	t.Parallel()
	cfg, q, ch := confirmSetup(t)
	via, proxy := viaProxy(t, cfg)
	p, err := rabbitmq.NewConfirmPublisher(t.Context(), via)
	require.NoError(t, err)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	requirePublished(t, p.PublishBatch(ctx, orders(5)))

	proxy.Stall()
	const timeout = time.Second
	small := orders(10) // fits the socket buffers: waits for confirms
	big := orders(64)   // 16 MiB: the writes themselves block
	for i := range big {
		big[i].Message.Payload = bytes.Repeat([]byte("x"), 256<<10)
	}
	for _, batch := range []struct {
		name string
		msgs []messaging.Outgoing
	}{{"waiting for confirms", small}, {"stuck writing", big}} {
		var errs []error
		within(t, timeout+time.Second, "PublishBatch "+batch.name+" returns at its deadline", func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			errs = p.PublishBatch(ctx, batch.msgs)
		})
		require.Len(t, errs, len(batch.msgs))
		for i, err := range errs {
			assert.ErrorIs(t, err, context.DeadlineExceeded, "%s: message %d", batch.name, i)
		}
	}

	proxy.Resume()
	next := orders(10)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	requirePublished(t, p.PublishBatch(ctx, next))
	ids := map[string]bool{}
	for _, d := range queued(t, ch, q) {
		ids[d.MessageId] = true
	}
	for _, o := range next {
		assert.True(t, ids[o.Message.UUID], "message %s arrived", o.Message.UUID)
	}

	proxy.Stall()
	within(t, 4*time.Second, "Close returns on a silent link", func() {
		assert.NoError(t, p.Close())
	})
}

// records is a slog.Handler that keeps the messages it receives.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}

// count returns how many records start with prefix.
func (r *records) count(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// gauge returns the value of the gauge name in reg, or -1 when absent.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// TestConfirmPublisherBlocked plays RabbitMQ's connection.blocked through
// the test proxy, which then also stops forwarding what the client sends:
// PublishBatch writes nothing while blocked, waits for connection.unblocked
// and publishes then, or reports ErrBlocked when its context ends first.
// The block is logged once each way and shown by a gauge, and Close
// returns at once while blocked.
func TestConfirmPublisherBlocked(t *testing.T) {
	t.Parallel()
	cfg, q, ch := confirmSetup(t)
	via, proxy := viaProxy(t, cfg)
	logs := &records{}
	via.Logger = slog.New(logs)
	reg := prometheus.NewRegistry()
	via.Registerer = reg
	const blockedGauge = "bento_amqp_publisher_blocked"
	isBlocked := func(want float64) func() bool {
		return func() bool { return gauge(t, reg, blockedGauge) == want }
	}
	p, err := rabbitmq.NewConfirmPublisher(t.Context(), via)
	require.NoError(t, err)
	defer p.Close()
	long, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	requirePublished(t, p.PublishBatch(long, orders(3)))
	assert.Equal(t, 0.0, gauge(t, reg, blockedGauge))

	proxy.Block("low on memory")
	require.Eventually(t, isBlocked(1), 5*time.Second, 5*time.Millisecond, "the gauge shows the block")
	held := orders(10)
	var errs []error
	within(t, 1500*time.Millisecond, "PublishBatch returns at its deadline while blocked", func() {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		errs = p.PublishBatch(ctx, held)
	})
	require.Len(t, errs, len(held))
	for i, err := range errs {
		assert.ErrorIs(t, err, rabbitmq.ErrBlocked, "message %d", i)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "message %d", i)
	}

	// A batch that starts while blocked waits, and goes out once unblocked.
	waiting := orders(5)
	result := make(chan []error, 1)
	go func() { result <- p.PublishBatch(long, waiting) }()
	select {
	case errs := <-result:
		t.Fatalf("PublishBatch returned while blocked: %v", errs)
	case <-time.After(300 * time.Millisecond):
	}
	proxy.Unblock()
	requirePublished(t, <-result)
	require.Eventually(t, isBlocked(0), 5*time.Second, 5*time.Millisecond, "the gauge shows the unblock")
	ids := map[string]bool{}
	for _, d := range queued(t, ch, q) {
		ids[d.MessageId] = true
	}
	for _, o := range waiting {
		assert.True(t, ids[o.Message.UUID], "message %s published after the unblock", o.Message.UUID)
	}
	for _, o := range held {
		assert.False(t, ids[o.Message.UUID], "message %s was written while blocked", o.Message.UUID)
	}
	assert.Equal(t, 1, logs.count("AMQP connection blocked"), "logged once when blocked")
	assert.Equal(t, 1, logs.count("AMQP connection unblocked"), "logged once when unblocked")

	// Close while blocked returns at once and ends a batch that waits.
	proxy.Block("disk alarm")
	require.Eventually(t, isBlocked(1), 5*time.Second, 5*time.Millisecond, "the gauge shows the block")
	go func() { result <- p.PublishBatch(long, orders(2)) }()
	within(t, time.Second, "Close returns at once while blocked", func() {
		assert.NoError(t, p.Close())
	})
	select {
	case errs := <-result:
		for i, err := range errs {
			assert.ErrorIs(t, err, messaging.ErrClosed, "message %d", i)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the batch waiting for the unblock")
	}
	require.Eventually(t, isBlocked(0), 5*time.Second, 5*time.Millisecond, "a closed connection is not blocked")
	assert.Equal(t, 2, logs.count("AMQP connection blocked"))
}

// oversized returns 60 orders, the 31st with 200 KB of metadata: more than
// the content header frame can hold (RabbitMQ's frame_max is 128 KiB).
func oversized() ([]messaging.Outgoing, int) {
	batch := orders(60)
	const big = 30
	batch[big].Message.Metadata.Set("blob", strings.Repeat("x", 200_000))
	return batch, big
}

// requireOnlyOneFailed checks that every message but big was confirmed and
// arrived in queue, and returns big's error.
func requireOnlyOneFailed(t *testing.T, errs []error, batch []messaging.Outgoing, big int, ch *amqp.Channel, queue string) error {
	t.Helper()
	require.Len(t, errs, len(batch))
	for i, err := range errs {
		if i != big {
			assert.NoError(t, err, "message %d", i)
		}
	}
	require.Error(t, errs[big])
	ids := map[string]bool{}
	for _, d := range queued(t, ch, queue) {
		ids[d.MessageId] = true
	}
	for i, o := range batch {
		assert.Equal(t, i != big, ids[o.Message.UUID], "message %d in the queue", i)
	}
	return errs[big]
}

// TestConfirmPublisherMessageTooLarge publishes a batch in which one
// message's metadata does not fit the content header frame: that message
// alone fails, with ErrMessageTooLarge, before anything is written, and the
// 59 others are confirmed and routed.
func TestConfirmPublisherMessageTooLarge(t *testing.T) {
	t.Parallel()
	cfg, q, ch := confirmSetup(t)
	p, err := rabbitmq.NewConfirmPublisher(t.Context(), cfg)
	require.NoError(t, err)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	batch, big := oversized()
	err = requireOnlyOneFailed(t, p.PublishBatch(ctx, batch), batch, big, ch, q)
	assert.ErrorIs(t, err, messaging.ErrMessageTooLarge)
	t.Logf("the oversized message's error: %v", err)
}

// TestConfirmPublisherFailureCostsOneMessage lets the oversized message
// through to the broker, which closes the connection (frame too large) in
// the middle of the batch: the messages not yet confirmed go out again on a
// fresh connection, the culprit fails again alone and gets the error, and
// the 59 others are confirmed and routed.
func TestConfirmPublisherFailureCostsOneMessage(t *testing.T) {
	t.Parallel()
	cfg, q, ch := confirmSetup(t)
	p, err := rabbitmq.NewConfirmPublisher(t.Context(), cfg)
	require.NoError(t, err)
	defer p.Close()
	rabbitmq.SkipSizeCheck(p)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	batch, big := oversized()
	err = requireOnlyOneFailed(t, p.PublishBatch(ctx, batch), batch, big, ch, q)
	t.Logf("the culprit's error: %v", err)
	var aerr *amqp.Error
	if assert.ErrorAs(t, err, &aerr, "the broker's error: %v", err) {
		assert.Equal(t, amqp.FrameError, aerr.Code)
	}

	// The publisher is fine afterwards.
	requirePublished(t, p.PublishBatch(ctx, orders(3)))
}

// TestConfirmPublisherFrameSizeBoundary pins the size check to the broker's
// limit: a message whose content header frame is exactly the negotiated
// frame size is published, one a byte larger is refused. RabbitMQ itself
// tolerates 8 bytes more (FRAME_SIZE_FUDGE in its reader, for clients that
// forget the frame overhead): let through unchecked, a frame 8 bytes over is
// taken and one 9 bytes over closes the connection, which shows that the
// check computes the frame's size to the byte.
func TestConfirmPublisherFrameSizeBoundary(t *testing.T) {
	t.Parallel()
	cfg, _, _ := confirmSetup(t)
	p, err := rabbitmq.NewConfirmPublisher(t.Context(), cfg)
	require.NoError(t, err)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	requirePublished(t, p.PublishBatch(ctx, orders(1)))
	frame := rabbitmq.FrameSize(p)
	require.Positive(t, frame, "the broker sets frame_max")

	sized := func(size int) messaging.Outgoing {
		o := orders(1)[0]
		o.Message.Metadata.Set("blob", "")
		o.Message.Metadata.Set("blob", strings.Repeat("x", size-rabbitmq.HeaderFrameSize(o.Message)))
		require.Equal(t, size, rabbitmq.HeaderFrameSize(o.Message))
		return o
	}
	errs := p.PublishBatch(ctx, []messaging.Outgoing{sized(frame), sized(frame + 1)})
	assert.NoError(t, errs[0], "a header frame of exactly frame_max bytes fits")
	assert.ErrorIs(t, errs[1], messaging.ErrMessageTooLarge)

	unchecked, err := rabbitmq.NewConfirmPublisher(t.Context(), cfg)
	require.NoError(t, err)
	defer unchecked.Close()
	rabbitmq.SkipSizeCheck(unchecked)
	assert.NoError(t, unchecked.PublishBatch(ctx, []messaging.Outgoing{sized(frame + 8)})[0], "within RabbitMQ's tolerance")
	err = unchecked.PublishBatch(ctx, []messaging.Outgoing{sized(frame + 9)})[0]
	var aerr *amqp.Error
	if assert.ErrorAs(t, err, &aerr, "the broker refuses a byte more: %v", err) {
		assert.Equal(t, amqp.FrameError, aerr.Code)
	}
}

// TestConfirmPublisherRetriesAreBounded deletes the exchange, so that every
// message makes the broker close the channel (404): the rounds of retries
// stop after a bounded number of failures and every message gets the
// broker's error.
func TestConfirmPublisherRetriesAreBounded(t *testing.T) {
	t.Parallel()
	cfg, _, ch := confirmSetup(t)
	p, err := rabbitmq.NewConfirmPublisher(t.Context(), cfg)
	require.NoError(t, err)
	defer p.Close()
	require.NoError(t, ch.ExchangeDelete(cfg.Exchange, false, false))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	var errs []error
	within(t, 5*time.Second, "a batch that cannot succeed gives up", func() {
		errs = p.PublishBatch(ctx, orders(500))
	})
	for i, err := range errs {
		var aerr *amqp.Error
		if assert.ErrorAs(t, err, &aerr, "message %d: %v", i, err) {
			assert.Equal(t, amqp.NotFound, aerr.Code, "message %d", i)
		}
	}
}

// TestConfirmPublisherRepublishesAfterLinkFailure cuts the connection while
// a large batch is being confirmed: the messages not yet confirmed go out
// again on a fresh connection, and the whole batch is published.
func TestConfirmPublisherRepublishesAfterLinkFailure(t *testing.T) {
	t.Parallel()
	cfg, q, ch := confirmSetup(t)
	via, proxy := viaProxy(t, cfg)
	p, err := rabbitmq.NewConfirmPublisher(t.Context(), via)
	require.NoError(t, err)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	requirePublished(t, p.PublishBatch(ctx, orders(1)))
	queued(t, ch, q)

	batch := orders(5000)
	for _, o := range batch {
		o.Message.Payload = bytes.Repeat([]byte("x"), 1024)
	}
	result := make(chan []error, 1)
	go func() { result <- p.PublishBatch(ctx, batch) }()
	require.Eventually(t, func() bool {
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err == nil && st.Messages > 0
	}, 10*time.Second, time.Millisecond, "the batch reaches the broker")
	proxy.Cut()
	proxy.Restore()
	select {
	case <-result:
		t.Fatal("the batch was over before the cut: make it larger")
	default:
	}
	requirePublished(t, <-result)
	ids := map[string]bool{}
	for _, d := range queued(t, ch, q) {
		ids[d.MessageId] = true
	}
	for i, o := range batch {
		require.True(t, ids[o.Message.UUID], "message %d arrived", i)
	}
}
