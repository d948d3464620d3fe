package dbbus

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/messaging"
)

// unroutableScan bounds how many kept messages one [ListUnroutable] looks
// at.
const unroutableScan = 100_000

// UnroutableFilter selects messages kept in [UnroutableGroup], for
// [ListUnroutable] and [ReplayUnroutable]. The zero value selects every
// one.
type UnroutableFilter struct {
	// EventTypes, when set, selects the messages of those event types only
	// (the messaging.MetaEventType metadata).
	EventTypes []string
	// TenantID, when set, selects that tenant's messages only (the
	// messaging.MetaTenantID metadata).
	TenantID string
}

func (f UnroutableFilter) match(msg *message.Message) bool {
	return (len(f.EventTypes) == 0 || slices.Contains(f.EventTypes, msg.Metadata.Get(messaging.MetaEventType))) &&
		(f.TenantID == "" || f.TenantID == msg.Metadata.Get(messaging.MetaTenantID))
}

// Kept is a message kept in [UnroutableGroup]: no group was bound to its
// topic when it was published.
type Kept struct {
	// Delivery is its delivery row's id in UnroutableGroup (publish order).
	Delivery int64
	// Topic is the topic it was published on.
	Topic string
	// Age is how long ago it was published, by the database's clock.
	Age time.Duration
	// Message is the message: UUID, metadata and payload.
	Message *message.Message
}

// ListUnroutable returns up to limit of the messages kept in
// [UnroutableGroup] that f selects, oldest first, and changes nothing. Like
// [Peek] it takes no lock; it reads the group's ready deliveries through
// the index dbbus_deliveries_ready, 100 at a time, and looks at 100,000 of
// them at most. A delivery a subscriber of the group holds leased is not
// shown.
//
// Errors: ErrInvalidArgument for a limit below 1, ctx's error, wrapped
// database errors.
func ListUnroutable(ctx context.Context, db *gorm.DB, f UnroutableFilter, limit int) ([]Kept, error) {
	d, err := checkBrowse(ctx, db, UnroutableGroup, limit)
	if err != nil {
		return nil, err
	}
	db = db.WithContext(ctx)
	var out []Kept
	var after int64
	for seen := 0; seen < unroutableScan && len(out) < limit; {
		batch, read, last, err := readDeliveries(db, peekDeliveries, UnroutableGroup, after, browseBatch)
		if err != nil {
			return out, err
		}
		if read == 0 {
			break
		}
		kept, err := keptOf(db, d, batch, f)
		if err != nil {
			return out, err
		}
		out = append(out, kept[:min(len(kept), limit-len(out))]...)
		after = last
		seen += read
	}
	return out, nil
}

