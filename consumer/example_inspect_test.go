package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// An operator's tool looks at what a group holds back, and releases an
// aggregate whose dead letter was discarded, from the database alone.
func ExampleInspect() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "bento-inspect")
	defer os.RemoveAll(dir)
	db, err := embedded.OpenSQLite(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	_ = inbox.Migrate(ctx, db)

	// What a running partitioned consumer of "billing" does when version
	// 2 of order o-1 is dead-lettered and version 3 arrives.
	in, _ := inbox.New(db, &inbox.Config{Consumer: "billing"})
	for v := int64(2); v <= 3; v++ {
		m, _ := messaging.NewMessage(&outbox.Message{ID: fmt.Sprintf("o-1-v%d", v), TenantID: "acme", Topic: "order.changed",
			AggregateType: "order", AggregateID: "o-1", AggregateVersion: v, SchemaVersion: 1, Payload: []byte(`{}`),
			OccurredAt: time.Now()})
		if v == 2 {
			_ = in.Hold(ctx, m)
		} else {
			_ = in.Park(ctx, m, 0, inbox.ParkedHeld)
		}
	}

	insp, err := consumer.Inspect(db, "billing", &consumer.InspectOpts{Versions: inbox.VersionsIgnored})
	if err != nil {
		log.Fatal(err)
	}
	parked, _ := insp.Parked(ctx, inbox.ParkedFilter{TenantID: "acme"}, 100)
	for _, p := range parked {
		fmt.Println("parked:", p.MessageID, p.Reason)
	}
	agg, _ := insp.Aggregate(ctx, parked[0].Aggregate(), 100)
	fmt.Println("held behind:", agg.Hold.MessageID, "release names:", agg.Release())
	fmt.Println("release:", insp.Release(ctx, agg.Aggregate, agg.Release()))
	err = insp.Release(ctx, agg.Aggregate, agg.Release())
	fmt.Println("again, stale:", errors.Is(err, consumer.ErrStaleRelease))
	// Output:
	// parked: o-1-v3 held
	// held behind: o-1-v2 release names: o-1-v2
	// release: <nil>
	// again, stale: true
}
