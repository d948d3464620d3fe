package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/tenant"
	"github.com/bentoevents/bento/uow"
)

// The reasons an event is parked (Parked.Reason).
const (
	// ParkedHeld: an earlier event of the aggregate was dead-lettered (a
	// hold) or is parked; this one waits behind it.
	ParkedHeld = "held"
	// ParkedWaiting: the aggregate's previous version has not been applied
	// (VersionsContiguous); the event waits for it.
	ParkedWaiting = "waiting"
	// ParkedGap: an event that waited for its predecessor longer than the
	// consumer's gap timeout: a dead letter, to look into, which is still
	// applied in order if the predecessor turns up.
	ParkedGap = "gap"
)

// Parked is an event a partitioned consumer parked in inbox_parked instead
// of applying it out of order. It is applied, and its row deleted in the
// same transaction, once nothing earlier of its aggregate is missing.
type Parked struct {
	MessageID     string
	TenantID      string
	AggregateType string
	AggregateID   string
	Version       int64
	// Partition is the consumer partition the event arrived on.
	Partition int
	// Reason is ParkedHeld, ParkedWaiting or ParkedGap.
	Reason string
	// Attempts counts the failed attempts at applying it since it was
	// unparked, and LastError is the last one's error.
	Attempts  int
	LastError string
	ParkedAt  time.Time
	Metadata  message.Metadata
	Payload   []byte
}

// Message returns the parked message, as it was delivered.
func (p *Parked) Message() *message.Message {
	msg := message.NewMessage(p.MessageID, p.Payload)
	for k, v := range p.Metadata {
		msg.Metadata.Set(k, v)
	}
	return msg
}

// Aggregate returns the aggregate p belongs to: with p.MessageID it names
// what Release gives up when p waits for versions that never arrived.
func (p *Parked) Aggregate() Aggregate {
	return Aggregate{TenantID: p.TenantID, Type: p.AggregateType, ID: p.AggregateID}
}

// Aggregate names one aggregate of one tenant.
type Aggregate struct {
	TenantID, Type, ID string
}

// parkedRow is the scan target of inbox_parked.
type parkedRow struct {
	MessageID     string
	TenantID      string
	AggregateType string
	AggregateID   string
	Version       int64
	PartitionNo   int
	Reason        string
	Metadata      string
	Payload       []byte
	Attempts      int
	LastError     string
	ParkedAt      time.Time
}

func (r parkedRow) parked() (Parked, error) {
	p := Parked{MessageID: r.MessageID, TenantID: r.TenantID, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
		Version: r.Version, Partition: r.PartitionNo, Reason: r.Reason, Attempts: r.Attempts, LastError: r.LastError,
		ParkedAt: r.ParkedAt, Payload: r.Payload}
	if err := json.Unmarshal([]byte(r.Metadata), &p.Metadata); err != nil {
		return p, fmt.Errorf("inbox: parked message %s: metadata: %w", r.MessageID, err)
	}
	return p, nil
}

