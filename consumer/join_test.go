package consumer_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// TestPartitionedConsumerStartsThroughADatabaseHiccup: a partitioned
// consumer started while its database does not answer (its connection
// stalled behind a proxy) keeps trying to join its group instead of
// stopping, and runs once the database answers.
func TestPartitionedConsumerStartsThroughADatabaseHiccup(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	require.NoError(t, inbox.Migrate(context.Background(), direct))
	db, proxy := testenv.ProxiedPostgres(t, dsn)

	bus := messaging.NewMemoryBus()
	t.Cleanup(func() { _ = bus.Close() })
	c, err := consumer.NewMemory(db, bus, &consumer.Config{Group: "hiccup", Partitions: 2, TakeoverTime: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, consumer.Handle(c, func(context.Context, *gorm.DB, OrderPlaced, *messaging.Envelope) error { return nil }))

	proxy.Stall()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stopped := false
	t.Cleanup(func() {
		cancel()
		if !stopped {
			require.NoError(t, <-done)
		}
	})
	select {
	case err := <-done:
		stopped = true
		t.Fatalf("the consumer stopped while the database hung: %v", err)
	case <-c.Running():
		t.Fatal("the consumer ran without its database")
	case <-time.After(2 * time.Second): // four beat timeouts
	}
	proxy.Resume()
	select {
	case err := <-done:
		stopped = true
		t.Fatalf("the consumer stopped: %v", err)
	case <-c.Running():
	case <-time.After(20 * time.Second):
		t.Fatal("the consumer did not start once the database answered")
	}
}
