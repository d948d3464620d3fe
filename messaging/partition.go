package messaging

import (
	"hash/fnv"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
)

// MaxPartitions bounds a group's partition count, on every bus.
const MaxPartitions = 1024

// PartitionQueue returns the name of partition p of group: "<group>.p<p>".
func PartitionQueue(group string, p int) string { return group + ".p" + strconv.Itoa(p) }

// PartitionKey returns the key that chooses a message's partition: its
// MetaPartitionKey metadata, set by [NewMessage]; for a message without it,
// "tenant|aggregate type|aggregate id" for an event of an aggregate, and its
// UUID otherwise (an event without aggregate may go to any partition).
func PartitionKey(msg *message.Message) string {
	if k := msg.Metadata.Get(MetaPartitionKey); k != "" {
		return k
	}
	return partitionKey(msg.UUID, msg.Metadata.Get(MetaTenantID), msg.Metadata.Get(MetaAggregateType),
		msg.Metadata.Get(MetaAggregateID))
}

func partitionKey(id, tenant, aggType, aggID string) string {
	if aggID == "" {
		return id
	}
	return tenant + "|" + aggType + "|" + aggID
}

// PartitionOf returns the partition, 0 to n-1, that a message whose
// [PartitionKey] is key goes to among n, on the memory bus and the
// database bus (package dbbus): the FNV-1a 64-bit hash of key modulo n.
// RabbitMQ's consistent-hash exchange chooses by its own hash. n must be
// positive.
func PartitionOf(key string, n int) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum64() % uint64(n))
}
