package dbbus_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// TestAcksOfSubscriptionsCommitTogether: eight partition owners of one bus
// each ack a message at the same moment. Their acks must be deleted in one
// transaction of the bus (two at most, should a flush fall between them),
// each fenced by its own owner's lease, not in a transaction per owner:
// at a thousand messages a second over sixteen partitions an owner rarely
// holds more than one ack, and a transaction per ack was five statements
// per message.
func TestAcksOfSubscriptionsCommitTogether(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		const parts = 8
		// One statement per ack transaction deletes the bodies.
		counter := &statementCounter{Interface: logger.Discard, match: func(sql string) bool {
			return strings.HasPrefix(sql, "DELETE FROM dbbus_messages ")
		}}
		bus := setup(t, db.Session(&gorm.Session{Logger: counter}), dbbus.Config{})
		chans := ownPartitions(t, db, bus, "ledger", parts)
		msgs := make([]*message.Message, parts)
		for p := range parts {
			msgs[p] = newMessage(`{}`)
			msgs[p].Metadata.Set(messaging.MetaPartitionKey, keyOf(t, p, parts))
		}
		require.NoError(t, bus.Publish("order.paid", msgs...))
		got := make([]*message.Message, parts)
		for p := range parts {
			got[p] = receive(t, chans[p], 10*time.Second)
			require.Equal(t, msgs[p].UUID, got[p].UUID)
		}
		before := counter.count()
		for _, m := range got {
			m.Ack()
		}
		testenv.WaitFor(t, 10*time.Second, "every delivery and body deleted", func() bool {
			return rows(t, db, "dbbus_deliveries") == 0 && rows(t, db, "dbbus_messages") == 0
		})
		assert.LessOrEqual(t, counter.count()-before, 2, "the eight owners' acks share the bus's ack transactions")
	})
}

// TestAckOfSeveralClaimsFencesEachLease acks, in one transaction, a
// delivery under the lease that holds it and another under a token that
// lost it: the first is deleted, the second fails with ErrLeaseLost and
// stays with its holder, whose own ack then deletes it and the last body.
func TestAckOfSeveralClaimsFencesEachLease(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{VisibilityTimeout: time.Minute})
		ctx := t.Context()
		// One partition, two messages in hand at a time.
		require.NoError(t, dbbus.DeclarePartitions(ctx, db, "billing", 1, "order.*"))
		sub := bus.PartitionSubscriber(2)
		t.Cleanup(func() { _ = sub.Close() })
		ch, err := sub.Subscribe(ctx, messaging.PartitionQueue("billing", 0))
		require.NoError(t, err)
		require.NoError(t, bus.Publish("order.paid", newMessage(`{"n":1}`), newMessage(`{"n":2}`)))
		var leases []dbbus.Lease
		for range 2 {
			l, ok := dbbus.LeaseOf(receive(t, ch, 5*time.Second))
			require.True(t, ok)
			leases = append(leases, l)
		}
		stale := leases[1]
		stale.Token = "lost"

		err = dbbus.AckAll(ctx, db, []dbbus.Lease{leases[0], stale})
		require.ErrorIs(t, err, dbbus.ErrLeaseLost)
		assert.Contains(t, err.Error(), stale.MessageID, "the error names the lease that lost its delivery")
		assert.NotContains(t, err.Error(), leases[0].MessageID)
		assert.EqualValues(t, 1, rows(t, db, "dbbus_deliveries"), "the stale ack deleted its holder's delivery")
		assert.EqualValues(t, 1, rows(t, db, "dbbus_messages"))

		require.NoError(t, dbbus.AckAll(ctx, db, []dbbus.Lease{leases[1]}))
		assert.Zero(t, rows(t, db, "dbbus_deliveries"))
		assert.Zero(t, rows(t, db, "dbbus_messages"), "a body outlived its last delivery")
	})
}

// rows counts the rows of a dbbus table.
func rows(t *testing.T, db *gorm.DB, table string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Table(table).Count(&n).Error)
	return n
}
