package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/messaging"
)

// ErrHeld is returned by [Inbox.CheckHold] for a message whose aggregate is
// held back behind an earlier message of it that was dead-lettered: applying
// it would put the aggregate's events out of order.
var ErrHeld = errors.New("inbox: held back behind a dead-lettered event of its aggregate")

// ErrStaleRelease is returned by [Inbox.Release] when the aggregate is not
// held back by what the release names: the hold was released or its
// message applied already, or the aggregate is held behind another
// message now. Nothing was changed.
var ErrStaleRelease = errors.New("inbox: stale release: the aggregate is not held back by that message")

// heldRef is msg's aggregate with its tenant, or a zero id for a message
// without one.
func heldRef(msg *message.Message) (string, aggregateRef, error) {
	ref, err := aggregateOf(msg)
	return defaultTenant(msg.Metadata.Get(messaging.MetaTenantID)), ref, err
}

// Hold holds back msg's aggregate behind msg, which is being dead-lettered:
// from now on CheckHold refuses the aggregate's later versions until msg is
// applied (Unhold) or the hold is released. An aggregate already held stays
// held behind its first message. A message without an aggregate (or with a
// malformed version) holds nothing.
func (in *Inbox) Hold(ctx context.Context, msg *message.Message) error {
	tid, ref, err := heldRef(msg)
	if err != nil || ref.id == "" {
		return nil
	}
	err = in.db.WithContext(ctx).Exec(`INSERT INTO inbox_holds
(consumer, tenant_id, aggregate_type, aggregate_id, version, message_id, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		in.cfg.Consumer, tid, ref.typ, ref.id, ref.version, msg.UUID, time.Now().UTC()).Error
	if err != nil {
		return wrapDB("hold", err)
	}
	return nil
}

// HoldState is what CheckHold found about a message's aggregate.
type HoldState struct {
	// Own is true when the message is the one its aggregate is held behind
	// (its replay): once it is applied, call Unhold.
	Own bool
	// Parked is true when the aggregate has parked events after the
	// message, to apply once it is.
	Parked bool
}

// CheckHold reports whether msg may be applied as far as holds go: it
// returns an error wrapping ErrHeld when msg's aggregate is held behind
// another message at a lower version, or has a parked event at a lower
// version (see Park); a message at or below the hold's version (an earlier
// event, replayed) passes.
func (in *Inbox) CheckHold(ctx context.Context, msg *message.Message) (HoldState, error) {
	tid, ref, err := heldRef(msg)
	if err != nil || ref.id == "" {
		return HoldState{}, nil
	}
	var rows []struct {
		Version   int64
		MessageID string
		Parked    bool
	}
	if err := in.db.WithContext(ctx).Raw(`SELECT version, message_id, 0 AS parked FROM inbox_holds
WHERE consumer = ? AND tenant_id = ? AND aggregate_type = ? AND aggregate_id = ?
UNION ALL
SELECT COALESCE(MIN(version), 0), '', 1 FROM inbox_parked
WHERE consumer = ? AND tenant_id = ? AND aggregate_type = ? AND aggregate_id = ? AND message_id <> ?`,
		in.cfg.Consumer, tid, ref.typ, ref.id, in.cfg.Consumer, tid, ref.typ, ref.id, msg.UUID).Scan(&rows).Error; err != nil {
		return HoldState{}, wrapDB("check hold", err)
	}
	var st HoldState
	for _, r := range rows {
		switch {
		case r.Parked && r.Version == 0: // nothing parked
		case r.Parked && r.Version < ref.version:
			return st, fmt.Errorf("%w: %s %s version %d waits behind its parked version %d",
				ErrHeld, ref.typ, ref.id, ref.version, r.Version)
		case r.Parked:
			st.Parked = true
		case r.MessageID == msg.UUID:
			st.Own = true
		case ref.version > r.Version:
			return st, fmt.Errorf("%w: %s %s version %d waits for message %s (version %d)",
				ErrHeld, ref.typ, ref.id, ref.version, r.MessageID, r.Version)
		}
	}
	return st, nil
}

// Unhold lifts the hold msg's aggregate is held behind, if msg is that
// hold's message (applied at last).
func (in *Inbox) Unhold(ctx context.Context, msg *message.Message) error {
	tid, ref, err := heldRef(msg)
	if err != nil || ref.id == "" {
		return nil
	}
	if err := in.db.WithContext(ctx).Exec(`DELETE FROM inbox_holds
WHERE consumer = ? AND tenant_id = ? AND aggregate_type = ? AND aggregate_id = ? AND message_id = ?`,
		in.cfg.Consumer, tid, ref.typ, ref.id, msg.UUID).Error; err != nil {
		return wrapDB("unhold", err)
	}
	return nil
}

// Release gives up what holds an aggregate back, named by messageID: the
// dead letter it is held behind (its hold's message, which the operator
// discarded) or, under VersionsContiguous, its first parked event, waiting
// for versions that were never applied. Giving up a hold under
// VersionsContiguous also gives up the versions the aggregate's first
// parked event waits for; giving up a gap moves the aggregate's watermark
// to just below that event. Either way its parked events can then be
// applied, by the consumer of their partition. It compares and gives up
// in one transaction: when the aggregate is not held back by what
// messageID names (it was released or applied already, or it is held
// behind another message now), it changes nothing and returns
// ErrStaleRelease. An empty tenant means tenant.Default.
//
// Errors: ErrStaleRelease, ErrClosed, or the database error.
func (in *Inbox) Release(ctx context.Context, agg Aggregate, messageID string) error {
	agg.TenantID = defaultTenant(agg.TenantID)
	return in.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Exec(`DELETE FROM inbox_holds
WHERE consumer = ? AND tenant_id = ? AND aggregate_type = ? AND aggregate_id = ? AND message_id = ?`,
			in.cfg.Consumer, agg.TenantID, agg.Type, agg.ID, messageID)
		if res.Error != nil {
			return wrapDB("release hold", res.Error)
		}
		if res.RowsAffected > 0 {
			_, err := in.skipGap(tx, agg, "")
			return err
		}
		skipped, err := in.skipGap(tx, agg, messageID)
		if err != nil || skipped {
			return err
		}
		h, err := in.holdOf(tx, agg)
		switch {
		case err != nil:
			return err
		case h != nil:
			return fmt.Errorf("%w: %s %s is held behind message %s (version %d), not %s",
				ErrStaleRelease, agg.Type, agg.ID, h.MessageID, h.Version, messageID)
		}
		return fmt.Errorf("%w: %s %s is not held behind message %s", ErrStaleRelease, agg.Type, agg.ID, messageID)
	})
}

// Hold is an aggregate held back behind a dead letter: its later versions
// are parked until the dead letter is applied (replayed) or the hold is
// released.
type Hold struct {
	TenantID      string
	AggregateType string
	AggregateID   string
	// Version and MessageID are the dead letter's.
	Version   int64
	MessageID string
	// CreatedAt is when the aggregate was held back.
	CreatedAt time.Time
}

// Aggregate returns the aggregate h holds back: with h.MessageID it names
// what Release gives up.
func (h *Hold) Aggregate() Aggregate {
	return Aggregate{TenantID: h.TenantID, Type: h.AggregateType, ID: h.AggregateID}
}

// ListHolds returns up to limit holds that f selects (its Reason aside),
// oldest first.
//
// Errors: ErrInvalidArgument for a limit below 1 or an unknown reason,
// ErrClosed, or the database error.
func (in *Inbox) ListHolds(ctx context.Context, f ParkedFilter, limit int) ([]Hold, error) {
	cond, args, err := f.where(in.cfg.Consumer, false)
	if err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("%w: limit %d is below 1", ErrInvalidArgument, limit)
	}
	var rows []Hold
	if err := in.db.WithContext(ctx).Raw(`SELECT tenant_id, aggregate_type, aggregate_id, version, message_id, created_at
FROM inbox_holds WHERE `+cond+` ORDER BY created_at, aggregate_id LIMIT ?`, append(args, limit)...).Scan(&rows).Error; err != nil {
		return nil, wrapDB("list holds", err)
	}
	return rows, nil
}

// holdRow is a row of inbox_holds.
type holdRow struct {
	Version   int64
	MessageID string
}

// holdOf returns the hold of agg, read in tx, or nil when it has none.
func (in *Inbox) holdOf(tx *gorm.DB, agg Aggregate) (*holdRow, error) {
	var rows []holdRow
	if err := tx.Raw(`SELECT version, message_id FROM inbox_holds
WHERE consumer = ? AND tenant_id = ? AND aggregate_type = ? AND aggregate_id = ?`,
		in.cfg.Consumer, agg.TenantID, agg.Type, agg.ID).Scan(&rows).Error; err != nil {
		return nil, wrapDB("read hold", err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	return &rows[0], nil
}

// Entangled returns the aggregates of msgs that are held back or have
// parked events, in one query: a consumer applying msgs together must hand
// those to CheckHold one by one. Messages without an aggregate are never
// entangled.
func (in *Inbox) Entangled(ctx context.Context, msgs []*message.Message) (map[Aggregate]bool, error) {
	var (
		n    int
		args = []any{in.cfg.Consumer}
		seen = map[Aggregate]bool{}
	)
	for _, msg := range msgs {
		tid, ref, err := heldRef(msg)
		if err != nil || ref.id == "" {
			continue
		}
		a := Aggregate{TenantID: tid, Type: ref.typ, ID: ref.id}
		if seen[a] {
			continue
		}
		seen[a] = true
		n++
		args = append(args, a.TenantID, a.Type, a.ID)
	}
	if n == 0 {
		return nil, nil
	}
	set := dialect.Tuples(n, 3)
	args = append(args, args...)
	var rows []Aggregate
	err := in.db.WithContext(ctx).Raw(`SELECT tenant_id, aggregate_type AS type, aggregate_id AS id FROM inbox_holds
WHERE consumer = ? AND (tenant_id, aggregate_type, aggregate_id) IN (`+set+`)
UNION
SELECT tenant_id, aggregate_type, aggregate_id FROM inbox_parked
WHERE consumer = ? AND (tenant_id, aggregate_type, aggregate_id) IN (`+set+`)`, args...).Scan(&rows).Error
	if err != nil {
		return nil, wrapDB("check holds", err)
	}
	out := make(map[Aggregate]bool, len(rows))
	for _, r := range rows {
		out[r] = true
	}
	return out, nil
}
