package tracing_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/bentoevents/bento/internal/tracing"
)

const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func recorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	p := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p, rec
}

func TestStartFromContinuesTheStoredTrace(t *testing.T) {
	t.Parallel()
	p, rec := recorder(t)
	tr := tracing.New(p, nil)
	md := map[string]string{"traceparent": tp, "other": "x"}
	ctx, span := tr.StartFrom(context.Background(), md, "child", trace.SpanKindProducer)
	out := tr.Inject(ctx, map[string]string{"traceparent": "stale"})
	span.End()

	ended := rec.Ended()
	require.Len(t, ended, 1)
	s := ended[0]
	assert.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", s.SpanContext().TraceID().String())
	assert.Equal(t, "00f067aa0ba902b7", s.Parent().SpanID().String())
	assert.True(t, s.Parent().IsRemote())
	assert.Equal(t, trace.SpanKindProducer, s.SpanKind())
	assert.Empty(t, s.Events())
	assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-"+s.SpanContext().SpanID().String()+"-01", out["traceparent"],
		"Inject overwrites with the new span's context")
}

func TestStartFromMalformedTraceparentStartsANewTrace(t *testing.T) {
	t.Parallel()
	p, rec := recorder(t)
	tr := tracing.New(p, nil)
	for _, bad := range []string{"garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"} {
		_, span := tr.StartFrom(context.Background(), map[string]string{"traceparent": bad}, "s", trace.SpanKindConsumer)
		span.End()
	}
	for _, s := range rec.Ended() {
		assert.False(t, s.Parent().IsValid(), "a root span")
		require.Len(t, s.Events(), 1)
		assert.Equal(t, tracing.EventInvalidTraceparent, s.Events()[0].Name)
	}
	assert.Len(t, rec.Ended(), 3)
}

func TestInjectWritesNothingWithoutASpan(t *testing.T) {
	t.Parallel()
	tr := tracing.New(nil, nil) // the global provider: a no-op in tests
	assert.Nil(t, tr.Inject(context.Background(), nil))
	ctx, span := tr.Start(context.Background(), "noop", trace.SpanKindInternal)
	defer span.End()
	assert.False(t, span.IsRecording())
	md := map[string]string{"a": "b"}
	assert.Equal(t, map[string]string{"a": "b"}, tr.Inject(ctx, md))
}

func TestNoopTracerPassesTheTraceThrough(t *testing.T) {
	t.Parallel()
	tr := tracing.New(nil, nil)
	ctx, span := tr.StartFrom(context.Background(), map[string]string{"traceparent": tp}, "noop", trace.SpanKindConsumer)
	defer span.End()
	assert.Equal(t, tp, tr.Inject(ctx, nil)["traceparent"])
}

func TestCustomPropagator(t *testing.T) {
	t.Parallel()
	p, _ := recorder(t)
	// A propagator that writes nothing: bento writes no trace keys.
	tr := tracing.New(p, propagation.NewCompositeTextMapPropagator())
	ctx, span := tr.Start(context.Background(), "s", trace.SpanKindInternal)
	defer span.End()
	assert.Empty(t, tr.Inject(ctx, nil))
}

func TestEndRecordsErrors(t *testing.T) {
	t.Parallel()
	p, rec := recorder(t)
	tr := tracing.New(p, nil)
	_, ok := tr.Start(context.Background(), "ok", trace.SpanKindInternal)
	tracing.End(ok, nil)
	_, bad := tr.Start(context.Background(), "bad", trace.SpanKindInternal)
	tracing.End(bad, errors.New("boom"))
	_, panicked := tr.Start(context.Background(), "panic", trace.SpanKindInternal)
	tracing.EndPanic(panicked, "oops")
	ended := rec.Ended()
	require.Len(t, ended, 3)
	assert.Equal(t, codes.Unset, ended[0].Status().Code)
	assert.Equal(t, codes.Error, ended[1].Status().Code)
	assert.Equal(t, "boom", ended[1].Status().Description)
	assert.Equal(t, "panic: oops", ended[2].Status().Description)
}

func BenchmarkNoopPath(b *testing.B) {
	tr := tracing.New(nil, nil)
	md := map[string]string{"event_type": "order.paid"}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		c, span := tr.StartFrom(ctx, md, "bento.publish", trace.SpanKindProducer)
		tr.Inject(c, md)
		tracing.End(span, nil)
	}
}
