package dbbus

import (
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/messaging"
)

// publishChunk is how many messages one INSERT writes, and maxDeliveryRows
// how many delivery rows (far below PostgreSQL's 65,535 parameters).
const (
	publishChunk    = 200
	maxDeliveryRows = 10000
)

// Publish implements message.Publisher: in one transaction of its own, it
// writes each message's body and one delivery row per group whose binding
// matches topic (a delivery in [UnroutableGroup] when none does), and on
// PostgreSQL notifies [NotifyChannel] with the queues it delivered to,
// waking their subscriptions in every process. A message whose UUID the bus
// still holds on topic (a delivery of it is not acked yet) is skipped:
// publishing it again, as a relay does after a crash, delivers it once.
// The same UUID on another topic, such as a dead letter that keeps its
// message's UUID, is a message of its own. The statement context is the
// first message's.
//
// Errors: messaging.ErrInvalidName for a bad topic, ErrClosed after Close,
// wrapped database errors.
func (b *Bus) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ctx := msgs[0].Context()
	var queues []string
	err := b.use(func() error {
		return b.write(func() error {
			return b.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				var err error
				queues, err = b.publishTx(tx, topic, msgs)
				return err
			})
		})
	})
	if err == nil {
		b.wakeLocal(queues) // after the commit, so that the claims it triggers find them
	}
	return err
}

// PublishTx is Publish inside the caller's transaction tx: the messages are
// published if, and only if, tx commits, and PublishTx never commits or
// rolls back. It is what makes a hop exactly once: a relay or handler that
// consumes from one place and publishes to the bus in the same database
// transaction (marking its input done in tx) publishes each input once.
// On PostgreSQL the subscriptions of the messages' queues are woken when tx
// commits, by its notification; on SQLite (or with Config.NoListen) the
// in-process wake-up is sent before tx commits, so a subscriber may find
// the messages only at its next poll.
//
// Errors: as Publish.
func (b *Bus) PublishTx(tx *gorm.DB, topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	var queues []string
	err := b.use(func() error {
		var err error
		queues, err = b.publishTx(tx, topic, msgs)
		return err
	})
	if err == nil {
		b.wakeLocal(queues)
	}
	return err
}

// use runs fn unless the bus is closed.
func (b *Bus) use(fn func() error) error { return b.mu.Use(ErrClosed, fn) }

// publishTx writes msgs in tx and returns the queues they went to, which
// the caller wakes (wakeLocal) once tx commits; on PostgreSQL tx notifies
// them.
func (b *Bus) publishTx(tx *gorm.DB, topic string, msgs []*message.Message) ([]string, error) {
	if err := messaging.ValidateTopic(topic); err != nil {
		return nil, fmt.Errorf("dbbus: publish: %w", err)
	}
	groups, err := b.routes(tx, topic)
	if err != nil {
		return nil, err
	}
	for start := 0; start < len(msgs); start += publishChunk {
		if err := b.insert(tx, topic, groups, msgs[start:min(start+publishChunk, len(msgs))]); err != nil {
			return nil, err
		}
	}
	// A message kept in UnroutableGroup wakes that group's subscribers
	// alone, as any queue's.
	queues := queuesOf(groups, msgs)
	if err := notify(tx, b.d, "publish", queues); err != nil {
		return nil, err
	}
	return queues, nil
}

// route is a group a topic is bound to, with its partition count (0: not
// partitioned).
type route struct {
	group      string
	partitions int
}

// queue returns the queue of r that msg goes to.
func (r route) queue(msg *message.Message) string {
	if r.partitions == 0 {
		return r.group
	}
	return messaging.PartitionQueue(r.group, messaging.PartitionOf(messaging.PartitionKey(msg), r.partitions))
}

// routes returns the groups bound to topic, or [UnroutableGroup] alone.
func (b *Bus) routes(tx *gorm.DB, topic string) ([]route, error) {
	bindings, err := readBindings(tx)
	if err != nil {
		return nil, wrapDB("publish: read bindings", err)
	}
	return bindings.routes(topic), nil
}

// bindings are the rows of dbbus_bindings with their groups' partition
// counts, by group name.
type bindings []struct {
	GroupName  string
	Pattern    string
	Partitions int
}

// readBindings reads every binding, ordered by group.
func readBindings(tx *gorm.DB) (bindings, error) {
	var bs bindings
	err := tx.Raw(`SELECT b.group_name, b.pattern, coalesce(p.partitions, 0) AS partitions
FROM dbbus_bindings AS b LEFT JOIN dbbus_partitions AS p ON p.group_name = b.group_name
ORDER BY b.group_name`).Scan(&bs).Error
	return bs, err
}

// routes returns the groups bound to topic, or [UnroutableGroup] alone.
func (bs bindings) routes(topic string) []route {
	var routes []route
	for _, bd := range bs {
		if len(routes) > 0 && routes[len(routes)-1].group == bd.GroupName {
			continue
		}
		if messaging.MatchTopic(bd.Pattern, topic) {
			routes = append(routes, route{group: bd.GroupName, partitions: bd.Partitions})
		}
	}
	if len(routes) == 0 {
		routes = []route{{group: UnroutableGroup}}
	}
	return routes
}

// insert writes the bodies of msgs and, for those not held already, their
// deliveries to groups (to one partition queue of a partitioned group), in
// message order.
func (b *Bus) insert(tx *gorm.DB, topic string, groups []route, msgs []*message.Message) error {
	args := make([]any, 0, 4*len(msgs))
	for _, m := range msgs {
		md, err := json.Marshal(map[string]string(m.Metadata))
		if err != nil {
			return fmt.Errorf("dbbus: publish: metadata of %s: %w", m.UUID, err)
		}
		payload := []byte(m.Payload)
		if payload == nil {
			payload = []byte{}
		}
		args = append(args, m.UUID, topic, string(md), payload)
	}
	var fresh []string
	if err := tx.Raw(`INSERT INTO dbbus_messages (id, topic, metadata, payload) VALUES `+
		dialect.Tuples(len(msgs), 4)+` ON CONFLICT (id, topic) DO NOTHING RETURNING id`, args...).
		Scan(&fresh).Error; err != nil {
		return wrapDB("publish: insert messages", err)
	}
	if len(fresh) == 0 {
		return nil
	}
	isFresh := make(map[string]bool, len(fresh))
	for _, id := range fresh {
		isFresh[id] = true
	}
	args = args[:0]
	for _, m := range msgs {
		if !isFresh[m.UUID] {
			continue
		}
		delete(isFresh, m.UUID) // a UUID twice in one call is published once
		for _, g := range groups {
			args = append(args, g.queue(m), m.UUID, topic)
		}
	}
	// In message order, at most maxDeliveryRows rows per statement.
	for len(args) > 0 {
		n := min(len(args), 3*maxDeliveryRows)
		if err := tx.Exec(`INSERT INTO dbbus_deliveries (group_name, message_id, topic) VALUES `+
			dialect.Tuples(n/3, 3), args[:n]...).Error; err != nil {
			return wrapDB("publish: insert deliveries", err)
		}
		args = args[n:]
	}
	return nil
}
