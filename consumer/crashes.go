package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// ErrCrashed is the failure of a message dead-lettered as poison (the
// cause CausePoison): the processes handling it kept dying before they
// could finish (see Config.MaxCrashes), or the broker delivered it again
// so often that the next give-back would have it dead-lettered without
// its aggregate held (see Config.DeliveryLimit).
var ErrCrashed = errors.New("consumer: its attempts kept dying with their process")

// crashLedger counts, per message, the attempts whose process died before
// they finished, in inbox_attempts. Only messages delivered again are
// written down, so the first delivery costs nothing: an attempt is
// recorded as running before its handler runs, and settled (deleted, or
// marked not running) when it returns, whatever its result; an attempt
// still marked running when its message arrives again died with its
// process. A message a dead process merely held, never started, is
// never counted; neither is one given back by a move, a lost link or a
// shutdown, since its attempt returned.
type crashLedger struct {
	db    *gorm.DB
	group string
	// lane lets one suspect (a message whose attempts died before) run at
	// a time in this process, so that a crash is blamed on one suspect at
	// most, never on the healthy messages of other partitions.
	lane chan struct{}
}

func newCrashLedger(db *gorm.DB, group string) *crashLedger {
	return &crashLedger{db: db, group: group, lane: make(chan struct{}, 1)}
}

// account turns the attempts at ids that are still marked running (their
// process died) into crashes and returns the crash counts of ids that
// have any.
func (l *crashLedger) account(ctx context.Context, ids []string) (map[string]int, error) {
	db := l.db.WithContext(ctx)
	if err := db.Exec(`UPDATE inbox_attempts SET crashes = crashes + 1, running = 0
WHERE consumer = ? AND message_id IN ? AND running = 1`, l.group, ids).Error; err != nil {
		return nil, fmt.Errorf("consumer: count crashed attempts: %w", err)
	}
	var rows []struct {
		MessageID string
		Crashes   int
	}
	if err := db.Raw(`SELECT message_id, crashes FROM inbox_attempts
WHERE consumer = ? AND message_id IN ? AND crashes > 0`, l.group, ids).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("consumer: read crashed attempts: %w", err)
	}
	out := make(map[string]int, len(rows))
	for _, r := range rows {
		out[r.MessageID] = r.Crashes
	}
	return out, nil
}

// start records that attempts at ids begin.
func (l *crashLedger) start(ctx context.Context, ids []string) error {
	args := make([]any, 0, 5*len(ids))
	now := time.Now().UTC()
	for _, id := range ids {
		args = append(args, l.group, id, 1, 0, now)
	}
	q := `INSERT INTO inbox_attempts (consumer, message_id, running, crashes, updated_at) VALUES ` +
		dialect.Tuples(len(ids), 5) + ` ON CONFLICT (consumer, message_id) DO UPDATE SET running = 1, updated_at = excluded.updated_at`
	if err := l.db.WithContext(ctx).Exec(q, args...).Error; err != nil {
		return fmt.Errorf("consumer: record attempts: %w", err)
	}
	return nil
}

