package projector_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/uow"
)

// batchRecorder is a recorder that also takes whole batches, so the
// projector uses its BatchPublisher path.
type batchRecorder struct{ *recorder }

func (b batchRecorder) PublishBatch(_ context.Context, batch []messaging.Outgoing) []error {
	errs := make([]error, len(batch))
	for i, o := range batch {
		errs[i] = b.Publish(o.Topic, o.Message)
	}
	return errs
}

func traceparentOf(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

func spanAttr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// TestPublishSpans: each publish attempt of an event is a producer span
// whose parent is the commit span stored with the event; a failed attempt's
// span is marked failed, and the message that goes out carries the span of
// the attempt that published it.
func TestPublishSpans(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		for _, batch := range []bool{false, true} {
			t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
				e := setup(t, db)
				rec := tracetest.NewSpanRecorder()
				tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
				t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				units, err := uow.New(db, &uow.Config{Outbox: e.store, TracerProvider: tp})
				require.NoError(t, err)
				e.units = units

				// The counter is created without a span (its commit starts a
				// trace of its own), then ticked in a request's span.
				id := fmt.Sprintf("traced-%v", batch)
				e.commit(t, []string{id}, 1)
				ctx, request := tp.Tracer("test").Start(context.Background(), "request")
				defer request.End()
				require.NoError(t, units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
					c, err := uow.Get[Counter](ctx, u, id)
					if err != nil {
						return err
					}
					c.Tick()
					return nil
				}))
				var commitSpan sdktrace.ReadOnlySpan
				for _, s := range rec.Ended() {
					if s.Name() == "bento.uow.commit" && s.Parent().SpanID() == request.SpanContext().SpanID() {
						commitSpan = s
					}
				}
				require.NotNil(t, commitSpan)
				var rows []outbox.Message
				require.NoError(t, db.Where("aggregate_id = ?", id).Order("aggregate_version").Find(&rows).Error)
				require.Len(t, rows, 2)
				tickID := rows[1].ID

				r := &recorder{}
				failed := false
				r.setFail(func(env *messaging.Envelope) error {
					if env.ID == tickID && !failed {
						failed = true
						return errBroker
					}
					return nil
				})
				var pub message.Publisher = r
				if batch {
					pub = batchRecorder{r}
				}
				cfg := fastConfig()
				cfg.TracerProvider = tp
				p, err := projector.New(e.store, pub, cfg)
				require.NoError(t, err)
				testenv.WaitFor(t, 10*time.Second, "both events published", func() bool {
					_, err := p.Drain(context.Background())
					require.NoError(t, err)
					return e.count(t, "aggregate_id = ? AND status = 'sent'", id) == 2
				})

				var publishes []sdktrace.ReadOnlySpan
				for _, s := range rec.Ended() {
					if s.Name() == "bento.publish counter.ticked" && spanAttr(s, "messaging.message.id") == tickID {
						publishes = append(publishes, s)
					}
				}
				require.Len(t, publishes, 2, "one span per attempt")
				for i, s := range publishes {
					assert.Equal(t, trace.SpanKindProducer, s.SpanKind())
					assert.Equal(t, request.SpanContext().TraceID(), s.SpanContext().TraceID())
					assert.Equal(t, commitSpan.SpanContext().SpanID(), s.Parent().SpanID(), "publish <- commit")
					assert.Equal(t, fmt.Sprint(i+1), spanAttr(s, "bento.outbox.attempt"))
					assert.Equal(t, "counter.ticked", spanAttr(s, "messaging.destination.name"))
					assert.Equal(t, "counter", spanAttr(s, "bento.aggregate.type"))
					assert.Empty(t, spanAttr(s, "messaging.system"), "unknown for a custom publisher")
				}
				assert.Equal(t, codes.Error, publishes[0].Status().Code)
				assert.Equal(t, errBroker.Error(), publishes[0].Status().Description)
				assert.Equal(t, codes.Unset, publishes[1].Status().Code)

				var delivered *messaging.Envelope
				for _, d := range r.all() {
					if d.env.ID == tickID {
						delivered = d.env
					}
				}
				require.NotNil(t, delivered)
				assert.Equal(t, traceparentOf(publishes[1].SpanContext()), delivered.Traceparent,
					"the message carries the publish span")
			})
		}
	})
}

// TestPublishWithoutTracer: with no tracer configured the traceparent stored
// with an event goes out unchanged, and an event without one goes out
// without one.
func TestPublishWithoutTracer(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db)
		const stored = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		traced := outbox.WithMetadata(context.Background(), outbox.Metadata{messaging.MetaTraceparent: stored})
		c := &Counter{}
		c.ID = "traced"
		c.Tick()
		require.NoError(t, e.units.Run(traced, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(c) }))
		e.commit(t, []string{"untraced"}, 1)

		r := &recorder{}
		p, err := projector.New(e.store, r, fastConfig())
		require.NoError(t, err)
		res, err := p.Drain(context.Background())
		require.NoError(t, err)
		require.Equal(t, 2, res.Published)
		got := map[string]string{}
		for _, d := range r.all() {
			got[d.env.AggregateID] = d.env.Traceparent
		}
		assert.Equal(t, map[string]string{"traced": stored, "untraced": ""}, got)
	})
}

// namedRecorder is a custom publisher that names its messaging system.
type namedRecorder struct{ *recorder }

func (namedRecorder) MessagingSystem() string { return "acme_bus" }

// TestPublishSpansNameTheSystemThePublisherNames: a publisher that
// implements projector.SystemNamer gets its name as the messaging.system
// attribute of the publish spans, as the memory bus gets its own.
func TestPublishSpansNameTheSystemThePublisherNames(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		bus := messaging.NewMemoryBus()
		t.Cleanup(func() { _ = bus.Close() })
		for name, pub := range map[string]message.Publisher{
			"acme_bus":     namedRecorder{&recorder{}},
			"bento_memory": bus,
		} {
			t.Run(name, func(t *testing.T) {
				e := setup(t, db)
				id := "named-" + name
				e.commit(t, []string{id}, 1)
				rec := tracetest.NewSpanRecorder()
				tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
				t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				cfg := fastConfig()
				cfg.TracerProvider = tp
				p, err := projector.New(e.store, pub, cfg)
				require.NoError(t, err)
				_, err = p.Drain(context.Background())
				require.NoError(t, err)
				var systems []string
				for _, s := range rec.Ended() {
					if s.SpanKind() == trace.SpanKindProducer {
						systems = append(systems, spanAttr(s, "messaging.system"))
					}
				}
				require.NotEmpty(t, systems, "no publish span")
				for _, got := range systems {
					assert.Equal(t, name, got)
				}
			})
		}
	})
}
