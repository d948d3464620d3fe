package dbbus

import (
	"context"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/messaging"
)

// maintainBatch is how many deliveries one statement of [PurgeUnroutable]
// or [DeleteGroup] removes, each batch in a transaction of its own.
const maintainBatch = 500

// QueueStats counts the deliveries of a queue, or of every partition queue
// of a partitioned group.
type QueueStats struct {
	// Ready is how many deliveries wait for a subscriber.
	Ready int
	// Leased is how many are leased to a subscriber and not yet acked.
	Leased int
	// Queues names the queues counted: the queue asked for, or the
	// partition queues of a partitioned group.
	Queues []string
}

// Stats counts the ready and leased deliveries of queue: a group declared
// with [DeclareGroup] (such as a dead-letter queue), a partitioned group
// declared with [DeclarePartitions] (the sum over its partition queues),
// one of its partition queues, or [UnroutableGroup]. Each count reads one
// of the partial indexes dbbus_deliveries_ready and dbbus_deliveries_leased.
//
// Errors: messaging.ErrQueueNotFound for a queue never declared.
func Stats(ctx context.Context, db *gorm.DB, queue string) (QueueStats, error) {
	db = db.WithContext(ctx)
	queues := []string{queue}
	n, err := partitionsOf(db, queue)
	if err != nil {
		return QueueStats{}, err
	}
	if n > 0 {
		queues = partitionQueues(queue, n)
	} else if err := requireGroup(ctx, db, queue); err != nil {
		return QueueStats{}, err
	}
	st := QueueStats{Queues: queues}
	for _, q := range queues {
		var ready, leased int64
		if err := db.Raw(`SELECT count(*) FROM dbbus_deliveries WHERE group_name = ? AND lease_token IS NULL`, q).
			Scan(&ready).Error; err != nil {
			return QueueStats{}, wrapDB("stats", err)
		}
		if err := db.Raw(`SELECT count(*) FROM dbbus_deliveries WHERE group_name = ? AND lease_token IS NOT NULL`, q).
			Scan(&leased).Error; err != nil {
			return QueueStats{}, wrapDB("stats", err)
		}
		st.Ready += int(ready)
		st.Leased += int(leased)
	}
	return st, nil
}

// partitionQueues names the n partition queues of group.
func partitionQueues(group string, n int) []string {
	qs := make([]string, n)
	for p := range qs {
		qs[p] = messaging.PartitionQueue(group, p)
	}
	return qs
}

// olderThanSQL is the condition, per dialect, that a body m was published
// more than @ms milliseconds ago by the database's clock.
func olderThanSQL(d dialect.Dialect) string {
	if d == dialect.Postgres {
		return `m.created_at < now() - @ms * interval '1 millisecond'`
	}
	// SQLite's CURRENT_TIMESTAMP is 'YYYY-MM-DD HH:MM:SS' in UTC.
	return `m.created_at < datetime('now', '-' || (@ms / 1000.0) || ' seconds')`
}

// purgeUnroutableSQL is the statement of one batch of [PurgeUnroutable]
// with an age, per dialect: it deletes those of the ready deliveries @ids
// (read in id order through dbbus_deliveries_ready) whose body was
// published more than @ms milliseconds ago, and returns their message ids
// and topics.
func purgeUnroutableSQL(d dialect.Dialect) string {
	return `DELETE FROM dbbus_deliveries WHERE group_name = @group AND id IN @ids AND lease_token IS NULL
AND EXISTS (SELECT 1 FROM dbbus_messages AS m
	WHERE m.id = dbbus_deliveries.message_id AND m.topic = dbbus_deliveries.topic AND ` + olderThanSQL(d) + `)
RETURNING message_id, topic`
}

