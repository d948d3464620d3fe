package projector

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/bentoevents/bento/internal/tracing"
	"github.com/bentoevents/bento/outbox"
)

// startPublish starts the producer span of one publish of row: a child of
// the trace context stored with the row (a new trace when it has none), named
// "bento.publish <topic>". The span's own context replaces the stored one in
// msg's metadata, so the consumer continues from the publish. The caller
// ends the span with the publish's outcome (tracing.End).
func (p *OutboxProjector) startPublish(ctx context.Context, row *outbox.Message, msg *message.Message) trace.Span {
	sctx, span := p.tracing.StartFrom(ctx, row.Metadata, tracing.SpanPublish+" "+row.Topic, trace.SpanKindProducer)
	p.tracing.Inject(sctx, msg.Metadata)
	if span.IsRecording() {
		span.SetAttributes(
			tracing.AttrOperationType.String(tracing.OpSend),
			tracing.AttrDestinationName.String(row.Topic),
			tracing.AttrMessageID.String(row.ID),
			tracing.AttrTenant.String(row.TenantID),
			tracing.AttrAttempt.Int(row.Attempts+1),
		)
		if p.system != "" {
			span.SetAttributes(tracing.AttrMessagingSystem.String(p.system))
		}
		if row.AggregateID != "" {
			span.SetAttributes(tracing.AttrAggregateType.String(row.AggregateType), tracing.AttrAggregateID.String(row.AggregateID))
		}
	}
	return span
}

// SystemNamer is implemented by publishers that name the messaging system
// they publish to. The projector sets the name as the messaging.system
// attribute of its publish spans (OpenTelemetry's semantic conventions:
// "rabbitmq", "kafka", "redis", ...). rabbitmq.Publisher,
// rabbitmq.ConfirmPublisher and messaging.MemoryBus implement it; a
// publisher that does not gets spans without the attribute.
type SystemNamer interface {
	MessagingSystem() string
}

// messagingSystem names the messaging system behind pub, "" when pub does
// not say.
func messagingSystem(pub message.Publisher) string {
	if n, ok := pub.(SystemNamer); ok {
		return n.MessagingSystem()
	}
	return ""
}