// keptOf returns the deliveries of batch that f selects, with their ages.
func keptOf(tx *gorm.DB, d dialect.Dialect, batch []Browsed, f UnroutableFilter) ([]Kept, error) {
	var ids []string
	for _, b := range batch {
		if f.match(b.Message) {
			ids = append(ids, b.Message.UUID)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	var rows []struct {
		ID    string
		Topic string
		AgeMS int64
	}
	if err := tx.Raw(ageSQL(d), map[string]any{"ids": ids}).Scan(&rows).Error; err != nil {
		return nil, wrapDB("unroutable: read ages", err)
	}
	ages := make(map[messageKey]time.Duration, len(rows))
	for _, r := range rows {
		ages[messageKey{r.ID, r.Topic}] = time.Duration(max(r.AgeMS, 0)) * time.Millisecond
	}
	out := make([]Kept, 0, len(ids))
	for _, b := range batch {
		if f.match(b.Message) {
			out = append(out, Kept{Delivery: b.Delivery, Topic: b.Topic, Message: b.Message,
				Age: ages[messageKey{b.Message.UUID, b.Topic}]})
		}
	}
	return out, nil
}

// ageSQL reads, per dialect, how many milliseconds ago the bodies of the
// message ids @ids were published, by the database's clock, through
// dbbus_messages' primary key.
func ageSQL(d dialect.Dialect) string {
	age := `CAST(extract(epoch FROM now() - created_at) * 1000 AS BIGINT)`
	if d == dialect.SQLite {
		// SQLite's CURRENT_TIMESTAMP is 'YYYY-MM-DD HH:MM:SS' in UTC.
		age = `CAST((julianday('now') - julianday(created_at)) * 86400000 AS INTEGER)`
	}
	return `SELECT id, topic, ` + age + ` AS age_ms FROM dbbus_messages WHERE id IN @ids`
}

// Replayed is a kept message [ReplayUnroutable] delivered.
type Replayed struct {
	Kept
	// Queues are the queues it was delivered to: each group bound to its
	// topic, or for a partitioned group the partition queue of its
	// partition key.
	Queues []string
}

// UnroutableReplay is what [ReplayUnroutable] did.
type UnroutableReplay struct {
	// Delivered are the messages delivered to the groups now bound to
	// their topic, and removed from UnroutableGroup, oldest first.
	Delivered []Replayed
	// Kept are the messages selected that no group is bound to yet: they
	// stay in UnroutableGroup, as they were.
	Kept []Kept
}

// ReplayUnroutable delivers the messages kept in [UnroutableGroup] that f
// selects to every group bound to their topic now (declare the group that
// missed them first: [DeclareGroup], [DeclarePartitions]), each at the end
// of the group's queue (for a partitioned group, of the partition queue
// its partition key chooses, as [Bus.Publish] would), with its UUID,
// metadata and payload; a consumer's inbox skips what its group applied
// already. In the same transaction its delivery leaves UnroutableGroup, so
// a replay is exactly once: a message is delivered to each group once and
// removed, or neither. A message still bound to no group stays kept and is
// returned in [UnroutableReplay].Kept.
//
// It walks the group's ready deliveries oldest first, in transactions of
// up to 100 that read the current bindings and, as [Browse] does, lock the
// deliveries in id order on PostgreSQL, waiting for a lock another replay
// (or browse, or purge) holds: a delivery another replay moved meanwhile
// is not seen again, so concurrent replays, by two operators or processes,
// deliver each message once. A delivery a subscriber of the group holds
// leased is left alone. On PostgreSQL a transaction that delivered
// messages notifies [NotifyChannel]; on SQLite subscribers find them at
// their next poll. When ctx ends, or the database fails, the transaction
// under way rolls back and what the earlier ones delivered is returned
// with the error.
//
// Errors: ctx's error, wrapped database errors.
func ReplayUnroutable(ctx context.Context, db *gorm.DB, f UnroutableFilter) (UnroutableReplay, error) {
	var out UnroutableReplay
	d, err := checkBrowse(ctx, db, UnroutableGroup, 1)
	if err != nil {
		return out, err
	}
	q := statementsFor(d).browse
	var after int64
	for {
		var (
			n         int
			delivered []Replayed
			kept      []Kept
		)
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			batch, read, last, err := readDeliveries(tx, q, UnroutableGroup, after, browseBatch)
			if err != nil || read == 0 {
				return err
			}
			n, after = read, last
			selected, err := keptOf(tx, d, batch, f)
			if err != nil || len(selected) == 0 {
				return err
			}
			keys := make([]messageKey, len(selected))
			for i, k := range selected {
				keys[i] = messageKey{k.Message.UUID, k.Topic}
			}
			// Bodies are locked in key order, as acks lock them.
			if err := lockMessages(tx, d, keys); err != nil {
				return wrapDB("replay unroutable: lock messages", err)
			}
			bs, err := readBindings(tx)
			if err != nil {
				return wrapDB("replay unroutable: read bindings", err)
			}
			for _, k := range selected {
				routes := bs.routes(k.Topic)
				if routes[0].group == UnroutableGroup {
					kept = append(kept, k)
					continue
				}
				res := tx.Exec(deleteReady, k.Delivery)
				if res.Error != nil {
					return wrapDB("replay unroutable", res.Error)
				}
				if res.RowsAffected != 1 {
					// Not on PostgreSQL, which locked it; SQLite serialises writers.
					return fmt.Errorf("dbbus: replay unroutable: delivery %d of %s: it is gone", k.Delivery, k.Message.UUID)
				}
				r := Replayed{Kept: k}
				for _, rt := range routes {
					queue := rt.queue(k.Message)
					if err := tx.Exec(insertDelivery, queue, k.Message.UUID, k.Topic).Error; err != nil {
						return wrapDB("replay unroutable: deliver", err)
					}
					r.Queues = append(r.Queues, queue)
				}
				delivered = append(delivered, r)
			}
			if len(delivered) > 0 {
				if err := notify(tx, d, "replay unroutable", nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("dbbus: replay unroutable: %w (%w)", ctx.Err(), err)
			}
			return out, err
		}
		out.Delivered = append(out.Delivered, delivered...)
		out.Kept = append(out.Kept, kept...)
		if n == 0 {
			return out, nil
		}
	}
}