// parkedAll converts rows, in order.
func parkedAll(rows []parkedRow) ([]Parked, error) {
	out := make([]Parked, 0, len(rows))
	for _, r := range rows {
		p, err := r.parked()
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

const parkedColumns = `message_id, tenant_id, aggregate_type, aggregate_id, version, partition_no, reason,
metadata, payload, attempts, last_error, parked_at`

// Park parks msg, which arrived on partition, for reason (ParkedHeld or
// ParkedWaiting). Parking a message already parked does nothing, so a
// redelivery of it is harmless. A message without an aggregate cannot be
// parked.
func (in *Inbox) Park(ctx context.Context, msg *message.Message, partition int, reason string) error {
	tid, ref, err := heldRef(msg)
	if err != nil {
		return err
	}
	if ref.id == "" {
		return fmt.Errorf("inbox: park message %s: it has no aggregate", msg.UUID)
	}
	meta, err := json.Marshal(msg.Metadata)
	if err != nil {
		return fmt.Errorf("inbox: park message %s: %w", msg.UUID, err)
	}
	payload := msg.Payload
	if payload == nil {
		payload = []byte{}
	}
	err = in.db.WithContext(ctx).Exec(`INSERT INTO inbox_parked
(consumer, `+parkedColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, '', ?) ON CONFLICT DO NOTHING`,
		in.cfg.Consumer, msg.UUID, tid, ref.typ, ref.id, ref.version, partition, reason, string(meta), payload,
		in.cfg.Clock.Now().UTC()).Error
	if err != nil {
		return wrapDB("park", err)
	}
	return nil
}

// NextParked returns the parked event of an aggregate with the lowest
// version, or nil when it has none.
func (in *Inbox) NextParked(ctx context.Context, agg Aggregate) (*Parked, error) {
	return in.nextParked(in.db.WithContext(ctx), agg)
}

// nextParked is NextParked through db (a transaction, or the handle).
func (in *Inbox) nextParked(db *gorm.DB, agg Aggregate) (*Parked, error) {
	var rows []parkedRow
	err := db.Raw(`SELECT `+parkedColumns+` FROM inbox_parked
WHERE consumer = ? AND tenant_id = ? AND aggregate_type = ? AND aggregate_id = ? ORDER BY version, message_id LIMIT 1`,
		in.cfg.Consumer, agg.TenantID, agg.Type, agg.ID).Scan(&rows).Error
	if err != nil {
		return nil, wrapDB("read parked", err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	p, err := rows[0].parked()
	return &p, err
}

// ParkedFilter selects parked events and holds. A zero field selects
// every value of it.
type ParkedFilter struct {
	// TenantID selects one tenant's.
	TenantID string
	// AggregateType and AggregateID select one aggregate type, or with
	// both set one aggregate.
	AggregateType, AggregateID string
	// Reason selects the parked events parked for it: ParkedHeld,
	// ParkedWaiting or ParkedGap. Holds have no reason: ListHolds ignores
	// it.
	Reason string
}

// where returns the condition of f on consumer's rows of inbox_parked or
// inbox_holds, and its arguments; parked adds the reason.
func (f ParkedFilter) where(consumer string, parked bool) (string, []any, error) {
	cond, args := `consumer = ?`, []any{consumer}
	for _, c := range []struct{ col, v string }{
		{"tenant_id", f.TenantID}, {"aggregate_type", f.AggregateType}, {"aggregate_id", f.AggregateID},
	} {
		if c.v != "" {
			cond, args = cond+` AND `+c.col+` = ?`, append(args, c.v)
		}
	}
	switch f.Reason {
	case "":
	case ParkedHeld, ParkedWaiting, ParkedGap:
		if parked {
			cond, args = cond+` AND reason = ?`, append(args, f.Reason)
		}
	default:
		return "", nil, fmt.Errorf("%w: parked reason %q: want %s, %s or %s", ErrInvalidArgument, f.Reason,
			ParkedHeld, ParkedWaiting, ParkedGap)
	}
	return cond, args, nil
}

// ListParked returns up to limit parked events that f selects, oldest
// first, or, when f names one aggregate (type and id), in version order.
//
// Errors: ErrInvalidArgument for a limit below 1 or an unknown reason,
// ErrClosed, or the database error.
func (in *Inbox) ListParked(ctx context.Context, f ParkedFilter, limit int) ([]Parked, error) {
	cond, args, err := f.where(in.cfg.Consumer, true)
	if err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("%w: limit %d is below 1", ErrInvalidArgument, limit)
	}
	order := `parked_at, aggregate_id, version`
	if f.AggregateType != "" && f.AggregateID != "" {
		order = `tenant_id, version, message_id`
	}
	var rows []parkedRow
	err = in.db.WithContext(ctx).Raw(`SELECT `+parkedColumns+` FROM inbox_parked
WHERE `+cond+` ORDER BY `+order+` LIMIT ?`, append(args, limit)...).Scan(&rows).Error
	if err != nil {
		return nil, wrapDB("list parked", err)
	}
	return parkedAll(rows)
}

// The statement of ParkedAggregates. Its window is the next parked events
// after a cursor in the order of inbox_parked_aggregate, so it reads at
// most that many index entries; each is then checked by primary-key probes
// of inbox_parked, inbox_holds and (releasableCaughtUp) inbox_watermarks.
// It returns the window's releasable aggregates (ready = 1): those whose
// first parked event (lowest version) arrived on one of the partitions
// and passes CheckHold's rule (no hold below it) and, under
// VersionsContiguous, whose predecessor was applied; and, when the window
// is full, its last aggregate (ready = 0), where the next one starts.
const (
	releasableWindow = `WITH w AS (SELECT tenant_id, aggregate_type, aggregate_id, version, message_id, partition_no
  FROM inbox_parked WHERE consumer = ? AND (tenant_id, aggregate_type, aggregate_id) > (?, ?, ?)
  ORDER BY tenant_id, aggregate_type, aggregate_id, version LIMIT ?)
SELECT p.tenant_id, p.aggregate_type AS type, p.aggregate_id AS id, 1 AS ready FROM w p
WHERE p.partition_no IN ?
AND NOT EXISTS (SELECT 1 FROM inbox_parked e WHERE e.consumer = ? AND e.tenant_id = p.tenant_id
  AND e.aggregate_type = p.aggregate_type AND e.aggregate_id = p.aggregate_id
  AND (e.version < p.version OR (e.version = p.version AND e.message_id < p.message_id)))
AND NOT EXISTS (SELECT 1 FROM inbox_holds h WHERE h.consumer = ? AND h.tenant_id = p.tenant_id
  AND h.aggregate_type = p.aggregate_type AND h.aggregate_id = p.aggregate_id AND h.version < p.version)`
	releasableCaughtUp = `
AND COALESCE((SELECT m.version FROM inbox_watermarks m WHERE m.consumer = ? AND m.tenant_id = p.tenant_id
  AND m.aggregate_type = p.aggregate_type AND m.aggregate_id = p.aggregate_id), 0) >= p.version - 1`
	releasableEnd = `
UNION ALL
SELECT tenant_id, aggregate_type, aggregate_id, 0 FROM (SELECT tenant_id, aggregate_type, aggregate_id FROM w
  ORDER BY tenant_id DESC, aggregate_type DESC, aggregate_id DESC LIMIT 1) l
WHERE (SELECT count(*) FROM w) = ?`
)

// ParkedAggregates looks at the next window parked events after the
// aggregate after (in the order of tenant, aggregate type, aggregate id)
// and returns the aggregates among them whose parked events can be
// applied now and whose first parked event arrived on one of partitions:
// not those held behind a dead letter, nor, under VersionsContiguous,
// those whose first parked event still waits for its predecessor
// (ParkedWaiting or ParkedGap until the watermark catches up). next is
// where the following window starts: the last aggregate looked at, or the
// zero Aggregate once the window reached the end. Each call reads at most
// window parked events, so a caller that pages on with next reaches every
// releasable aggregate within (parked events / window) + 1 calls, however
// many are held.
func (in *Inbox) ParkedAggregates(ctx context.Context, partitions []int, after Aggregate, window int) (
	aggs []Aggregate, next Aggregate, err error) {
	if len(partitions) == 0 {
		return nil, Aggregate{}, nil
	}
	c := in.cfg.Consumer
	q, args := releasableWindow, []any{c, after.TenantID, after.Type, after.ID, window, partitions, c, c}
	if in.cfg.Versions == VersionsContiguous {
		q, args = q+releasableCaughtUp, append(args, c)
	}
	var rows []struct {
		Aggregate
		Ready bool
	}
	if err := in.db.WithContext(ctx).Raw(q+releasableEnd, append(args, window)...).Scan(&rows).Error; err != nil {
		return nil, Aggregate{}, wrapDB("list parked aggregates", err)
	}
	for _, r := range rows {
		if r.Ready {
			aggs = append(aggs, r.Aggregate)
		} else {
			next = r.Aggregate
		}
	}
	return aggs, next, nil
}

// Unpark deletes a parked event, in the transaction ctx carries if there
// is one (the one applying it), so that it leaves inbox_parked exactly when
// it is applied.
func (in *Inbox) Unpark(ctx context.Context, messageID string) error {
	if err := uow.DB(ctx, in.db).Exec(`DELETE FROM inbox_parked WHERE consumer = ? AND message_id = ?`,
		in.cfg.Consumer, messageID).Error; err != nil {
		return wrapDB("unpark", err)
	}
	return nil
}

// ParkFailed records a failed attempt at applying a parked event.
func (in *Inbox) ParkFailed(ctx context.Context, messageID string, cause error) error {
	if err := in.db.WithContext(ctx).Exec(`UPDATE inbox_parked SET attempts = attempts + 1, last_error = ?
WHERE consumer = ? AND message_id = ?`, cause.Error(), in.cfg.Consumer, messageID).Error; err != nil {
		return wrapDB("record parked failure", err)
	}
	return nil
}

// ExpireParked turns the events that have been waiting for their
// predecessor since before cutoff into gap dead letters (ParkedWaiting to
// ParkedGap) and returns them.
func (in *Inbox) ExpireParked(ctx context.Context, cutoff time.Time) ([]Parked, error) {
	var rows []parkedRow
	err := in.db.WithContext(ctx).Raw(`UPDATE inbox_parked SET reason = ?
WHERE consumer = ? AND reason = ? AND parked_at < ? RETURNING `+parkedColumns,
		ParkedGap, in.cfg.Consumer, ParkedWaiting, cutoff.UTC()).Scan(&rows).Error
	if err != nil {
		return nil, wrapDB("expire parked", err)
	}
	return parkedAll(rows)
}

// skipGap, under VersionsContiguous, moves an aggregate's watermark up to
// just below its first parked event when that event waits for versions
// that were never applied: the operator gave them up (Release). With first
// set, it does so only when first is that event's message id and the
// aggregate has no hold. It runs in tx and reports whether it moved the
// watermark.
func (in *Inbox) skipGap(tx *gorm.DB, agg Aggregate, first string) (skipped bool, err error) {
	if in.cfg.Versions != VersionsContiguous {
		return false, nil
	}
	next, err := in.nextParked(tx, agg)
	if err != nil || next == nil || (first != "" && next.MessageID != first) {
		return false, err
	}
	if first != "" {
		if h, err := in.holdOf(tx, agg); err != nil || h != nil {
			return false, err
		}
	}
	k := aggKey{agg.TenantID, agg.Type, agg.ID}
	rows, err := in.upsertMarks(tx, []aggKey{k}, []int64{0}, "inbox_watermarks.version", "RETURNING version")
	if err != nil || len(rows) != 1 {
		return false, wrapDB("read watermark", errors.Join(err, fmt.Errorf("%d rows", len(rows))))
	}
	mark := rows[0].Version
	if next.Version-1 <= mark {
		return false, nil
	}
	if _, err := in.upsertMarks(tx, []aggKey{k}, []int64{next.Version - 1}, "excluded.version", ""); err != nil {
		return false, wrapDB("skip gap", err)
	}
	in.log.Warn("released an aggregate waiting for lost versions; they will be skipped",
		"tenant_id", agg.TenantID, "aggregate_type", agg.Type, "aggregate_id", agg.ID,
		"from_version", mark+1, "to_version", next.Version-1)
	return true, nil
}

// defaultTenant returns tid, or tenant.Default when it is empty.
func defaultTenant(tid string) string {
	if tid == "" {
		return tenant.Default
	}
	return tid
}

// ParkedCounts returns how many events are parked, by reason.
func (in *Inbox) ParkedCounts(ctx context.Context) (map[string]int, error) {
	var rows []struct {
		Reason string
		N      int
	}
	if err := in.db.WithContext(ctx).Raw(`SELECT reason, count(*) AS n FROM inbox_parked WHERE consumer = ? GROUP BY reason`,
		in.cfg.Consumer).Scan(&rows).Error; err != nil {
		return nil, wrapDB("count parked", err)
	}
	out := make(map[string]int, len(rows))
	for _, r := range rows {
		out[r.Reason] = r.N
	}
	return out, nil
}
