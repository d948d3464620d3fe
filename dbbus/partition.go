package dbbus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/messaging"
)

// ErrTopologyMismatch is returned by [DeclarePartitions] for a group
// declared with another partition count or as a plain group, and by
// [DeclareGroup] for a partitioned group.
var ErrTopologyMismatch = errors.New("dbbus: topology mismatch")

// ErrInvalidPartitions is returned by [DeclarePartitions] for a partition
// count outside 1..messaging.MaxPartitions.
var ErrInvalidPartitions = errors.New("dbbus: invalid partition count")

// DeclarePartitions splits consumer group into n partition queues,
// messaging.PartitionQueue(group, 0..n-1), and binds the group to topic
// patterns as [DeclareGroup] does: a message published after it returns
// whose topic matches gets one delivery row, in partition
// messaging.PartitionOf(messaging.PartitionKey(msg), n), the partition the
// memory bus chooses too, so an aggregate's events stay in one queue in
// publish order. Consume a partition with [Bus.PartitionSubscriber]. It
// adds the patterns to those the group has and is idempotent. db may be a
// transaction.
//
// Errors: messaging.ErrInvalidName for a bad group or pattern,
// ErrInvalidPartitions for n outside 1..messaging.MaxPartitions,
// ErrTopologyMismatch when the group has another partition count or is a
// plain group ([DeclareGroup]).
func DeclarePartitions(ctx context.Context, db *gorm.DB, group string, n int, patterns ...string) error {
	if err := checkBindable(group, patterns); err != nil {
		return fmt.Errorf("dbbus: declare partitions: %w", err)
	}
	if n < 1 || n > messaging.MaxPartitions {
		return fmt.Errorf("dbbus: declare partitions of %q: %w: %d (want 1 to %d)", group, ErrInvalidPartitions, n, messaging.MaxPartitions)
	}
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		had, err := partitionsOf(tx, group)
		if err != nil {
			return err
		}
		switch {
		case had == 0:
			plain, err := hasBindings(tx, group)
			if err != nil {
				return err
			}
			if plain {
				return fmt.Errorf("dbbus: declare partitions: %w: group %q is declared without partitions", ErrTopologyMismatch, group)
			}
			if err := tx.Exec(`INSERT INTO dbbus_partitions (group_name, partitions) VALUES (?, ?) ON CONFLICT DO NOTHING`,
				group, n).Error; err != nil {
				return wrapDB("declare partitions", err)
			}
			// A concurrent declaration may have won with another count.
			if had, err = partitionsOf(tx, group); err != nil {
				return err
			}
			if had != n {
				return fmt.Errorf("dbbus: declare partitions: %w: group %q has %d partitions, not %d", ErrTopologyMismatch, group, had, n)
			}
		case had != n:
			return fmt.Errorf("dbbus: declare partitions: %w: group %q has %d partitions, not %d", ErrTopologyMismatch, group, had, n)
		}
		return bind(tx, group, patterns)
	})
}

// partitionsOf returns group's partition count, 0 for a group that is not
// partitioned.
func partitionsOf(db *gorm.DB, group string) (int, error) {
	var n []int
	if err := db.Raw(`SELECT partitions FROM dbbus_partitions WHERE group_name = ?`, group).Scan(&n).Error; err != nil {
		return 0, wrapDB("read partitions", err)
	}
	if len(n) == 0 {
		return 0, nil
	}
	return n[0], nil
}

// hasBindings reports whether group has a binding.
func hasBindings(db *gorm.DB, group string) (bool, error) {
	var n int64
	if err := db.Raw(`SELECT count(*) FROM dbbus_bindings WHERE group_name = ?`, group).Scan(&n).Error; err != nil {
		return false, wrapDB("read bindings", err)
	}
	return n > 0, nil
}

// checkBindable validates a group that takes bindings, and its patterns.
func checkBindable(group string, patterns []string) error {
	if err := messaging.ValidateGroup(group); err != nil {
		return err
	}
	if group == UnroutableGroup {
		return fmt.Errorf("%w: %q is reserved for unroutable messages", messaging.ErrInvalidName, group)
	}
	return messaging.ValidatePatterns(patterns)
}

// bind adds group's bindings to patterns.
func bind(db *gorm.DB, group string, patterns []string) error {
	if len(patterns) == 0 {
		return nil
	}
	args := make([]any, 0, 2*len(patterns))
	for _, p := range patterns {
		args = append(args, group, p)
	}
	err := db.Exec(`INSERT INTO dbbus_bindings (group_name, pattern) VALUES `+
		dialect.Tuples(len(patterns), 2)+` ON CONFLICT DO NOTHING`, args...).Error
	if err != nil {
		return wrapDB("bind", err)
	}
	return nil
}

// partitionQueueOf splits a partition queue name, "<group>.p<k>", into its
// group and partition; ok is false for a name of another shape.
func partitionQueueOf(queue string) (group string, p int, ok bool) {
	i := strings.LastIndex(queue, ".p")
	if i <= 0 {
		return "", 0, false
	}
	p, err := strconv.Atoi(queue[i+2:])
	if err != nil || p < 0 || messaging.PartitionQueue(queue[:i], p) != queue {
		return "", 0, false
	}
	return queue[:i], p, true
}
