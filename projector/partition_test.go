package projector_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/fakeclock"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/partition"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/uow"
)

// The behavioural suites of this package also run on a partitioned outbox.
func init() {
	testenv.PartitionTables(func(t testing.TB, db *gorm.DB) {
		require.NoError(t, outbox.MigrateWith(context.Background(), db, &partition.MigrateOpts{Partitioning: partition.Daily}))
	})
}

// TestMaintenanceWhilePublishing drops an old, fully sent partition while a
// projector relays a steady stream of new events through the in-memory bus:
// every event arrives exactly once with what was committed, the old
// partition is gone, and a partition holding a pending row stays.
func TestMaintenanceWhilePublishing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nov1 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	db, _ := testenv.Postgres(t)
	require.NoError(t, outbox.MigrateWith(ctx, db, &partition.MigrateOpts{
		Partitioning: partition.Daily, Ahead: 25, Clock: fakeclock.New(nov1),
	}))
	require.NoError(t, db.AutoMigrate(&Counter{}))
	clock := testenv.NewClock(nov1.Add(time.Hour))
	store, err := outbox.NewStore(db, &outbox.Config{Clock: clock, Test: outbox.TestConfig{Clock: clock}})
	require.NoError(t, err)
	units, err := uow.New(db, &uow.Config{Outbox: store})
	require.NoError(t, err)
	e := &env{db: db, store: store, units: units}

	bus := messaging.NewMemoryBus()
	defer bus.Close()
	require.NoError(t, bus.DeclareQueue("audit", "counter.*"))

	// Nov 1: events relayed long ago. Nov 2: one event still pending (due
	// only next year, so no projector takes it during the test).
	old := e.commit(t, counterIDs(10), 2)
	p, err := projector.New(store, bus, fastConfig())
	require.NoError(t, err)
	res, err := p.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, len(old), res.Published)
	clock.Set(nov1.AddDate(0, 0, 1).Add(time.Hour))
	tx := db.Begin()
	require.NoError(t, store.Insert(ctx, tx, []*outbox.Message{{
		ID: clock.NewID(clock.Now()), Topic: "counter.held", Payload: []byte(`{}`), AvailableAt: nov1.AddDate(1, 0, 0),
	}}))
	require.NoError(t, tx.Commit().Error)

	// Nov 20: a projector runs while events keep coming and maintenance
	// runs.
	now := nov1.AddDate(0, 0, 19).Add(time.Hour)
	clock.Set(now)
	msgs, err := bus.Subscriber("audit", "counter.*").Subscribe(ctx, "counter.*")
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- p.Run(runCtx) }()

	const batches, perBatch = 20, 5
	var fresh []string
	var freshMu sync.Mutex
	committerDone := make(chan struct{})
	go func() {
		defer close(committerDone)
		for b := range batches {
			ids := make([]string, perBatch)
			for i := range ids {
				ids[i] = fmt.Sprintf("n-%02d-%d", b, i)
			}
			evs := e.commit(t, ids, 3)
			freshMu.Lock()
			fresh = append(fresh, evs...)
			freshMu.Unlock()
		}
	}()

	// Maintenance starts once the relay is publishing the fresh events.
	var maint *partition.MaintainResult
	maintDone := make(chan error, 1)
	publishing := make(chan struct{})
	go func() {
		<-publishing
		var err error
		maint, err = outbox.Maintain(ctx, db, &partition.MaintainOpts{Clock: fakeclock.New(now)})
		maintDone <- err
	}()

	// Every event committed on Nov 20 arrives once, intact (after the
	// Nov 1 ones, which the queue held since the first drain).
	seen := map[string]*messaging.Envelope{}
	dups := 0
	want := batches * perBatch * 3
	deadline := time.After(60 * time.Second)
	for len(seen) < len(old)+want {
		select {
		case m := <-msgs:
			env, err := messaging.Decode(m)
			require.NoError(t, err)
			if _, dup := seen[env.ID]; dup {
				dups++
			}
			seen[env.ID] = env
			m.Ack()
			if len(seen) == len(old)+1 {
				close(publishing)
			}
		case <-deadline:
			t.Fatalf("only %d of %d events arrived", len(seen), len(old)+want)
		}
	}
	<-committerDone
	require.NoError(t, <-maintDone)
	stop()
	require.NoError(t, <-runDone)

	assert.Zero(t, dups, "no event arrived twice")
	require.Len(t, fresh, want)
	for _, id := range fresh {
		env, ok := seen[id]
		if !assert.True(t, ok, "event %s arrived", id) {
			continue
		}
		var row outbox.Message
		require.NoError(t, db.Where("id = ?", id).Take(&row).Error)
		assert.Equal(t, row.AggregateID, env.AggregateID)
		assert.Equal(t, row.AggregateVersion, env.AggregateVersion)
		assert.JSONEq(t, string(row.Payload), string(env.Payload))
		assert.Equal(t, outbox.StatusSent, row.Status)
	}

	assert.Contains(t, maint.Dropped, "outbox_events_p20261101")
	assert.Contains(t, maint.Kept, "outbox_events_p20261102")
	var partitions []string
	require.NoError(t, db.Raw(`SELECT c.relname FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
		WHERE h.inhparent = 'outbox_events'::regclass`).Scan(&partitions).Error)
	assert.NotContains(t, partitions, "outbox_events_p20261101", "the old partition is gone")
	assert.Contains(t, partitions, "outbox_events_p20261102", "a partition with a pending row stays")
	assert.Equal(t, int64(0), e.count(t, "id IN ?", old), "the Nov 1 rows went with their partition")
	assert.Equal(t, int64(1), e.count(t, "topic = 'counter.held' AND status = 'new'"))
	assert.Equal(t, int64(want), e.count(t, "status = 'sent'"))
}
