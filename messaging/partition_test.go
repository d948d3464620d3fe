package messaging_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/internal/buscheck"
	"github.com/bentoevents/bento/messaging"
)

func TestMemoryBusPartitionsKeepAnAggregateInOneQueueInOrder(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	const n, aggs, events = 8, 100, 5
	require.NoError(t, b.DeclarePartitions("billing", n, "order.*"))
	require.NoError(t, b.DeclarePartitions("billing", n, "order.*"), "declaring again is idempotent")
	require.ErrorIs(t, b.DeclarePartitions("billing", n+1, "order.*"), messaging.ErrInvalidConfig)
	require.ErrorIs(t, b.DeclarePartitions("billing", 0, "order.*"), messaging.ErrInvalidConfig)
	for e := range events {
		for a := range aggs {
			require.NoError(t, b.Publish("order.placed", buscheck.AggMsg(fmt.Sprintf("a%03d", a), e)))
		}
	}
	buscheck.CheckPartitioned(t, buscheck.Drain(t, b.PartitionSubscriber(0), "billing", n), aggs, events)
}

func TestMemoryBusPartitionHasOneActiveConsumer(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	require.NoError(t, b.DeclarePartitions("billing", 1, "order.*"))
	sub := b.PartitionSubscriber(0)
	buscheck.CheckHandover(t, b, messaging.PartitionQueue("billing", 0), sub, sub)
}

func TestMemoryBusPartitionPrefetch(t *testing.T) {
	t.Parallel()
	b := newBus(t)
	require.NoError(t, b.DeclarePartitions("billing", 1, "order.*"))
	buscheck.CheckPrefetch(t, b, messaging.PartitionQueue("billing", 0), b.PartitionSubscriber(3))
}

func TestNewMessageSetsThePartitionKey(t *testing.T) {
	t.Parallel()
	row := sampleRow()
	m, err := messaging.NewMessage(row)
	require.NoError(t, err)
	assert.Equal(t, row.TenantID+"|"+row.AggregateType+"|"+row.AggregateID, m.Metadata.Get(messaging.MetaPartitionKey))
	row.AggregateType, row.AggregateID, row.AggregateVersion = "", "", 0
	m, err = messaging.NewMessage(row)
	require.NoError(t, err)
	assert.Equal(t, row.ID, m.Metadata.Get(messaging.MetaPartitionKey), "an event without aggregate may go anywhere")
}
