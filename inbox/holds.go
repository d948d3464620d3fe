package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/tenant"
)

// ErrHeld is returned by [Inbox.CheckHold] for a message whose aggregate is
// held back behind an earlier message of it that was dead-lettered: applying
// it would put the aggregate's events out of order.
var ErrHeld = errors.New("inbox: held back behind a dead-lettered event of its aggregate")

// heldRef is msg's aggregate with its tenant, or a zero id for a message
// without one.
func heldRef(msg *message.Message) (string, aggregateRef, error) {
	ref, err := aggregateOf(msg)
	tid := msg.Metadata.Get(messaging.MetaTenantID)
	if tid == "" {
		tid = tenant.Default
	}
	return tid, ref, err
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

// CheckHold reports whether msg may be applied as far as holds go: it
// returns an error wrapping ErrHeld when msg's aggregate is held behind
// another message at a lower version; a message at or below the hold's
// version (an earlier event, replayed) passes. held is true when msg is itself the
// message the aggregate is held behind (its replay): once it is applied,
// call Unhold.
func (in *Inbox) CheckHold(ctx context.Context, msg *message.Message) (held bool, err error) {
	tid, ref, err := heldRef(msg)
	if err != nil || ref.id == "" {
		return false, nil
	}
	var holds []struct {
		Version   int64
		MessageID string
	}
	if err := in.db.WithContext(ctx).Raw(`SELECT version, message_id FROM inbox_holds
WHERE consumer = ? AND tenant_id = ? AND aggregate_type = ? AND aggregate_id = ?`,
		in.cfg.Consumer, tid, ref.typ, ref.id).Scan(&holds).Error; err != nil {
		return false, wrapDB("check hold", err)
	}
	switch {
	case len(holds) == 0:
		return false, nil
	case holds[0].MessageID == msg.UUID:
		return true, nil
	case ref.version <= holds[0].Version:
		return false, nil // the aggregate's past: an earlier event, replayed
	default:
		return false, fmt.Errorf("%w: %s %s version %d waits for message %s (version %d)",
			ErrHeld, ref.typ, ref.id, ref.version, holds[0].MessageID, holds[0].Version)
	}
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

// Release lifts the hold on an aggregate (the operator discarded the dead
// letter it was held behind) and reports whether there was one. An empty
// tenant means tenant.Default.
func (in *Inbox) Release(ctx context.Context, tenantID, aggregateType, aggregateID string) (bool, error) {
	if tenantID == "" {
		tenantID = tenant.Default
	}
	res := in.db.WithContext(ctx).Exec(`DELETE FROM inbox_holds
WHERE consumer = ? AND tenant_id = ? AND aggregate_type = ? AND aggregate_id = ?`,
		in.cfg.Consumer, tenantID, aggregateType, aggregateID)
	if res.Error != nil {
		return false, wrapDB("release hold", res.Error)
	}
	return res.RowsAffected > 0, nil
}