// PurgeUnroutable deletes the messages kept in [UnroutableGroup] (those no
// group was bound to when they were published) that were published more
// than olderThan ago by the database's clock, or all of them when
// olderThan is zero or negative, with their bodies unless another group
// still holds a delivery of the same message. It returns how many it
// deleted.
//
// It walks the group's ready deliveries in id order, that is publish
// order, through the index dbbus_deliveries_ready, maintainBatch at a time,
// each batch in its own short transaction, and stops at the first batch
// holding a message younger than olderThan: it reads only what it deletes,
// however many rows the table holds. A delivery a subscriber of the group
// holds leased is left alone.
func PurgeUnroutable(ctx context.Context, db *gorm.DB, olderThan time.Duration) (int, error) {
	d, err := dialect.Of(db)
	if err != nil {
		return 0, fmt.Errorf("dbbus: purge unroutable: %w", err)
	}
	db = db.WithContext(ctx)
	total := 0
	var after int64
	for {
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("dbbus: purge unroutable: %w", err)
		}
		var rows []struct {
			ID        int64
			MessageID string
			Topic     string
		}
		if err := db.Raw(peekDeliveries, map[string]any{"group": UnroutableGroup, "after": after, "limit": maintainBatch}).
			Scan(&rows).Error; err != nil {
			return total, wrapDB("purge unroutable", err)
		}
		if len(rows) == 0 {
			return total, nil
		}
		ids := make([]int64, len(rows))
		keys := make([]messageKey, len(rows))
		for i, r := range rows {
			ids[i], keys[i] = r.ID, messageKey{r.MessageID, r.Topic}
		}
		after = ids[len(ids)-1]
		var gone []messageKey
		err := db.Transaction(func(tx *gorm.DB) error {
			if err := lockMessages(tx, d, keys); err != nil {
				return err
			}
			args := map[string]any{"group": UnroutableGroup, "ids": ids, "ms": olderThan.Milliseconds()}
			q := tx.Raw(purgeAllSQL, args)
			if olderThan > 0 {
				q = tx.Raw(purgeUnroutableSQL(d), args)
			}
			var err error
			if gone, err = scanKeys(q); err != nil {
				return err
			}
			if len(gone) == 0 {
				return nil
			}
			return deleteOrphans(tx, d, gone)
		})
		if err != nil {
			return total, wrapDB("purge unroutable", err)
		}
		total += len(gone)
		if olderThan > 0 && len(gone) < len(ids) {
			// A message of this batch is younger than olderThan: the
			// ones after it, published later, are too.
			return total, nil
		}
	}
}

// purgeAllSQL deletes the ready deliveries @ids of @group and returns
// their message ids and topics.
const purgeAllSQL = `DELETE FROM dbbus_deliveries WHERE group_name = @group AND id IN @ids AND lease_token IS NULL
RETURNING message_id, topic`

// pickQueueSQL reads the ids, message ids and topics of up to @limit deliveries of @group, ready
// (the statement with "IS NULL") or leased ("IS NOT NULL"), through the
// partial index of their state, in that index's order.
func pickQueueSQL(state string) string {
	order := "id"
	if state == "IS NOT NULL" {
		order = "leased_until"
	}
	return `SELECT id, message_id, topic FROM dbbus_deliveries WHERE group_name = @group AND lease_token ` + state +
		` ORDER BY ` + order + ` LIMIT @limit`
}

// deleteIDsSQL deletes the deliveries @ids of @group, whatever their
// state, and returns their message ids and topics.
const deleteIDsSQL = `DELETE FROM dbbus_deliveries WHERE group_name = @group AND id IN @ids RETURNING message_id, topic`

// Deleted is what [DeleteGroup] removed.
type Deleted struct {
	// Queues names the queues whose deliveries, bindings and owners were
	// removed: the group, or its partition queues.
	Queues []string
	// Messages is how many deliveries were removed, ready or leased.
	Messages int
}

