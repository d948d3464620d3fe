package uow_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

// traceparent formats sc as a W3C traceparent header.
func traceparent(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

// tracedEnv is a suite env whose manager traces into a span recorder.
func tracedEnv(t *testing.T, b testenv.Backend, db *gorm.DB) (*env, *sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	e := setup(t, b, db)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	units, err := uow.New(db, &uow.Config{Outbox: e.units.Outbox(), Producer: "suite", TracerProvider: tp})
	require.NoError(t, err)
	e.units = units
	return e, tp, rec
}

func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// TestCommitCarriesTraceContext: a commit inside a request span runs in a
// commit span under it, and every event gets the commit span's traceparent.
func TestCommitCarriesTraceContext(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e, tp, rec := tracedEnv(t, b, db)
		ctx, request := tp.Tracer("test").Start(context.Background(), "request")
		a := OpenAccount("acc-1", "ann")
		require.NoError(t, a.Deposit(10))
		require.NoError(t, e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Track(a) }))
		request.End()

		commits := spansNamed(rec, "bento.uow.commit")
		require.Len(t, commits, 1)
		commit := commits[0]
		assert.Equal(t, request.SpanContext().TraceID(), commit.SpanContext().TraceID())
		assert.Equal(t, request.SpanContext().SpanID(), commit.Parent().SpanID(), "the commit span is a child of the request span")
		assert.Equal(t, trace.SpanKindInternal, commit.SpanKind())
		assert.Equal(t, int64(2), attr(commit, "bento.uow.events").AsInt64())
		assert.Equal(t, "default", attr(commit, "bento.tenant_id").AsString())
		assert.Equal(t, codes.Unset, commit.Status().Code)

		rows := e.outboxRows(t)
		require.Len(t, rows, 2)
		for _, r := range rows {
			assert.Equal(t, traceparent(commit.SpanContext()), r.Metadata[messaging.MetaTraceparent], "event %s", r.ID)
			assert.NotContains(t, r.Metadata, "tracestate", "no tracestate without one in the trace")
			assert.Equal(t, "suite", r.Metadata[messaging.MetaProducer], "other metadata is kept")
		}
	})
}

// TestCommitKeepsExplicitTraceparent: a traceparent the caller put in the
// metadata wins over the commit span's.
func TestCommitKeepsExplicitTraceparent(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e, tp, _ := tracedEnv(t, b, db)
		const own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		ctx, request := tp.Tracer("test").Start(context.Background(), "request")
		defer request.End()
		ctx = outbox.WithMetadata(ctx, outbox.Metadata{messaging.MetaTraceparent: own})
		e.commitNewCtx(t, ctx, "acc-1")
		rows := e.outboxRows(t)
		require.Len(t, rows, 1)
		assert.Equal(t, own, rows[0].Metadata[messaging.MetaTraceparent])
	})
}

// TestCommitTracestate: the trace's tracestate travels with the traceparent.
func TestCommitTracestate(t *testing.T) {
	t.Parallel()
	e, tp, _ := tracedEnv(t, testenv.Backend{Name: "sqlite", Open: testenv.SQLite}, testenv.SQLite(t))
	ts, err := trace.ParseTraceState("vendor=abc")
	require.NoError(t, err)
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true,
	})
	ctx, span := tp.Tracer("test").Start(trace.ContextWithRemoteSpanContext(context.Background(), remote), "request")
	defer span.End()
	e.commitNewCtx(t, ctx, "acc-1")
	rows := e.outboxRows(t)
	require.Len(t, rows, 1)
	assert.Equal(t, "vendor=abc", rows[0].Metadata["tracestate"])
	assert.Contains(t, rows[0].Metadata[messaging.MetaTraceparent], trace.TraceID{1}.String())
}

// TestFailedCommitSpan: a commit that fails marks its span as failed.
func TestFailedCommitSpan(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e, _, rec := tracedEnv(t, b, db)
		e.commitNew(t, "acc-1")
		u, err := e.units.Begin(context.Background(), nil)
		require.NoError(t, err)
		require.NoError(t, u.Track(OpenAccount("acc-1", "bob"))) // already exists
		err = u.Commit(context.Background())
		require.ErrorIs(t, err, uow.ErrConcurrencyConflict)

		commits := spansNamed(rec, "bento.uow.commit")
		require.Len(t, commits, 2)
		assert.Equal(t, codes.Unset, commits[0].Status().Code)
		assert.False(t, commits[0].Parent().IsValid(), "a commit without a span in ctx starts a trace")
		assert.Equal(t, codes.Error, commits[1].Status().Code)
		assert.Contains(t, commits[1].Status().Description, "concurrency conflict")
	})
}

// TestCommitWithoutTracer: with no tracer configured (the global no-op
// provider) nothing is written for an untraced context, and a trace context
// already in the context (extracted from an incoming request by other
// middleware) passes through unchanged.
func TestCommitWithoutTracer(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db) // no TracerProvider: otel's global one, never set in these tests
		e.commitNew(t, "acc-1")
		rows := e.outboxRows(t)
		require.Len(t, rows, 1)
		assert.NotContains(t, rows[0].Metadata, messaging.MetaTraceparent)

		const incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		ctx := propagation.TraceContext{}.Extract(context.Background(),
			propagation.MapCarrier{"traceparent": incoming})
		e.commitNewCtx(t, ctx, "acc-2")
		rows = e.outboxRows(t)
		require.Len(t, rows, 2)
		assert.Equal(t, incoming, rows[1].Metadata[messaging.MetaTraceparent])
	})
}
