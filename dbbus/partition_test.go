package dbbus_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/buscheck"
	"github.com/bentoevents/bento/internal/embeddb"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// twoProcesses returns two handles, each with its own connection pool, on
// one fresh database of backend b: what two processes sharing it have.
func twoProcesses(t *testing.T, b testenv.Backend) (*gorm.DB, *gorm.DB) {
	t.Helper()
	open := func(t *testing.T, dial gorm.Dialector) *gorm.DB {
		db, err := gorm.Open(dial, &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
		require.NoError(t, err)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		t.Cleanup(func() { _ = sqlDB.Close() })
		return db
	}
	if b.Name == "sqlite" {
		path := filepath.Join(t.TempDir(), "bus.db")
		var dbs [2]*gorm.DB
		for i := range dbs {
			db, err := embeddb.Open(path, nil)
			require.NoError(t, err)
			sqlDB, _ := db.DB()
			t.Cleanup(func() { _ = sqlDB.Close() })
			dbs[i] = db
		}
		return dbs[0], dbs[1]
	}
	db, dsn := testenv.Postgres(t)
	return db, open(t, postgres.Open(dsn))
}

// eachBackend runs fn on every backend with two handles on one database.
func eachBackend(t *testing.T, fn func(t *testing.T, db1, db2 *gorm.DB)) {
	t.Helper()
	for _, b := range testenv.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			db1, db2 := twoProcesses(t, b)
			fn(t, db1, db2)
		})
	}
}

func TestDeclarePartitions(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{PollInterval: 20 * time.Millisecond})
		ctx := t.Context()
		const n, aggs, events = 4, 40, 5
		require.NoError(t, dbbus.DeclarePartitions(ctx, db, "billing", n, "order.*"))
		require.NoError(t, dbbus.DeclarePartitions(ctx, db, "billing", n, "order.*"), "declaring again is idempotent")
		require.ErrorIs(t, dbbus.DeclarePartitions(ctx, db, "billing", n+1, "order.*"), dbbus.ErrTopologyMismatch)
		require.ErrorIs(t, dbbus.DeclarePartitions(ctx, db, "billing", 0, "order.*"), dbbus.ErrInvalidPartitions)
		require.ErrorIs(t, dbbus.DeclarePartitions(ctx, db, "billing", messaging.MaxPartitions+1, "order.*"), dbbus.ErrInvalidPartitions)
		require.ErrorIs(t, dbbus.DeclareGroup(ctx, db, "billing", "order.*"), dbbus.ErrTopologyMismatch)
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "plain", "order.*"))
		require.ErrorIs(t, dbbus.DeclarePartitions(ctx, db, "plain", n, "order.*"), dbbus.ErrTopologyMismatch)
		require.ErrorIs(t, dbbus.DeclarePartitions(ctx, db, "bad name!", n), messaging.ErrInvalidName)

		_, err := dbbus.Depth(ctx, db, "billing")
		require.ErrorIs(t, err, messaging.ErrQueueNotFound, "a partitioned group is consumed by partition")
		_, err = dbbus.Depth(ctx, db, messaging.PartitionQueue("billing", n))
		require.ErrorIs(t, err, messaging.ErrQueueNotFound)
		_, err = bus.PartitionSubscriber(1).Subscribe(ctx, messaging.PartitionQueue("billing", n))
		require.ErrorIs(t, err, messaging.ErrQueueNotFound)

		want := make([]int, n)
		for e := range events {
			for a := range aggs {
				m := buscheck.AggMsg(fmt.Sprintf("a%03d", a), e)
				want[messaging.PartitionOf(messaging.PartitionKey(m), n)]++
				require.NoError(t, bus.Publish("order.placed", m))
			}
		}
		for p := range n {
			assert.Equal(t, want[p], depth(t, db, messaging.PartitionQueue("billing", p)),
				"partition %d holds what the memory bus's hash sends it", p)
		}
		assert.Equal(t, aggs*events, depth(t, db, "plain"), "a plain group bound to the same topic gets every message")
		buscheck.CheckPartitioned(t, buscheck.Drain(t, bus.PartitionSubscriber(3), "billing", n), aggs, events)
		testenv.WaitFor(t, 5*time.Second, "the acks to empty the partitions", func() bool {
			total := 0
			for p := range n {
				total += depth(t, db, messaging.PartitionQueue("billing", p))
			}
			return total == 0
		})
	})
}

