package dbbus

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/messaging"
)

// DeclareGroup binds consumer group to topic patterns, with the semantics
// of a RabbitMQ topic exchange ([messaging.MatchTopic]): an exact topic,
// "order.*" (one word), "order.#" (zero or more words). Messages published
// after it returns get a delivery row for the group when their topic
// matches any of its patterns. It adds the patterns to those the group
// already has and is idempotent. db may be a transaction.
//
// Errors: messaging.ErrInvalidName for a bad group or pattern, or for
// [UnroutableGroup], which takes no bindings.
func DeclareGroup(ctx context.Context, db *gorm.DB, group string, patterns ...string) error {
	if err := checkBindable(group, patterns); err != nil {
		return fmt.Errorf("dbbus: declare group: %w", err)
	}
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		n, err := partitionsOf(tx, group)
		if err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("dbbus: declare group: %w: group %q has %d partitions (DeclarePartitions)", ErrTopologyMismatch, group, n)
		}
		return bind(tx, group, patterns)
	})
}

// Depth returns how many messages queue holds: its ready deliveries and
// those leased to a subscriber and not yet acked. queue is a group declared
// with [DeclareGroup] (such as a dead-letter queue), a partition queue
// messaging.PartitionQueue(group, p) of a group declared with
// [DeclarePartitions], or [UnroutableGroup], which always exists.
//
// Errors: messaging.ErrQueueNotFound for a queue never declared.
func Depth(ctx context.Context, db *gorm.DB, queue string) (int, error) {
	if err := requireGroup(ctx, db, queue); err != nil {
		return 0, err
	}
	var n int64
	if err := db.WithContext(ctx).Raw(`SELECT
	(SELECT count(*) FROM dbbus_deliveries WHERE group_name = ? AND lease_token IS NULL) +
	(SELECT count(*) FROM dbbus_deliveries WHERE group_name = ? AND lease_token IS NOT NULL)`, queue, queue).
		Scan(&n).Error; err != nil {
		return 0, wrapDB("depth", err)
	}
	return int(n), nil
}

// requireGroup returns messaging.ErrQueueNotFound unless queue is a plain
// group with a binding, a partition queue of a partitioned group, or the
// unroutable group.
func requireGroup(ctx context.Context, db *gorm.DB, queue string) error {
	if queue == UnroutableGroup {
		return nil
	}
	db = db.WithContext(ctx)
	if g, p, ok := partitionQueueOf(queue); ok {
		n, err := partitionsOf(db, g)
		if err != nil {
			return err
		}
		if p < n {
			return nil
		}
	}
	n, err := partitionsOf(db, queue)
	if err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("dbbus: %w: group %q is partitioned: consume messaging.PartitionQueue(%[2]q, p)", messaging.ErrQueueNotFound, queue)
	}
	bound, err := hasBindings(db, queue)
	if err != nil {
		return err
	}
	if !bound {
		return fmt.Errorf("dbbus: %w: queue %q is not declared", messaging.ErrQueueNotFound, queue)
	}
	return nil
}
