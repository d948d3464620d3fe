package consumer

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/messaging"
)

// DeleteDatabase is Delete on the database bus of db (see NewDatabase):
// it retires the consumer group group and its dead-letter queue
// DeadLetterQueue(group) with dbbus.DeleteGroup, removing their bindings
// (so the group stops collecting copies of new events), partitions, queue
// owners and every delivery they hold. Stop the group's consumers first.
// It refuses with ErrDeadLettersLeft while the dead-letter queue holds
// dead letters, unless opts.Force; opts.DryRun counts what would go and
// deletes nothing; opts.Topology has no meaning on the database bus (the
// unroutable group is purged with dbbus.PurgeUnroutable) and is refused
// with ErrInvalidConfig.
func DeleteDatabase(ctx context.Context, db *gorm.DB, group string, opts *DeleteOpts) (dbbus.Deleted, error) {
	var o DeleteOpts
	if opts != nil {
		o = *opts
	}
	if o.Topology {
		return dbbus.Deleted{}, fmt.Errorf("%w: delete: Topology is RabbitMQ's (the database bus has no exchange)", ErrInvalidConfig)
	}
	if err := messaging.ValidateGroup(group); err != nil {
		return dbbus.Deleted{}, fmt.Errorf("consumer: delete: %w", err)
	}
	queues := []string{group, DeadLetterQueue(group)}
	if o.DryRun || !o.Force {
		var found dbbus.Deleted
		for _, q := range queues {
			st, err := dbbus.Stats(ctx, db, q)
			if errors.Is(err, messaging.ErrQueueNotFound) {
				continue
			}
			if err != nil {
				return dbbus.Deleted{}, fmt.Errorf("consumer: delete %s: %w", group, err)
			}
			if q == DeadLetterQueue(group) && st.Ready+st.Leased > 0 && !o.Force {
				return dbbus.Deleted{}, fmt.Errorf("%w: %d in %s (replay or discard them, or force)", ErrDeadLettersLeft, st.Ready+st.Leased, q)
			}
			found.Queues = append(found.Queues, st.Queues...)
			found.Messages += st.Ready + st.Leased
		}
		if o.DryRun {
			return found, nil
		}
	}
	var all dbbus.Deleted
	for _, q := range queues {
		d, err := dbbus.DeleteGroup(ctx, db, q)
		all.Queues = append(all.Queues, d.Queues...)
		all.Messages += d.Messages
		if err != nil {
			return all, fmt.Errorf("consumer: delete: %w", err)
		}
	}
	return all, nil
}