// TestPartitionHandoverAcrossProcesses runs the bus-independent handover
// check with the active subscription on one Bus and the standby on
// another, each on its own connection pool, as two processes.
func TestPartitionHandoverAcrossProcesses(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, db1, db2 *gorm.DB) {
		cfg := dbbus.Config{PollInterval: 20 * time.Millisecond, VisibilityTimeout: time.Hour}
		bus1, bus2 := setup(t, db1, cfg), setup(t, db2, cfg)
		require.NoError(t, dbbus.DeclarePartitions(t.Context(), db1, "billing", 1, "order.*"))
		buscheck.CheckHandover(t, bus1, messaging.PartitionQueue("billing", 0), bus1.PartitionSubscriber(2), bus2.PartitionSubscriber(2))
	})
}

func TestPartitionPrefetch(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{PollInterval: 20 * time.Millisecond})
		require.NoError(t, dbbus.DeclarePartitions(t.Context(), db, "billing", 1, "order.*"))
		buscheck.CheckPrefetch(t, bus, messaging.PartitionQueue("billing", 0), bus.PartitionSubscriber(3))
	})
}

// take receives n messages from ch and returns their UUIDs and messages.
func take(t *testing.T, ch <-chan *message.Message, n int) ([]string, []*message.Message) {
	t.Helper()
	var ids []string
	var ms []*message.Message
	for range n {
		m := receive(t, ch, 5*time.Second)
		ids = append(ids, m.UUID)
		ms = append(ms, m)
	}
	return ids, ms
}

// TestPartitionRaceAndCrash races two processes for one partition: exactly
// one receives. The owner acks one message of its batch, then its process
// dies holding the rest (its connections are gone: nothing is given back,
// nothing renewed). The other process takes the partition over once the
// ownership lapses and receives every message not acked, in order, the
// ones the dead owner held counted as a failed attempt.
func TestPartitionRaceAndCrash(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, db1, db2 *gorm.DB) {
		cfg := dbbus.Config{PollInterval: 20 * time.Millisecond, VisibilityTimeout: 600 * time.Millisecond}
		bus1, bus2 := setup(t, db1, cfg), setup(t, db2, cfg)
		queue := messaging.PartitionQueue("billing", 0)
		require.NoError(t, dbbus.DeclarePartitions(t.Context(), db1, "billing", 1, "order.*"))
		for i := range 8 {
			require.NoError(t, bus2.Publish("order.placed", buscheck.AggMsg("a", i)))
		}
		type result struct {
			ch  <-chan *message.Message
			bus int
		}
		// Both subscribe at once; exactly one receives.
		subs := make(chan result, 2)
		for i, bus := range []*dbbus.Bus{bus1, bus2} {
			go func() {
				ch, err := bus.PartitionSubscriber(4).Subscribe(t.Context(), queue)
				assert.NoError(t, err)
				subs <- result{ch, i}
			}()
		}
		r1, r2 := <-subs, <-subs
		var active, standby result
		var first *message.Message
		select {
		case first = <-r1.ch:
			active, standby = r1, r2
		case first = <-r2.ch:
			active, standby = r2, r1
		case <-time.After(5 * time.Second):
			t.Fatal("neither racing subscription received")
		}
		ids, held := take(t, active.ch, 3)
		held = append([]*message.Message{first}, held...)
		assert.Equal(t, []string{"a-000", "a-001", "a-002", "a-003"}, append([]string{first.UUID}, ids...))
		select {
		case m := <-standby.ch:
			t.Fatalf("the standby subscription received %s while the partition is owned", m.UUID)
		case <-time.After(300 * time.Millisecond):
		}
		held[0].Ack()
		dbs := []*gorm.DB{db1, db2}
		buses := []*dbbus.Bus{bus1, bus2}
		testenv.WaitFor(t, 5*time.Second, "the first ack", func() bool {
			return depth(t, dbs[standby.bus], queue) == 7
		})
		// The active process dies: its pool closes under it, so it can
		// neither renew nor give back.
		sqlDB, err := dbs[active.bus].DB()
		require.NoError(t, err)
		require.NoError(t, sqlDB.Close())
		_ = buses[active.bus].Close()

		var ms []*message.Message
		ids = nil
		for range 7 {
			m := receive(t, standby.ch, 5*time.Second)
			ids, ms = append(ids, m.UUID), append(ms, m)
			m.Ack()
		}
		assert.Equal(t, []string{"a-001", "a-002", "a-003", "a-004", "a-005", "a-006", "a-007"}, ids,
			"the next owner receives everything not acked, in order")
		for i, m := range ms {
			l, ok := dbbus.LeaseOf(m)
			require.True(t, ok)
			if i < 3 {
				assert.Equal(t, 1, l.Attempts, "%s was held by the dead owner", m.UUID)
			}
		}
	})
}

