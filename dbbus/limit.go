package dbbus

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/wire"
	"github.com/bentoevents/bento/messaging"
)

// DeliveryLimit returns how many failed attempts a delivery may have and
// still be handed out (Config.DeliveryLimit with its default), negative
// when the bus has no limit. The consumer runtime on the bus
// (consumer.NewDatabase) dead-letters a message itself, holding its
// aggregate back, before the bus would.
func (b *Bus) DeliveryLimit() int { return b.cfg.DeliveryLimit }

// pastLimit reports whether a delivery claimed with attempts failed
// attempts is past the bus's delivery limit.
func (b *Bus) pastLimit(attempts int) bool {
	return b.cfg.DeliveryLimit >= 0 && attempts > b.cfg.DeliveryLimit
}

// setDeliveryCount tells the consumer of msg how many times it was
// delivered to its queue before: messaging.MetaDeliveryCount and
// messaging.MetaRedelivered when attempts is not zero, neither otherwise
// (a producer's or a dead letter's copy of them means nothing here).
func setDeliveryCount(msg *message.Message, attempts int) {
	if attempts > 0 {
		msg.Metadata.Set(messaging.MetaRedelivered, "true")
		msg.Metadata.Set(messaging.MetaDeliveryCount, strconv.Itoa(attempts))
		return
	}
	delete(msg.Metadata, messaging.MetaRedelivered)
	delete(msg.Metadata, messaging.MetaDeliveryCount)
}

// groupOfQueue returns the group whose dead letters a delivery of queue
// joins: the partitioned group of a partition queue, else queue itself.
func groupOfQueue(db *gorm.DB, queue string) (string, error) {
	if g, p, ok := partitionQueueOf(queue); ok {
		n, err := partitionsOf(db, g)
		if err != nil {
			return "", err
		}
		if p < n {
			return g, nil
		}
	}
	return queue, nil
}

// deadLetter moves the deliveries of queue in doomed, claimed under token
// past the delivery limit, to the dead letters of its group in one
// transaction: their deliveries are deleted (while token still holds
// them), their messages published on wire.DeadLetterTopic(group) with the
// dead-letter metadata, and their bodies deleted once no delivery
// references them. When it fails the deliveries are given back, to be
// claimed (and dead-lettered) again.
func (b *Bus) deadLetter(ctx context.Context, queue, token string, doomed []claimed) {
	ctx, done := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer done()
	ids := make([]int64, len(doomed))
	keys := make([]messageKey, len(doomed))
	for i, c := range doomed {
		ids[i], keys[i] = c.lease.Delivery, messageKey{c.lease.MessageID, c.lease.Topic}
	}
	var group string
	var gone []int64
	var queues []string // the dead letters went to
	err := b.write(func() error {
		return b.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			var err error
			if group, err = groupOfQueue(tx, queue); err != nil {
				return err
			}
			if err := lockMessages(tx, b.d, keys); err != nil {
				return wrapDB("dead-letter: lock messages", err)
			}
			if err := tx.Raw(deleteDeliveries, ids, token).Scan(&gone).Error; err != nil {
				return wrapDB("dead-letter", err)
			}
			now := time.Now().UTC().Format(time.RFC3339Nano)
			var dead []*message.Message
			for _, c := range doomed {
				if !containsID(gone, c.lease.Delivery) {
					continue
				}
				m := message.NewMessage(c.msg.UUID, c.msg.Payload)
				m.Metadata = maps.Clone(c.msg.Metadata)
				delete(m.Metadata, messaging.MetaRedelivered)
				delete(m.Metadata, messaging.MetaDeliveryCount)
				m.Metadata.Set(wire.DeadCause, wire.CausePoison)
				m.Metadata.Set(wire.DeadReason, fmt.Sprintf(
					"dbbus: %d deliveries to %s failed (nacked, or their subscriber died), more than the bus's delivery limit of %d",
					c.lease.Attempts, queue, b.cfg.DeliveryLimit))
				m.Metadata.Set(wire.DeadAt, now)
				m.Metadata.Set(wire.DeadAttempts, strconv.Itoa(c.lease.Attempts))
				dead = append(dead, m)
			}
			if len(dead) == 0 {
				return nil
			}
			if queues, err = b.publishTx(tx, wire.DeadLetterTopic(group), dead); err != nil {
				return err
			}
			if err := deleteOrphans(tx, b.d, keys); err != nil {
				return wrapDB("dead-letter: delete messages", err)
			}
			return nil
		})
	})
	if err != nil {
		b.log.Warn("dbbus: dead-lettering deliveries past the delivery limit failed; giving them back", "queue", queue, "err", err)
		_ = b.write(func() error { return release(ctx, b.db, token, ids) })
		return
	}
	for _, c := range doomed {
		if containsID(gone, c.lease.Delivery) {
			b.log.Warn("dbbus: dead-lettered a delivery past the delivery limit", "queue", queue, "group", group,
				"message", c.lease.MessageID, "attempts", c.lease.Attempts, "delivery_limit", b.cfg.DeliveryLimit)
		}
	}
	b.wakeLocal(queues)
}

// containsID reports whether ids holds id.
func containsID(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
