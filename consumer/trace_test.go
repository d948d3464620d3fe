package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/rabbitmq"
	"github.com/bentoevents/bento/uow"
)

// traced is a span recorder and the provider that feeds it.
type traced struct {
	tp  *sdktrace.TracerProvider
	rec *tracetest.SpanRecorder
}

func newTraced(t *testing.T) *traced {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &traced{tp: tp, rec: rec}
}

// named returns the ended spans called name, in the order they ended.
func (tr *traced) named(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tr.rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// waitNamed waits until n spans called name have ended and returns them.
func (tr *traced) waitNamed(t *testing.T, name string, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("%d %q spans", n, name), func() bool { return len(tr.named(name)) >= n })
	return tr.named(name)
}

func spanAttr(s sdktrace.ReadOnlySpan, key attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

func eventNames(s sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, e := range s.Events() {
		out = append(out, e.Name)
	}
	return out
}

func traceparentOf(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

// TestTraceFromCommitToHandler follows one trace: a request span commits an
// event, a projector publishes it (RabbitMQ: through the confirm publisher's
// batch path; in memory: Publish), a consumer handles it, and the handler
// starts a span of its own and commits a follow-up event. Every span is in
// the request's trace and each one's parent is the one before.
func TestTraceFromCommitToHandler(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		tr := newTraced(t)
		ctx := context.Background()
		require.NoError(t, h.db.AutoMigrate(&Cart{}))
		units, err := uow.New(h.db, &uow.Config{TracerProvider: tr.tp})
		require.NoError(t, err)
		app := tr.tp.Tracer("app")

		cfg := s.config()
		cfg.TracerProvider = tr.tp
		c := s.newConsumer(t, cfg)
		handled := make(chan trace.SpanContext, 1)
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			ctx, span := app.Start(ctx, "handler")
			defer span.End()
			err := units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
				st := &Stock{Reserved: e.Qty}
				st.ID = e.SKU
				st.Record(StockReserved{SKU: e.SKU, OrderID: e.OrderID})
				return u.Add(st)
			})
			handled <- span.SpanContext()
			return err
		}))
		run(t, c)

		pub, system := h.pub, h.system
		if h.amqp != nil {
			cp, err := rabbitmq.NewConfirmPublisher(t.Context(), h.amqp)
			require.NoError(t, err)
			t.Cleanup(func() { _ = cp.Close() })
			pub = cp
		}
		pcfg := projector.DefaultConfig()
		pcfg.Logger = quiet
		pcfg.TracerProvider = tr.tp
		p, err := projector.New(units.Outbox(), pub, pcfg)
		require.NoError(t, err)

		// The request commits order.placed.
		rctx, request := app.Start(ctx, "request")
		cart := &Cart{}
		cart.ID = "cart-1"
		cart.Record(OrderPlaced{OrderID: "o-1", SKU: "apple", Qty: 2})
		require.NoError(t, units.Run(rctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(cart) }))
		request.End()
		var eventID string // stamped by the unit of work as it wrote the event
		require.NoError(t, h.db.Model(&outbox.Message{}).Where("aggregate_id = ?", "cart-1").Pluck("id", &eventID).Error)
		require.NotEmpty(t, eventID)

		r, err := p.Drain(ctx)
		require.NoError(t, err)
		require.GreaterOrEqual(t, r.Published, 1) // the handler's event may be relayed too
		var handlerSC trace.SpanContext
		select {
		case handlerSC = <-handled:
		case <-time.After(20 * time.Second):
			t.Fatal("the handler did not run")
		}

		commits := tr.waitNamed(t, "bento.uow.commit", 2)
		publishes := tr.waitNamed(t, "bento.publish order.placed", 1)
		consumes := tr.waitNamed(t, "bento.consume order.placed", 1)
		handlers := tr.waitNamed(t, "handler", 1)
		require.Len(t, publishes, 1)
		require.Len(t, consumes, 1)
		commit, publish, consume, handler, inner := commits[0], publishes[0], consumes[0], handlers[0], commits[1]

		traceID := request.SpanContext().TraceID()
		for _, s := range []sdktrace.ReadOnlySpan{commit, publish, consume, handler, inner} {
			assert.Equal(t, traceID, s.SpanContext().TraceID(), "span %s is in the request's trace", s.Name())
			assert.Equal(t, codes.Unset, s.Status().Code, "span %s", s.Name())
		}
		assert.Equal(t, request.SpanContext().SpanID(), commit.Parent().SpanID(), "commit <- request")
		assert.Equal(t, commit.SpanContext().SpanID(), publish.Parent().SpanID(), "publish <- the commit's stored context")
		assert.True(t, publish.Parent().IsRemote(), "the publish span's parent came through the outbox")
		assert.Equal(t, publish.SpanContext().SpanID(), consume.Parent().SpanID(), "consume <- publish")
		assert.True(t, consume.Parent().IsRemote(), "the consume span's parent came over the wire")
		assert.Equal(t, consume.SpanContext().SpanID(), handler.Parent().SpanID(), "handler span <- consume")
		assert.Equal(t, handlerSC.SpanID(), handler.SpanContext().SpanID())
		assert.Equal(t, handler.SpanContext().SpanID(), inner.Parent().SpanID(), "the handler's commit <- handler span")

		assert.Equal(t, trace.SpanKindProducer, publish.SpanKind())
		assert.Equal(t, trace.SpanKindConsumer, consume.SpanKind())
		for _, s := range []sdktrace.ReadOnlySpan{publish, consume} {
			assert.Equal(t, system, spanAttr(s, "messaging.system"), s.Name())
			assert.Equal(t, "order.placed", spanAttr(s, "messaging.destination.name"), s.Name())
			assert.Equal(t, eventID, spanAttr(s, "messaging.message.id"), s.Name())
		}
		assert.Equal(t, "1", spanAttr(publish, "bento.outbox.attempt"))
		assert.Equal(t, s.group, spanAttr(consume, "messaging.consumer.group.name"))

		// The follow-up event carries the trace on to its consumers.
		var rows []outbox.Message
		require.NoError(t, h.db.Where("topic = ?", "stock.reserved").Find(&rows).Error)
		require.Len(t, rows, 1)
		assert.Equal(t, traceparentOf(inner.SpanContext()), rows[0].Metadata[messaging.MetaTraceparent])
		assert.Equal(t, eventID, rows[0].Metadata[messaging.MetaCausationID])
	})
}

