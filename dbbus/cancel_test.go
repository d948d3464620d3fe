package dbbus_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/buscheck"
	"github.com/bentoevents/bento/internal/tcpproxy"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// cancelledMidStatement is the set-up of the tests below: two buses on one
// PostgreSQL schema, as two processes, the first one's connections slowed
// through a proxy (each chunk of bytes delayed 300 ms each way), so that a
// statement of the first commits on the server well before its answer
// reaches the bus, and a test can cancel the bus's context in between. Both
// buses lease for an hour: what a cancelled statement left leased or owned
// would stay so for the whole test.
func cancelledMidStatement(t *testing.T) (slowed, direct *dbbus.Bus, db *gorm.DB, proxy *tcpproxy.Proxy) {
	t.Helper()
	db, dsn := testenv.Postgres(t)
	viaDB, proxy := testenv.ProxiedPostgres(t, dsn)
	cfg := dbbus.Config{PollInterval: 20 * time.Millisecond, VisibilityTimeout: time.Hour}
	direct = setup(t, db, cfg)
	slowed = setup(t, viaDB, cfg)
	require.NoError(t, viaDB.Exec("SELECT 1").Error, "a connection is open before the proxy slows it")
	return slowed, direct, db, proxy
}

// cancelWhen cancels the context it returns as soon as committed (a query
// on the direct handle) reports true: the slowed bus's statement committed
// and its answer is still on its way.
func cancelWhen(t *testing.T, committed func() bool) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	go func() {
		defer cancel()
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if committed() {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return ctx
}

// closedWithin waits for ch to be closed, failing the test after d.
func closedWithin(t *testing.T, ch <-chan *message.Message, d time.Duration) {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatalf("the cancelled subscription's channel was not closed within %v", d)
		}
	}
}

// TestSubscribeCancelledMidOwnLeavesNoOwner: a partition subscription
// whose context ends while its statement taking the queue's ownership is
// on its way back (committed on the server, not yet answered) gives the
// queue up as it ends, so another process's subscription takes the queue
// at once rather than after the visibility timeout. Partition moves end
// subscriptions at any moment; a queue left owned by an ended one stalls
// its partition.
func TestSubscribeCancelledMidOwnLeavesNoOwner(t *testing.T) {
	t.Parallel()
	slowed, direct, db, proxy := cancelledMidStatement(t)
	ctx := t.Context()
	require.NoError(t, dbbus.DeclarePartitions(ctx, db, "billing", 1, "order.*"))
	queue := messaging.PartitionQueue("billing", 0)
	owners := func() int64 {
		var n int64
		require.NoError(t, db.Raw(`SELECT count(*) FROM dbbus_queue_owners WHERE queue = ?`, queue).Scan(&n).Error)
		return n
	}

	proxy.Slow(300 * time.Millisecond)
	subCtx := cancelWhen(t, func() bool { return owners() > 0 })
	sub := slowed.PartitionSubscriber(1)
	t.Cleanup(func() { _ = sub.Close() })
	ch, err := sub.Subscribe(subCtx, queue)
	if err != nil {
		require.ErrorIs(t, err, context.Canceled, "only the cancel may fail the subscribe")
	}
	<-subCtx.Done()
	require.EqualValues(t, 1, owners(), "the cancelled subscription's ownership committed")
	proxy.Slow(0)
	if ch != nil {
		closedWithin(t, ch, 20*time.Second)
	}

	require.NoError(t, direct.Publish("order.placed", buscheck.AggMsg("a1", 1)))
	other := direct.PartitionSubscriber(1)
	t.Cleanup(func() { _ = other.Close() })
	och, err := other.Subscribe(ctx, queue)
	require.NoError(t, err)
	m := receive(t, och, 10*time.Second)
	m.Ack()
	assert.Equal(t, "a1", m.Metadata.Get(messaging.MetaAggregateID))
}

// TestSubscriberStoppedMidClaimLeavesNoLease: a plain subscription whose
// context ends while its claim is on its way back (the deliveries leased on
// the server, the answer not yet read) gives those deliveries back, so
// another subscriber of the group receives them at once rather than after
// the visibility timeout.
func TestSubscriberStoppedMidClaimLeavesNoLease(t *testing.T) {
	t.Parallel()
	slowed, direct, db, proxy := cancelledMidStatement(t)
	ctx := t.Context()
	require.NoError(t, dbbus.DeclareGroup(ctx, db, "plain", "order.*"))
	leased := func() int64 {
		var n int64
		require.NoError(t, db.Raw(`SELECT count(*) FROM dbbus_deliveries WHERE group_name = 'plain' AND lease_token IS NOT NULL`).Scan(&n).Error)
		return n
	}

	proxy.Slow(300 * time.Millisecond)
	subCtx := cancelWhen(t, func() bool { return leased() > 0 })
	sub := slowed.Subscriber()
	t.Cleanup(func() { _ = sub.Close() })
	ch, err := sub.Subscribe(subCtx, "plain")
	require.NoError(t, err)
	require.NoError(t, direct.Publish("order.placed", buscheck.AggMsg("a1", 1)))
	<-subCtx.Done()
	require.EqualValues(t, 1, leased(), "the cancelled subscription's claim committed")
	proxy.Slow(0)
	closedWithin(t, ch, 20*time.Second)

	_, och := subscribe(t, direct, "plain")
	m := receive(t, och, 10*time.Second)
	m.Ack()
	assert.Equal(t, "a1", m.Metadata.Get(messaging.MetaAggregateID))
}
