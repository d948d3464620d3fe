package messaging

import (
	"errors"
	"fmt"
)

// ErrQueueNotFound is returned for a queue that does not exist, by
// [MemoryBus.Depth] and by the RabbitMQ bus (package rabbitmq).
var ErrQueueNotFound = errors.New("messaging: queue not found")

// Depth returns how many messages wait in queue on the bus: not those
// delivered and not yet acked.
//
// Errors: ErrQueueNotFound.
func (b *MemoryBus) Depth(queue string) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.queues[queue]
	if q == nil {
		return 0, fmt.Errorf("%w: %q", ErrQueueNotFound, queue)
	}
	return len(q.items) - q.head, nil
}