// TestMalformedTraceparentDoesNotFailConsumption: a message whose
// traceparent cannot be parsed is handled as any other, in a new trace whose
// consume span records the bad value; a duplicate's span says it was skipped.
func TestMalformedTraceparentDoesNotFailConsumption(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		tr := newTraced(t)
		cfg := s.config()
		cfg.TracerProvider = tr.tp
		c := s.newConsumer(t, cfg)
		inHandler := make(chan trace.SpanContext, 2)
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			inHandler <- trace.SpanContextFromContext(ctx)
			return tx.Create(&Effect{MessageID: env.ID}).Error
		}))
		run(t, c)

		const bad = "00-not-a-trace-01"
		msg := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o-1", SKU: "apple", Qty: 1},
			map[string]string{messaging.MetaTraceparent: bad})
		h.publish(t, "order.placed", msg)
		consume := tr.waitNamed(t, "bento.consume order.placed", 1)[0]
		h.released(t, msg.UUID) // else the database bus drops the copy
		h.publish(t, "order.placed", msg.Copy())
		dup := tr.waitNamed(t, "bento.consume order.placed", 2)[1]

		assert.Equal(t, int64(1), s.effects(t), "handled once")
		sc := <-inHandler
		assert.Equal(t, consume.SpanContext(), sc, "the handler runs in the consume span")
		assert.False(t, consume.Parent().IsValid(), "a new trace")
		assert.Equal(t, codes.Unset, consume.Status().Code)
		require.Equal(t, []string{"bento.traceparent.invalid"}, eventNames(consume))
		assert.Equal(t, []attribute.KeyValue{attribute.String("bento.traceparent", bad)}, consume.Events()[0].Attributes)
		assert.Contains(t, eventNames(dup), "bento.inbox.duplicate")
		assert.Equal(t, "true", spanAttr(dup, "bento.inbox.duplicate"))
		assert.Empty(t, inHandler, "the duplicate never reached the handler")
	})
}

// TestFailedAttemptSpans: each attempt of a failing handler is a consume
// span of its own, marked failed; the attempt that succeeds is not.
func TestFailedAttemptSpans(t *testing.T) {
	h := memoryHarness(t)
	s := newSuite(t, h)
	tr := newTraced(t)
	cfg := s.config()
	cfg.TracerProvider = tr.tp
	c := s.newConsumer(t, cfg)
	calls := 0
	require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
		calls++
		if calls == 1 {
			return fmt.Errorf("transient")
		}
		if calls == 2 {
			panic("boom")
		}
		return nil
	}))
	run(t, c)
	h.publish(t, "order.placed", eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o-1"}, nil))
	spans := tr.waitNamed(t, "bento.consume order.placed", 3)
	require.Len(t, spans, 3)
	assert.Equal(t, codes.Error, spans[0].Status().Code)
	assert.Equal(t, "transient", spans[0].Status().Description)
	assert.Equal(t, codes.Error, spans[1].Status().Code)
	assert.Equal(t, "panic: boom", spans[1].Status().Description)
	assert.Equal(t, codes.Unset, spans[2].Status().Code)
}

// TestConsumeWithoutTracer: with no tracer configured (the global no-op
// provider) a message without trace context is handled and its follow-up
// events get none; one with a traceparent hands it on unchanged to the
// events its handler commits.
func TestConsumeWithoutTracer(t *testing.T) {
	forEachHarness(t, func(t *testing.T, h *harness) {
		s := newSuite(t, h)
		c := s.newConsumer(t, s.config())
		require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
			return s.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
				st := &Stock{}
				st.ID = e.OrderID
				st.Record(StockReserved{SKU: e.SKU, OrderID: e.OrderID})
				return u.Add(st)
			})
		}))
		run(t, c)
		const incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		h.publish(t, "order.placed", eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "untraced"}, nil))
		h.publish(t, "order.placed", eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "traced"},
			map[string]string{messaging.MetaTraceparent: incoming}))
		testenv.WaitFor(t, 20*time.Second, "both messages", func() bool { return s.counter(t, "bento_inbox_processed_total") == 2 })

		var rows []outbox.Message
		require.NoError(t, h.db.Where("topic = ?", "stock.reserved").Order("aggregate_id").Find(&rows).Error)
		require.Len(t, rows, 2)
		assert.Equal(t, "traced", rows[0].AggregateID)
		assert.Equal(t, incoming, rows[0].Metadata[messaging.MetaTraceparent])
		assert.Equal(t, "untraced", rows[1].AggregateID)
		assert.NotContains(t, rows[1].Metadata, messaging.MetaTraceparent)
	})
}
