package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// TestAddCarriesTheCallersTrace checks that the manual mode writes the
// trace context of the caller's span into the event, keeps a traceparent
// the caller set, and writes none without a span.
func TestAddCarriesTheCallersTrace(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		tp := sdktrace.NewTracerProvider()
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		ctx, span := tp.Tracer("test").Start(context.Background(), "request")
		defer span.End()
		sc := span.SpanContext()

		m := e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-1"}, nil)
		stored, err := e.store.Get(context.Background(), m.ID)
		require.NoError(t, err)
		want := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())
		assert.Equal(t, want, stored.Metadata[messaging.MetaTraceparent])

		own := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		m = e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-2"},
			&outbox.AddOpts{Metadata: outbox.Metadata{messaging.MetaTraceparent: own}})
		stored, err = e.store.Get(context.Background(), m.ID)
		require.NoError(t, err)
		assert.Equal(t, own, stored.Metadata[messaging.MetaTraceparent], "the caller's traceparent is kept")

		m = e.add(context.Background(), t, "order.paid", orderPaid{OrderID: "o-3"}, nil)
		stored, err = e.store.Get(context.Background(), m.ID)
		require.NoError(t, err)
		assert.NotContains(t, stored.Metadata, messaging.MetaTraceparent, "no span, no traceparent")
	})
}
