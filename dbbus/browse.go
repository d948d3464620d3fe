package dbbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/messaging"
)

// browseBatch is how many deliveries one transaction of [Browse] (one
// query of [Peek]) reads.
const browseBatch = 100

// ErrInvalidArgument is returned by [Browse] and [Peek] for a limit below 1.
var ErrInvalidArgument = errors.New("dbbus: invalid argument")

// Browsed is a ready delivery of a group, as [Browse] and [Peek] show it.
type Browsed struct {
	// Delivery is the delivery row's id: deliveries are shown in id order,
	// oldest first.
	Delivery int64
	// Topic is the topic its message was published on (a dead letter's is
	// its dead-letter topic).
	Topic string
	// Attempts counts its failed deliveries to the group.
	Attempts int
	// Message is its message: UUID, metadata and payload. A Browse
	// function may change its metadata for a [BrowseAction.MoveTo].
	Message *message.Message
}

// BrowseAction is what [Browse] does with the delivery its function was
// called with. The zero value leaves it in place.
type BrowseAction struct {
	// Remove deletes the delivery from the browsed group, and the
	// message's body once no delivery references it (as an ack does).
	Remove bool
	// MoveTo, when not empty, names a declared group (see [DeclareGroup]
	// and [DeclarePartitions]) the message goes to, with the metadata the
	// function left on it: in one transaction, the delivery leaves the
	// browsed group and the group named gets a new ready delivery of the
	// message, at the end of its queue, as if it were published to that
	// group alone: for a partitioned group, in the partition queue its
	// partition key chooses (messaging.PartitionKey of the metadata the
	// function left), as [Bus.Publish] would. So a move
	// is exactly once: it happens entirely or not at all. The message's
	// body is shared by its deliveries, so the new metadata is the one of
	// every delivery of it (a dead letter's body has no other delivery
	// unless another group is bound to its topic too).
	MoveTo string
	// Stop ends the browse after this delivery.
	Stop bool
}

// Browse calls fn for up to limit ready deliveries of group, oldest first,
// and does what fn says with each: leave it, remove it, or move it to
// another group. It is how an operator handles a dead-letter queue (a
// group nobody subscribes to). Deliveries leased to a subscriber are not
// shown, as on RabbitMQ.
//
// It reads and acts in transactions of up to 100 deliveries, each
// committed before the next one reads: fn runs inside them, and must not
// use db. On PostgreSQL each transaction locks the deliveries it reads, in
// id order, waiting for a lock another browse of them holds; a delivery
// that browse removed or moved meanwhile is not shown, and one it left is
// shown once its transaction ends. So concurrent browses of one group
// (operators, processes) neither miss a delivery nor act twice on one:
// each delivery is removed or moved by one of them. (SKIP LOCKED would let
// a second browse miss the deliveries a first one holds and then leaves
// or rolls back.) Subscribers' claims skip the rows a browse holds. On
// SQLite, whose writers take turns, a browse transaction holds the
// database's write lock. On PostgreSQL a transaction that moved messages
// notifies [NotifyChannel]; on SQLite subscribers find them at their next
// poll.
//
// A delivery whose message's metadata cannot be read is not shown. fn's
// error stops the browse: what fn said for the deliveries before it in its
// transaction is committed, nothing is done with that one, and the error
// is returned. When ctx ends, or the database fails, the transaction
// under way rolls back: its deliveries stay where they were, untouched.
//
// It returns how many deliveries were removed or moved, in committed
// transactions, also with an error.
//
// Errors: messaging.ErrInvalidName for a bad group name,
// messaging.ErrQueueNotFound for a group, or a MoveTo group, never
// declared, ErrInvalidArgument for a limit below 1, fn's error, ctx's
// error, wrapped database errors.
func Browse(ctx context.Context, db *gorm.DB, group string, limit int, fn func(Browsed) (BrowseAction, error)) (int, error) {
	d, err := checkBrowse(ctx, db, group, limit)
	if err != nil {
		return 0, err
	}
	q := statementsFor(d).browse
	targets := map[string]route{}
	var after int64
	done := 0
	for seen := 0; seen < limit; {
		var (
			n, acted int
			stop     bool
			fnErr    error
		)
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			batch, read, last, err := readDeliveries(tx, q, group, after, min(browseBatch, limit-seen))
			if err != nil || read == 0 {
				stop = true
				return err
			}
			n, after = read, last
			keys := make([]messageKey, len(batch))
			for i, b := range batch {
				keys[i] = messageKey{b.Message.UUID, b.Topic}
			}
			// Bodies are locked in id order, as acks lock them, so a browse
			// and the acks of other groups' deliveries cannot deadlock.
			if err := lockMessages(tx, d, keys); err != nil {
				return wrapDB("browse: lock messages", err)
			}
			var touched []messageKey
			moved := false
			for _, b := range batch {
				a, err := fn(b)
				if err != nil {
					fnErr, stop = err, true
					break
				}
				if a.MoveTo != "" {
					if err := moveDelivery(ctx, tx, targets, b, a.MoveTo); err != nil {
						return err
					}
					acted++
					moved = true
				} else if a.Remove {
					res := tx.Exec(deleteReady, b.Delivery)
					if res.Error != nil {
						return wrapDB("browse: remove", res.Error)
					}
					if res.RowsAffected == 1 { // the transaction holds it: always
						touched = append(touched, messageKey{b.Message.UUID, b.Topic})
						acted++
					}
				}
				if a.Stop {
					stop = true
					break
				}
			}
			if len(touched) > 0 {
				if err := deleteOrphans(tx, d, touched); err != nil {
					return wrapDB("browse: delete messages", err)
				}
			}
			if moved {
				if err := notify(tx, d, "browse", nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("dbbus: browse %q: %w (%w)", group, ctx.Err(), err)
			}
			return done, err
		}
		done += acted
		if fnErr != nil {
			return done, fnErr
		}
		if stop || n == 0 {
			return done, nil
		}
		seen += n
	}
	return done, nil
}