// settle records that the attempts at done (applied, skipped or
// dead-lettered) and at kept (failed, or given back, to be tried again)
// returned. It runs even when ctx has ended, for a few seconds.
func (l *crashLedger) settle(ctx context.Context, done, kept []string) {
	if l == nil { // crash counting is off
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	db := l.db.WithContext(ctx)
	if len(done) > 0 {
		_ = db.Exec(`DELETE FROM inbox_attempts WHERE consumer = ? AND message_id IN ?`, l.group, done).Error
	}
	if len(kept) > 0 {
		_ = db.Exec(`UPDATE inbox_attempts SET running = 0 WHERE consumer = ? AND message_id IN ?`, l.group, kept).Error
	}
	// A failure leaves a row marked running: the message's next delivery
	// counts one crash too many, which MaxCrashes leaves room for.
}

// deliveryCount returns how many times the bus delivered msg before: a
// quorum queue's x-delivery-count header, or the database bus's
// messaging.MetaDeliveryCount, 0 without either.
func deliveryCount(msg *message.Message) int {
	if v := msg.Metadata.Get(messaging.MetaDeliveryCount); v != "" {
		n, _ := strconv.Atoi(v)
		return n
	}
	n, _ := strconv.Atoi(msg.Metadata.Get(rabbitmq.HeaderDeliveryCount))
	return n
}

// redelivered reports whether msg was delivered before, as its bus says
// (messaging.MetaRedelivered, or a delivery count: a quorum queue's, the
// database bus's).
func redelivered(msg *message.Message) bool {
	if putBack == "dbbus-crashes" { // a constant "" outside bento_putback builds: compiled away
		if _, ok := dbbus.LeaseOf(msg); ok {
			return false // the bug put back: the database bus's marks ignored
		}
	}
	return msg.Metadata.Get(messaging.MetaRedelivered) == "true" || deliveryCount(msg) > 0
}

// redeliveredIDs returns the ids of the messages of msgs delivered before.
func redeliveredIDs(msgs []*message.Message) []string {
	var ids []string
	for _, m := range msgs {
		if redelivered(m) {
			ids = append(ids, m.UUID)
		}
	}
	return ids
}

// limitMargin is how many deliveries below the broker's delivery limit a
// message is dead-lettered by the consumer, which holds its aggregate
// first: room for give-backs of it that came before the consumer saw it.
const limitMargin = 2

// nearLimit reports whether the broker would dead-letter msg, without a
// hold, within limitMargin more give-backs.
func (c *Consumer) nearLimit(msg *message.Message) bool {
	return c.limited && deliveryCount(msg) >= max(c.cfg.DeliveryLimit-limitMargin, 1)
}

// doomed reports whether msg, delivered again after crashes crashed
// attempts, must be dead-lettered as poison now: its attempts died
// MaxCrashes times, or it is near the broker's delivery limit.
func (c *Consumer) doomed(msg *message.Message, crashes int) bool {
	return (c.cfg.MaxCrashes > 0 && crashes >= c.cfg.MaxCrashes) || c.nearLimit(msg)
}

// watchLimit forwards a partition's messages as they arrive, and holds
// back at once the aggregate of one that is near the broker's delivery
// limit (see nearLimit), before it waits behind others: were the process
// to die before the message is handled, the broker could dead-letter it,
// and the hold keeps its aggregate's later events from overtaking it. The
// message is dead-lettered as poison when its turn comes (see guard).
// Without hold-back or a delivery limit it returns msgs.
func (c *Consumer) watchLimit(ctx context.Context, msgs <-chan *message.Message) <-chan *message.Message {
	if c.cfg.DisableHoldBack || c.cfg.Partitions <= 0 || !c.limited {
		return msgs
	}
	out := make(chan *message.Message, c.cfg.BatchSize) // a subscription holds at most that many
	go func() {
		defer close(out)
		for msg := range msgs {
			if c.nearLimit(msg) {
				if err := c.inbox.Hold(ctx, msg); err != nil {
					c.cfg.Logger.Warn("consumer: cannot hold back the aggregate of a message near the delivery limit",
						"group", c.cfg.Group, "message_id", msg.UUID, "err", err)
				}
			}
			select {
			case out <- msg:
			case <-ctx.Done():
				msg.Nack()
				for m := range msgs {
					m.Nack()
				}
				return
			}
		}
	}()
	return out
}

// guard is the middleware that keeps a message that kills its process
// from doing so forever, and that alone: see crashLedger. A message
// delivered for the first time goes straight through. One delivered again
// is dead-lettered as poison, with the cause CausePoison, when doomed
// says so (its aggregate held first, like any dead letter's); one whose
// attempts died before runs only when no other such message of the group
// runs in this process. With crash counting off (MaxCrashes negative) the
// delivery limit alone dooms a message: the broker must never be the one
// to dead-letter it, since it would hold nothing.
func (c *Consumer) guard(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if !redelivered(msg) {
			return h(msg)
		}
		ctx := msg.Context()
		if c.crashes == nil {
			if c.nearLimit(msg) {
				return c.crashed(ctx, msg, 0)
			}
			return h(msg)
		}
		ids := []string{msg.UUID}
		crashes, err := c.crashes.account(ctx, ids)
		if err != nil {
			c.cfg.Logger.Warn("consumer: cannot read the crashed attempts of a message; handling it", "group", c.cfg.Group,
				"message_id", msg.UUID, "err", err)
		}
		n := crashes[msg.UUID]
		if c.doomed(msg, n) {
			return c.crashed(ctx, msg, n)
		}
		if n > 0 {
			select {
			case c.crashes.lane <- struct{}{}:
				defer func() { <-c.crashes.lane }()
			case <-ctx.Done():
				return nil, fmt.Errorf("consumer: stopped waiting to retry a crashed message: %w", context.Canceled)
			}
			c.cfg.Logger.Warn("consumer: retrying a message whose attempts died with their process", "group", c.cfg.Group,
				"message_id", msg.UUID, "crashes", n, "max_crashes", c.cfg.MaxCrashes)
		}
		if err := c.crashes.start(ctx, ids); err != nil {
			c.cfg.Logger.Warn("consumer: cannot record an attempt; handling the message", "group", c.cfg.Group,
				"message_id", msg.UUID, "err", err)
		}
		out, err := h(msg)
		if err == nil || msg.Metadata.Get(MetaDeadCause) != "" {
			c.crashes.settle(ctx, ids, nil)
		} else {
			c.crashes.settle(ctx, nil, ids)
		}
		return out, err
	}
}

// crashed dead-letters msg as poison after crashes crashed attempts,
// holding its aggregate back first, unless it was applied before its
// last process died: then it lifts the hold watchLimit may have put
// behind it.
func (c *Consumer) crashed(ctx context.Context, msg *message.Message, crashes int) ([]*message.Message, error) {
	ids := []string{msg.UUID}
	if done, err := c.inbox.Processed(ctx, msg.UUID); err == nil && done {
		c.unhold(ctx, msg)
		c.crashes.settle(ctx, ids, nil)
		return nil, nil // applied: its process died before the ack
	}
	if !c.cfg.DisableHoldBack && c.cfg.Partitions > 0 {
		if err := c.inbox.Hold(ctx, msg); err != nil {
			return nil, fmt.Errorf("consumer: cannot hold the aggregate of a poison message back; giving it back: %w (%w)",
				context.Canceled, err)
		}
	}
	err := fmt.Errorf("%w: %d attempts died, %d deliveries (MaxCrashes %d, DeliveryLimit %d)",
		ErrCrashed, crashes, deliveryCount(msg), c.cfg.MaxCrashes, c.cfg.DeliveryLimit)
	c.markDead(msg, CausePoison, crashes, err)
	c.crashes.settle(ctx, ids, nil)
	return nil, err
}
