package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// DeadLetterTap is the queue that receives a copy of every dead letter of
// group, "<group>.dead.tap", beside DeadLetterQueue(group): NewAMQP
// declares it for a partitioned group on quorum queues, whose partition
// queues' delivery limit lets the broker dead-letter a message itself.
// Each instance reads it (see Consumer.Run), so that such a dead letter
// is logged and holds its aggregate back like one the consumer made. It
// keeps at most rabbitmq.TapMaxLength copies, and the broker deletes it
// after rabbitmq.TapExpiry without an instance.
func DeadLetterTap(group string) string { return DeadLetterQueue(group) + ".tap" }

// tapTimeout bounds one reading of the tap queue.
const tapTimeout = 5 * time.Second

// readTap reads the copies of the group's dead letters waiting in its tap
// queue (see DeadLetterTap): a no-op without one. An instance reads it
// before it subscribes to a partition, so that a message the broker
// dead-lettered when the partition's last owner gave it back holds its
// aggregate before the aggregate's later events are delivered, and at
// every sweep.
func (c *Consumer) readTap(ctx context.Context) {
	if c.tap == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, tapTimeout)
	defer cancel()
	if _, err := c.tap.Drain(ctx, c.tapped); err != nil && context.Cause(ctx) != context.Canceled {
		c.cfg.Logger.Warn("consumer: cannot read the copies of the group's dead letters; trying again at the next sweep",
			"group", c.cfg.Group, "queue", DeadLetterTap(c.cfg.Group), "err", err)
	}
}

// tapped handles the copy of a dead letter: one the consumer made was
// logged when it was made; one the broker made past a partition queue's
// delivery limit holds its aggregate back (unless Config.DisableHoldBack)
// and is logged. An error keeps the copy, to be read again.
func (c *Consumer) tapped(msg *message.Message) error {
	if msg.Metadata.Get(MetaDeadCause) != "" {
		return nil
	}
	if !c.cfg.DisableHoldBack {
		if err := c.inbox.Hold(msg.Context(), msg); err != nil {
			return err
		}
	}
	d := deadLetterOf(msg)
	c.logDead(msg, d.Cause, d.Attempts, errors.New(d.Error), deadByBroker)
	return nil
}