// moveDelivery moves b to group to in tx (see BrowseAction.MoveTo);
// targets caches the routes of the groups moved to.
func moveDelivery(ctx context.Context, tx *gorm.DB, targets map[string]route, b Browsed, to string) error {
	r, ok := targets[to]
	if !ok {
		if err := messaging.ValidateGroup(to); err != nil {
			return fmt.Errorf("dbbus: browse: move: %w", err)
		}
		n, err := partitionsOf(tx.WithContext(ctx), to)
		if err != nil {
			return err
		}
		if n == 0 {
			if err := requireGroup(ctx, tx, to); err != nil {
				return err
			}
		}
		r = route{group: to, partitions: n}
		targets[to] = r
	}
	md, err := json.Marshal(map[string]string(b.Message.Metadata))
	if err != nil {
		return fmt.Errorf("dbbus: browse: metadata of %s: %w", b.Message.UUID, err)
	}
	res := tx.Exec(deleteReady, b.Delivery)
	if res.Error != nil {
		return wrapDB("browse: move", res.Error)
	}
	if res.RowsAffected != 1 {
		// Not on PostgreSQL, which locked it; SQLite serialises writers.
		return fmt.Errorf("dbbus: browse: move delivery %d of %s: it is gone", b.Delivery, b.Message.UUID)
	}
	if err := tx.Exec(insertDelivery, r.queue(b.Message), b.Message.UUID, b.Topic).Error; err != nil {
		return wrapDB("browse: move", err)
	}
	if err := tx.Exec(setMetadata, string(md), b.Message.UUID, b.Topic).Error; err != nil {
		return wrapDB("browse: move: set metadata", err)
	}
	return nil
}

// Peek calls fn for up to limit ready deliveries of group, oldest first,
// until fn returns false, and changes nothing. It takes no lock, so it
// neither waits for a [Browse] nor holds one back; it reads in queries of
// up to 100 deliveries, each seeing what was committed when it ran.
//
// Errors: as Browse's, but for fn's and MoveTo's.
func Peek(ctx context.Context, db *gorm.DB, group string, limit int, fn func(Browsed) bool) error {
	if _, err := checkBrowse(ctx, db, group, limit); err != nil {
		return err
	}
	var after int64
	for seen := 0; seen < limit; {
		batch, read, last, err := readDeliveries(db.WithContext(ctx), peekDeliveries, group, after, min(browseBatch, limit-seen))
		if err != nil {
			return err
		}
		if read == 0 {
			return nil
		}
		for _, b := range batch {
			if !fn(b) {
				return nil
			}
		}
		after = last
		seen += read
	}
	return nil
}

// checkBrowse checks Browse's and Peek's arguments and returns db's
// dialect.
func checkBrowse(ctx context.Context, db *gorm.DB, group string, limit int) (dialect.Dialect, error) {
	if err := messaging.ValidateGroup(group); err != nil {
		return 0, fmt.Errorf("dbbus: browse: %w", err)
	}
	if limit < 1 {
		return 0, fmt.Errorf("%w: browse limit %d (want at least 1)", ErrInvalidArgument, limit)
	}
	d, err := dialect.Of(db)
	if err != nil {
		return 0, fmt.Errorf("dbbus: %w", err)
	}
	return d, requireGroup(ctx, db, group)
}

// readDeliveries runs q, a browse or peek statement, and loads the
// messages of the deliveries it returns, in delivery order. It also
// returns how many rows q read and the last one's id: a delivery whose
// message is missing or unreadable is left out.
func readDeliveries(tx *gorm.DB, q, group string, after int64, limit int) (out []Browsed, read int, last int64, err error) {
	var rows []struct {
		ID        int64
		MessageID string
		Topic     string
		Attempts  int
	}
	if err := tx.Raw(q, map[string]any{"group": group, "after": after, "limit": limit}).Scan(&rows).Error; err != nil {
		return nil, 0, 0, wrapDB("browse", err)
	}
	if len(rows) == 0 {
		return nil, 0, 0, nil
	}
	keys := make([]messageKey, len(rows))
	for i, r := range rows {
		keys[i] = messageKey{r.MessageID, r.Topic}
	}
	msgs, _, err := readMessages(tx, keys)
	if err != nil {
		return nil, 0, 0, wrapDB("browse: read messages", err)
	}
	out = make([]Browsed, 0, len(rows))
	for _, r := range rows {
		if msg, ok := msgs[messageKey{r.MessageID, r.Topic}]; ok {
			out = append(out, Browsed{Delivery: r.ID, Topic: r.Topic, Attempts: r.Attempts, Message: msg})
		}
	}
	return out, len(rows), rows[len(rows)-1].ID, nil
}
