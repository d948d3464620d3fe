package dbbus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
)

// ErrLeaseLost is returned by [Ack] and [Nack] for a lease that no longer
// holds its delivery: it expired and the delivery went back to the group
// (and maybe to another consumer, under a new token), or it was settled
// already. The delivery is left as it is.
var ErrLeaseLost = errors.New("dbbus: lease lost")

// Lease is one claimed delivery: which group's row, of which message, and
// the token that fences it. Every delivered message carries its lease in
// its context ([LeaseOf]).
type Lease struct {
	Group     string
	Delivery  int64  // the delivery row's id
	MessageID string // the message's UUID
	Topic     string // the topic it was published on: with MessageID, its body's key
	Token     string // the claim's random token
	// Attempts counts the earlier deliveries of this message to the group
	// that failed: nacked, or whose lease expired. Give-backs (Close, a
	// cancelled subscription) do not count.
	Attempts int
}

type leaseKey struct{}

// LeaseOf returns the lease of a message a [Subscriber] delivered.
func LeaseOf(msg *message.Message) (Lease, bool) {
	l, ok := msg.Context().Value(leaseKey{}).(Lease)
	return l, ok
}

// newToken returns a random lease token.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Ack settles the leased delivery: it deletes the delivery row, and the
// message's body once no other group's delivery references it, all in one
// transaction (a nested one when db is a transaction).
//
// Errors: ErrLeaseLost when the lease no longer holds the delivery (nothing
// is deleted), wrapped database errors.
func Ack(ctx context.Context, db *gorm.DB, l Lease) error {
	return ackAll(ctx, db, []Lease{l}, false)
}

// ackAll is Ack for several leases in one transaction; they may come from
// several claims (one delete per lease token, each fenced by its own). A
// lease that no longer holds its delivery makes it return an error
// wrapping ErrLeaseLost that names it; the others are acked. With async,
// for the bus's own acks on its pool (acker), the transaction commits
// asynchronously on PostgreSQL (asyncCommit): never for [Ack], whose db
// may be the caller's transaction, which would then commit asynchronously
// too.
func ackAll(ctx context.Context, db *gorm.DB, leases []Lease, async bool) error {
	d, err := dialect.Of(db)
	if err != nil {
		return fmt.Errorf("dbbus: ack: %w", err)
	}
	ids := make([]int64, len(leases))
	keys := make([]messageKey, len(leases))
	byToken := map[string][]int64{}
	var tokens []string // in order of first appearance
	for i, l := range leases {
		ids[i], keys[i] = l.Delivery, messageKey{l.MessageID, l.Topic}
		if _, ok := byToken[l.Token]; !ok {
			tokens = append(tokens, l.Token)
		}
		byToken[l.Token] = append(byToken[l.Token], l.Delivery)
	}
	del := deleteDeliveries
	if async && d == dialect.Postgres {
		del = pgAsyncAck
	}
	var gone []int64
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		gone = gone[:0]
		if err := topicsOf(tx, ids, keys); err != nil {
			return wrapDB("ack: read topics", err)
		}
		// Acks of one message's deliveries in several groups take turns on
		// its body row (locked in id order, so acks of several messages
		// cannot deadlock), so the last of them sees the others' deletes
		// and deletes the body.
		if err := lockMessages(tx, d, keys); err != nil {
			return wrapDB("ack: lock messages", err)
		}
		for _, token := range tokens {
			var deleted []int64
			if err := tx.Raw(del, byToken[token], token).Scan(&deleted).Error; err != nil {
				return wrapDB("ack", err)
			}
			gone = append(gone, deleted...)
		}
		if err := deleteOrphans(tx, d, keys); err != nil {
			return wrapDB("ack: delete messages", err)
		}
		return nil
	})
	if err != nil || len(gone) == len(leases) {
		return err
	}
	var errs []error
	for _, l := range leases {
		if !slices.Contains(gone, l.Delivery) {
			errs = append(errs, fmt.Errorf("ack delivery %d of message %s in group %q: %w", l.Delivery, l.MessageID, l.Group, ErrLeaseLost))
		}
	}
	return errors.Join(errs...)
}

// topicsOf fills in the topic of each key that lacks one (a Lease built
// by hand rather than taken from LeaseOf) from its delivery, ids[i] for
// keys[i].
func topicsOf(tx *gorm.DB, ids []int64, keys []messageKey) error {
	var missing []int64
	for i, k := range keys {
		if k.topic == "" {
			missing = append(missing, ids[i])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	var rows []struct {
		ID    int64
		Topic string
	}
	if err := tx.Raw(`SELECT id, topic FROM dbbus_deliveries WHERE id IN ?`, missing).Scan(&rows).Error; err != nil {
		return err
	}
	for _, r := range rows {
		if i := slices.Index(ids, r.ID); i >= 0 && keys[i].topic == "" {
			keys[i].topic = r.Topic
		}
	}
	return nil
}

// Nack makes the leased delivery ready again at once, counting a failed
// attempt. The subscriber nacks this way when a message is nacked.
//
// Errors: ErrLeaseLost when the lease no longer holds the delivery,
// wrapped database errors.
func Nack(ctx context.Context, db *gorm.DB, l Lease) error {
	res := db.WithContext(ctx).Exec(nackDelivery, l.Delivery, l.Token)
	if res.Error != nil {
		return wrapDB("nack", res.Error)
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("nack delivery %d of message %s in group %q: %w", l.Delivery, l.MessageID, l.Group, ErrLeaseLost)
	}
	return nil
}

// release gives deliveries leased under token back to their group at once,
// without counting an attempt.
func release(ctx context.Context, db *gorm.DB, token string, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if err := db.WithContext(ctx).Exec(releaseDeliveries, ids, token).Error; err != nil {
		return wrapDB("release", err)
	}
	return nil
}