// TestPartitionCancelMidBatch cancels the owner's subscription while it
// holds a batch, one message acked: the other process takes over at once
// (no lapse to wait for) and receives the rest in order, uncounted.
func TestPartitionCancelMidBatch(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, db1, db2 *gorm.DB) {
		cfg := dbbus.Config{PollInterval: time.Hour, VisibilityTimeout: time.Hour}
		bus1, bus2 := setup(t, db1, cfg), setup(t, db2, cfg)
		queue := messaging.PartitionQueue("billing", 0)
		require.NoError(t, dbbus.DeclarePartitions(t.Context(), db1, "billing", 1, "order.*"))
		ctx1, cancel1 := context.WithCancel(t.Context())
		defer cancel1()
		active, err := bus1.PartitionSubscriber(3).Subscribe(ctx1, queue)
		require.NoError(t, err)
		standby, err := bus2.PartitionSubscriber(3).Subscribe(t.Context(), queue)
		require.NoError(t, err)
		for i := range 5 {
			require.NoError(t, bus1.Publish("order.placed", buscheck.AggMsg("a", i)))
		}
		ids, held := take(t, active, 3)
		require.Equal(t, []string{"a-000", "a-001", "a-002"}, ids)
		held[0].Ack()
		cancel1()
		buscheck.RequireClosed(t, active)
		// bus2 polls only hourly and hears nothing in-process from bus1;
		// its claim must come from PostgreSQL's NOTIFY... so wake it the
		// way a publish of its own does.
		require.NoError(t, bus2.Publish("order.placed", buscheck.AggMsg("a", 5)))
		ids, ms := take(t, standby, 3)
		assert.Equal(t, []string{"a-001", "a-002", "a-003"}, ids)
		for _, m := range ms {
			l, _ := dbbus.LeaseOf(m)
			assert.Zero(t, l.Attempts, "%s was given back, not failed", m.UUID)
			m.Ack()
		}
		ids, _ = take(t, standby, 2)
		assert.Equal(t, []string{"a-004", "a-005"}, ids)
	})
}

// TestSlowHandlerKeepsItsLeases holds messages three visibility timeouts
// long, on a partition and on a plain group with a competing consumer:
// the leases are renewed, nobody else receives them, and the acks succeed.
func TestSlowHandlerKeepsItsLeases(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		const vt = 300 * time.Millisecond
		bus := setup(t, db, dbbus.Config{PollInterval: 20 * time.Millisecond, VisibilityTimeout: vt})
		ctx := t.Context()
		require.NoError(t, dbbus.DeclarePartitions(ctx, db, "billing", 1, "order.*"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "audit", "order.*"))
		queue := messaging.PartitionQueue("billing", 0)
		owner, err := bus.PartitionSubscriber(2).Subscribe(ctx, queue)
		require.NoError(t, err)
		standby, err := bus.PartitionSubscriber(2).Subscribe(ctx, queue)
		require.NoError(t, err)
		_, plain := subscribe(t, bus, "audit")
		require.NoError(t, bus.Publish("order.placed", buscheck.AggMsg("a", 0)))
		slow := receive(t, owner, 5*time.Second)
		slowPlain := receive(t, plain, 5*time.Second)
		_, rival := subscribe(t, bus, "audit")
		select {
		case m := <-standby:
			t.Fatalf("the standby received %s from a live owner", m.UUID)
		case m := <-rival:
			t.Fatalf("a competing consumer received %s held by a slow handler", m.UUID)
		case <-time.After(3 * vt):
		}
		slow.Ack()
		slowPlain.Ack()
		testenv.WaitFor(t, 5*time.Second, "both acks to delete their deliveries", func() bool {
			return depth(t, db, queue) == 0 && depth(t, db, "audit") == 0
		})
	})
}