// DeleteGroup retires consumer group: it removes its bindings, so that no
// message published after it returns is copied to it, its partition count
// and queue owners when it is partitioned, and every delivery it holds,
// ready or leased, with the bodies no other group still references. A
// subscriber of the group that still runs loses its leases (its acks fail
// with [ErrLeaseLost]) and receives nothing more: stop the group's
// consumers first. It removes one group: a consumer group's dead-letter
// queue is a group of its own (package consumer's Delete removes both).
// Deleting a group that does not exist removes nothing and is no error.
//
// The bindings, partitions and owners go in one transaction; the
// deliveries then in batches of maintainBatch, each in its own
// transaction, read through dbbus_deliveries_ready and
// dbbus_deliveries_leased.
//
// Errors: messaging.ErrInvalidName for a bad group name or for
// [UnroutableGroup] (purge it with [PurgeUnroutable]).
func DeleteGroup(ctx context.Context, db *gorm.DB, group string) (Deleted, error) {
	if err := messaging.ValidateGroup(group); err != nil {
		return Deleted{}, fmt.Errorf("dbbus: delete group: %w", err)
	}
	if group == UnroutableGroup {
		return Deleted{}, fmt.Errorf("dbbus: delete group: %w: %q is reserved", messaging.ErrInvalidName, group)
	}
	d, err := dialect.Of(db)
	if err != nil {
		return Deleted{}, fmt.Errorf("dbbus: delete group: %w", err)
	}
	db = db.WithContext(ctx)
	var del Deleted
	err = db.Transaction(func(tx *gorm.DB) error {
		n, err := partitionsOf(tx, group)
		if err != nil {
			return err
		}
		del.Queues = []string{group}
		if n > 0 {
			del.Queues = partitionQueues(group, n)
		}
		for _, stmt := range []string{
			`DELETE FROM dbbus_bindings WHERE group_name = ?`,
			`DELETE FROM dbbus_partitions WHERE group_name = ?`,
		} {
			if err := tx.Exec(stmt, group).Error; err != nil {
				return err
			}
		}
		return tx.Exec(`DELETE FROM dbbus_queue_owners WHERE queue IN ?`, del.Queues).Error
	})
	if err != nil {
		return del, wrapDB("delete group", err)
	}
	for _, q := range del.Queues {
		for _, state := range []string{"IS NULL", "IS NOT NULL"} {
			for {
				if err := ctx.Err(); err != nil {
					return del, fmt.Errorf("dbbus: delete group: %w", err)
				}
				var rows []struct {
					ID        int64
					MessageID string
					Topic     string
				}
				if err := db.Raw(pickQueueSQL(state), map[string]any{"group": q, "limit": maintainBatch}).
					Scan(&rows).Error; err != nil {
					return del, wrapDB("delete group", err)
				}
				if len(rows) == 0 {
					break
				}
				ids := make([]int64, len(rows))
				keys := make([]messageKey, len(rows))
				for i, r := range rows {
					ids[i], keys[i] = r.ID, messageKey{r.MessageID, r.Topic}
				}
				var gone []messageKey
				err := db.Transaction(func(tx *gorm.DB) error {
					if err := lockMessages(tx, d, keys); err != nil {
						return err
					}
					var err error
					if gone, err = scanKeys(tx.Raw(deleteIDsSQL, map[string]any{"group": q, "ids": ids})); err != nil {
						return err
					}
					if len(gone) == 0 {
						return nil
					}
					return deleteOrphans(tx, d, gone)
				})
				if err != nil {
					return del, wrapDB("delete group", err)
				}
				del.Messages += len(gone)
				if len(rows) < maintainBatch {
					break
				}
			}
		}
	}
	return del, nil
}

// lockMessages locks, on PostgreSQL, the body rows keys names, in key
// order, as an ack does: a delete of deliveries that then
// deletes the bodies no delivery references takes turns with an ack of
// another group's delivery of the same message, so the last of them sees
// the other's delete and deletes the body (none is left behind).
func lockMessages(tx *gorm.DB, d dialect.Dialect, keys []messageKey) error {
	s := statementsFor(d)
	if s.lockBodies == "" {
		return nil
	}
	keys = slices.Clone(keys)
	slices.SortFunc(keys, compareKeys)
	keys = slices.Compact(keys)
	var locked []string
	return tx.Raw(s.lockBodies, s.keys(keys)...).Scan(&locked).Error
}

// scanKeys runs q, a statement returning message_id and topic, and returns
// the keys it names.
func scanKeys(q *gorm.DB) ([]messageKey, error) {
	var rows []struct {
		MessageID string
		Topic     string
	}
	if err := q.Scan(&rows).Error; err != nil {
		return nil, err
	}
	keys := make([]messageKey, len(rows))
	for i, r := range rows {
		keys[i] = messageKey{r.MessageID, r.Topic}
	}
	return keys, nil
}
