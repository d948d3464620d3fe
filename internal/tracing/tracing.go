// Package tracing carries OpenTelemetry trace context through bento: the unit
// of work writes the committing span's context into each event's metadata,
// the projector continues it in a producer span and puts that span's context
// on the wire, and the inbox continues it in a consumer span around the
// handler. It is the one place that knows the metadata keys (traceparent and
// tracestate, as W3C Trace Context writes them) and the span attributes.
//
// Everything here costs next to nothing when no tracer is configured: the
// global tracer provider of go.opentelemetry.io/otel is a no-op until the
// application installs one, attributes are only built for recording spans,
// and Inject returns at once for a context without a valid span.
package tracing

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/bentoevents/bento/internal/clip"
	"github.com/bentoevents/bento/internal/wire"
)

// ScopeName is the instrumentation scope of bento's spans.
const ScopeName = "github.com/bentoevents/bento"

// Span names.
const (
	SpanCommit  = "bento.uow.commit"
	SpanPublish = "bento.publish" // + " " + topic
	SpanConsume = "bento.consume" // + " " + topic
)

// EventInvalidTraceparent is the span event recorded when a message or row
// carries a traceparent that cannot be parsed; the span then starts a new
// trace instead of continuing one.
const EventInvalidTraceparent = "bento.traceparent.invalid"

// EventDuplicate is the span event recorded when the inbox skips a message
// it has already applied.
const EventDuplicate = "bento.inbox.duplicate"

// Values of the messaging.system and messaging.operation.type attributes.
const (
	OpSend    = "send"
	OpProcess = "process"

	SystemRabbitMQ = "rabbitmq"
	SystemMemory   = "bento_memory"
	SystemDatabase = "bento_database"
)

// Attribute keys: the OpenTelemetry messaging semantic conventions where
// they fit, bento.* for the rest.
const (
	AttrMessagingSystem   = attribute.Key("messaging.system")
	AttrDestinationName   = attribute.Key("messaging.destination.name")
	AttrMessageID         = attribute.Key("messaging.message.id")
	AttrOperationType     = attribute.Key("messaging.operation.type")
	AttrConsumerGroupName = attribute.Key("messaging.consumer.group.name")
	AttrTenant            = attribute.Key("bento.tenant_id")
	AttrAggregateType     = attribute.Key("bento.aggregate.type")
	AttrAggregateID       = attribute.Key("bento.aggregate.id")
	AttrJoined            = attribute.Key("bento.uow.joined")
	AttrEvents            = attribute.Key("bento.uow.events")
	AttrAttempt           = attribute.Key("bento.outbox.attempt")
	AttrDuplicate         = attribute.Key("bento.inbox.duplicate")
	AttrTraceparent       = attribute.Key("bento.traceparent")
)

// Tracing is the tracer and propagator of one bento component. The zero
// value is not usable; build it with New.
type Tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	kinds  *[trace.SpanKindConsumer + 1][]trace.SpanStartOption // built once: no allocation per span
}

// New returns the tracing of a component configured with tp and prop. A nil
// tp means otel.GetTracerProvider() (a no-op until the application sets
// one; a provider set later is picked up). A nil prop means W3C Trace
// Context, which bento's wire format is defined in, rather than the global
// propagator, which is a no-op until set and would silently drop the
// traceparent an event carries.
func New(tp trace.TracerProvider, prop propagation.TextMapPropagator) Tracing {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	var kinds [trace.SpanKindConsumer + 1][]trace.SpanStartOption
	for k := range kinds {
		kinds[k] = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKind(k))}
	}
	return Tracing{tracer: tp.Tracer(ScopeName), prop: prop, kinds: &kinds}
}

func (t Tracing) start(ctx context.Context, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	if kind < 0 || int(kind) >= len(t.kinds) {
		kind = trace.SpanKindInternal
	}
	return t.tracer.Start(ctx, name, t.kinds[kind]...)
}

// Start starts a span of kind under the span in ctx.
func (t Tracing) Start(ctx context.Context, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	return t.start(ctx, name, kind)
}

// StartFrom starts a span of kind whose parent is the trace context carried
// by md (a message's or row's metadata), or, when md carries none, the span
// in ctx. An unparsable traceparent does not fail anything: the span starts
// under ctx's span (usually a new trace) and records
// EventInvalidTraceparent with the value.
func (t Tracing) StartFrom(ctx context.Context, md map[string]string, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	parent := t.prop.Extract(ctx, propagation.MapCarrier(md))
	ctx, span := t.start(parent, name, kind)
	if tp := md[wire.Traceparent]; tp != "" && span.IsRecording() {
		if sc := trace.SpanContextFromContext(parent); !sc.IsValid() || !sc.IsRemote() {
			span.AddEvent(EventInvalidTraceparent, trace.WithAttributes(AttrTraceparent.String(clip.String(tp))))
		}
	}
	return ctx, span
}

// Inject writes the trace context of the span in ctx into md and returns
// md, allocated if nil and there is something to write. It writes nothing
// when ctx has no valid span context, so untraced work leaves the metadata
// as it was. Existing keys are overwritten.
func (t Tracing) Inject(ctx context.Context, md map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return md
	}
	if md == nil {
		md = make(map[string]string, 2)
	}
	t.prop.Inject(ctx, propagation.MapCarrier(md))
	return md
}

// End ends span, marking it failed with err when err is not nil.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// EndPanic ends span as failed with the panic value p, for a deferred call
// that recovered p and will panic again.
func EndPanic(span trace.Span, p any) {
	End(span, fmt.Errorf("panic: %v", p))
}
