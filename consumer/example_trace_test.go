package consumer_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/uow"
)

// Example_tracing follows one request through the outbox: the unit of work
// stores the request's trace context with the event, the projector publishes
// it in a span of the same trace, and the consumer's handler runs in a child
// of that span.
func Example_tracing() {
	ctx := context.Background()
	// Any OpenTelemetry TracerProvider. An application would export with
	// sdktrace.WithBatcher(otlptracegrpc.New(...)), call
	// otel.SetTracerProvider(tp) once and leave bento's TracerProvider
	// options nil; this example records spans in memory to print them.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tp.Shutdown(ctx) }()
	tracer := tp.Tracer("shop")

	dir, _ := os.MkdirTemp("", "bento-trace")
	defer os.RemoveAll(dir)
	db, err := embedded.OpenSQLite(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	_ = outbox.Migrate(ctx, db)
	_ = inbox.Migrate(ctx, db)
	_ = db.AutoMigrate(&Cart{})
	bus := messaging.NewMemoryBus()

	units, _ := uow.New(db, &uow.Config{TracerProvider: tp})
	pcfg := projector.DefaultConfig()
	pcfg.TracerProvider = tp
	pcfg.Logger = quiet
	relay, _ := projector.New(units.Outbox(), bus, pcfg)
	ccfg := consumer.DefaultConfig("shipping")
	ccfg.TracerProvider = tp
	ccfg.Logger = quiet
	shipping, _ := consumer.NewMemory(db, bus, ccfg)
	_ = consumer.Handle(shipping, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
		_, span := tracer.Start(ctx, "pack order") // a child of the consume span
		defer span.End()
		return nil
	})
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = shipping.Run(cctx) }()
	<-shipping.Running()

	// The request: a span (an HTTP middleware such as otelhttp would start
	// it) around a unit of work that records order.placed.
	rctx, request := tracer.Start(ctx, "POST /carts/cart-1/checkout")
	err = units.Run(rctx, func(ctx context.Context, u *uow.UnitOfWork) error {
		cart := &Cart{}
		cart.ID = "cart-1"
		cart.Record(OrderPlaced{OrderID: "o-1", SKU: "apple", Qty: 1})
		return u.Add(cart)
	})
	request.End()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.Drain(ctx); err != nil {
		log.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if len(spans.Ended()) == 5 {
			break
		}
	}

	printTree(spans.Ended())
	// Output:
	// POST /carts/cart-1/checkout
	//   bento.uow.commit
	//     bento.publish order.placed
	//       bento.consume order.placed
	//         pack order
	// traces: 1
}

// printTree prints spans as a tree under their parents, and the number of
// distinct traces.
func printTree(ended []sdktrace.ReadOnlySpan) {
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	traces := map[trace.TraceID]bool{}
	for _, s := range ended {
		children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s)
		traces[s.SpanContext().TraceID()] = true
	}
	var walk func(parent trace.SpanID, depth int)
	walk = func(parent trace.SpanID, depth int) {
		kids := children[parent]
		slices.SortFunc(kids, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
		for _, s := range kids {
			fmt.Println(strings.Repeat("  ", depth) + s.Name())
			walk(s.SpanContext().SpanID(), depth+1)
		}
	}
	walk(trace.SpanID{}, 0)
	fmt.Println("traces:", len(traces))
}
