package inbox

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/tracing"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
	"github.com/bentoevents/bento/uow"
)

// MaxBatch bounds how many messages ApplyBatch takes at once.
const MaxBatch = 1000

// ErrBatchTooLarge is returned by ApplyBatch for more than MaxBatch
// messages.
var ErrBatchTooLarge = fmt.Errorf("inbox: more than %d messages in a batch", MaxBatch)

// entry is one message on its way through apply.
type entry struct {
	msg  *message.Message
	ctx  context.Context // the consumer span's
	span trace.Span
	tid  string
	agg  aggregateRef
	// Set by apply: the handler's context, whether it was applied or
	// skipped as a duplicate, and a panic its handler raised.
	hctx     context.Context
	applied  bool
	skipped  string
	panicked any
}

// aggKey is an aggregate of a tenant, as the watermark table keys it.
type aggKey struct{ tid, typ, id string }

func (e *entry) key() aggKey { return aggKey{e.tid, e.agg.typ, e.agg.id} }

// check validates msg and returns its entry: a usable id, a valid tenant
// and, unless the versions are ignored, a well-formed aggregate version.
func (in *Inbox) check(msg *message.Message) (*entry, error) {
	if msg.UUID == "" || len(msg.UUID) > MaxMessageIDLen {
		return nil, fmt.Errorf("%w: %q", ErrNoMessageID, msg.UUID)
	}
	e := &entry{msg: msg, tid: defaultTenant(msg.Metadata.Get(messaging.MetaTenantID))}
	if err := tenant.Validate(e.tid); err != nil {
		return nil, fmt.Errorf("inbox: message %s: %w: %w", msg.UUID, messaging.ErrMalformedMessage, err)
	}
	if in.cfg.Versions != VersionsIgnored {
		var err error
		if e.agg, err = aggregateOf(msg); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// ApplyBatch applies msgs, in order, each at most once, in one transaction:
// one multi-row insert records them all in inbox_messages (the duplicates
// are skipped), one statement locks the version watermarks of their
// aggregates (unless Config.Versions is VersionsIgnored), h runs for each
// new message with the transaction in its message's context, as under
// Middleware, and one statement moves the watermarks before the commit.
//
// It stops at the first message that fails (its handler returns an error
// or panics, it is malformed, or, under VersionsContiguous, its
// predecessor has not been applied) and commits the messages before it,
// exactly once: the transaction is rolled back and those messages applied
// again without it, so a failure costs a second run of the handlers before
// it, never a statement per message. It returns how many of msgs were
// settled (applied, or skipped as duplicates), all committed, and the error
// of msgs[settled] when settled < len(msgs). Messages after the failed one
// are not tried. Acknowledge msgs[:settled] only: the others must be
// delivered again.
//
// A handler's panic is returned as a middleware.RecoveredPanicError.
// Messages its handlers return are dropped: emit events through a unit of
// work instead.
//
// Errors: ErrBatchTooLarge, and those of Middleware.
func (in *Inbox) ApplyBatch(ctx context.Context, msgs []*message.Message, h message.HandlerFunc) (settled int, err error) {
	if len(msgs) > MaxBatch {
		return 0, ErrBatchTooLarge
	}
	es := make([]*entry, 0, len(msgs))
	var bad error
	for _, msg := range msgs {
		e, err := in.check(msg)
		if err != nil {
			bad = err
			break
		}
		es = append(es, e)
	}
	n, _, err := in.apply(ctx, es, h)
	for i, e := range es {
		if i == n {
			in.endSpan(e, err)
		}
		in.endSpan(e, nil)
	}
	if err != nil {
		return n, err
	}
	return n, bad
}

// apply applies es in one transaction, in order, stopping at the first
// failure, and commits what came before it (see ApplyBatch). It returns
// the number of entries settled and committed, the messages their handlers
// produced, and the failure of es[settled].
func (in *Inbox) apply(ctx context.Context, es []*entry, h message.HandlerFunc) (int, []*message.Message, error) {
	if len(es) == 0 {
		return 0, nil, nil
	}
	for _, e := range es {
		e.applied, e.skipped, e.hctx = false, "", nil
	}
	begun := in.db.WithContext(ctx).Begin(in.cfg.TxOptions)
	if begun.Error != nil {
		return 0, nil, wrapDB("begin", begun.Error)
	}
	owned := uow.Own(begun)
	defer owned.Rollback() // after Commit, nothing
	tx := owned.Tx()
	if in.cfg.BeginTx != nil {
		if err := in.cfg.BeginTx(tx); err != nil {
			return 0, nil, wrapDB("begin", err)
		}
	}
	fresh, err := in.record(tx, es)
	if err != nil {
		return 0, nil, err
	}
	marks, err := in.lockMarks(tx, es, fresh)
	if err != nil {
		return 0, nil, err
	}
	var (
		produced []*message.Message
		moved    = map[aggKey]int64{}
		unrecord []string
		failAt   = len(es)
		failure  error
	)
	for i, e := range es {
		if !fresh[e.msg.UUID] {
			e.skipped = "duplicate skipped"
			continue
		}
		delete(fresh, e.msg.UUID) // a second delivery in the same batch is a duplicate
		if e.agg.id != "" {
			mark := marks[e.key()]
			if e.agg.version <= mark {
				if e.msg.Metadata.Get(messaging.MetaReplays) != "" {
					failAt, failure = i, fmt.Errorf("%w: %s %s version %d, last applied %d", ErrStale, e.agg.typ, e.agg.id, e.agg.version, mark)
					break
				}
				e.skipped = skippedByWatermark
				unrecord = append(unrecord, e.msg.UUID)
				continue
			}
			if in.cfg.Versions == VersionsContiguous && e.agg.version > mark+1 {
				failAt, failure = i, fmt.Errorf("%w: %s %s version %d, last applied %d", ErrGap, e.agg.typ, e.agg.id, e.agg.version, mark)
				break
			}
		}
		out, err := in.handle(owned, e, h)
		if err != nil {
			failAt, failure = i, err
			break
		}
		produced = append(produced, out...)
		e.applied = true
		if e.agg.id != "" {
			marks[e.key()], moved[e.key()] = e.agg.version, e.agg.version
		}
	}
	if failAt < len(es) {
		owned.Rollback()
		if !slices.ContainsFunc(es[:failAt], func(e *entry) bool { return e.applied }) {
			in.settle(es[:failAt])
			return failAt, nil, failure
		}
		// Commit the ones before the failure without it.
		n, out, err := in.apply(ctx, es[:failAt], h)
		if err != nil {
			return n, out, err
		}
		return failAt, out, failure
	}
	if !slices.ContainsFunc(es, func(e *entry) bool { return e.applied }) {
		in.settle(es) // nothing to commit: the duplicates' records are rolled back
		return len(es), nil, nil
	}
	if err := in.finish(tx, unrecord, moved); err != nil {
		return 0, nil, err
	}
	if in.cfg.BeforeCommit != nil {
		if err := in.cfg.BeforeCommit(tx); err != nil {
			return 0, nil, wrapDB("before commit", err)
		}
	}
	if err := owned.Commit(); err != nil { // then the AfterCommit hooks of the handlers' units
		return 0, nil, wrapDB("commit", err)
	}
	in.settle(es)
	return len(es), produced, nil
}

// record inserts the inbox records of es in one statement and returns the
// ids that were not there yet.
func (in *Inbox) record(tx *gorm.DB, es []*entry) (map[string]bool, error) {
	args := make([]any, 0, 4*len(es))
	now := in.cfg.Clock.Now().UTC()
	for _, e := range es {
		args = append(args, in.cfg.Consumer, e.msg.UUID, e.tid, now)
	}
	sql := "INSERT INTO inbox_messages (consumer, message_id, tenant_id, received_at) VALUES " +
		dialect.Tuples(len(es), 4) + " ON CONFLICT DO NOTHING RETURNING message_id"
	var ids []string
	if err := tx.Raw(sql, args...).Scan(&ids).Error; err != nil {
		return nil, wrapDB("record messages", err)
	}
	fresh := make(map[string]bool, len(ids))
	for _, id := range ids {
		fresh[id] = true
	}
	return fresh, nil
}

// lockMarks locks (creating at 0) the watermark rows of the aggregates of
// the fresh entries, in key order, and returns their versions.
func (in *Inbox) lockMarks(tx *gorm.DB, es []*entry, fresh map[string]bool) (map[aggKey]int64, error) {
	var keys []aggKey
	for _, e := range es {
		if e.agg.id != "" && fresh[e.msg.UUID] && !slices.Contains(keys, e.key()) {
			keys = append(keys, e.key())
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	slices.SortFunc(keys, func(a, b aggKey) int {
		return strings.Compare(a.tid+"\x00"+a.typ+"\x00"+a.id, b.tid+"\x00"+b.typ+"\x00"+b.id)
	})
	versions := make([]int64, len(keys))
	rows, err := in.upsertMarks(tx, keys, versions, "inbox_watermarks.version",
		"RETURNING tenant_id, aggregate_type, aggregate_id, version")
	if err != nil {
		return nil, wrapDB("read watermarks", err)
	}
	marks := make(map[aggKey]int64, len(rows))
	for _, r := range rows {
		marks[aggKey{r.TenantID, r.AggregateType, r.AggregateID}] = r.Version
	}
	return marks, nil
}

// markRow is a watermark row as upsertMarks returns it.
type markRow struct {
	TenantID, AggregateType, AggregateID string
	Version                              int64
}

// upsertMarks inserts the watermark rows of keys at versions, or on
// conflict sets version to onConflict, in one statement.
func (in *Inbox) upsertMarks(tx *gorm.DB, keys []aggKey, versions []int64, onConflict, returning string) ([]markRow, error) {
	args := make([]any, 0, 6*len(keys))
	now := in.cfg.Clock.Now().UTC()
	for i, k := range keys {
		args = append(args, in.cfg.Consumer, k.tid, k.typ, k.id, versions[i], now)
	}
	sql := "INSERT INTO inbox_watermarks (consumer, tenant_id, aggregate_type, aggregate_id, version, updated_at) VALUES " +
		dialect.Tuples(len(keys), 6) +
		" ON CONFLICT (consumer, tenant_id, aggregate_type, aggregate_id) DO UPDATE SET version = " + onConflict +
		", updated_at = excluded.updated_at " + returning
	var rows []markRow
	if returning == "" {
		return nil, tx.Exec(sql, args...).Error
	}
	return rows, tx.Raw(sql, args...).Scan(&rows).Error
}

// finish deletes the records of the messages the watermark skipped and
// moves the watermarks of the aggregates applied.
func (in *Inbox) finish(tx *gorm.DB, unrecord []string, moved map[aggKey]int64) error {
	if len(unrecord) > 0 {
		if err := tx.Exec("DELETE FROM inbox_messages WHERE consumer = ? AND message_id IN ?", in.cfg.Consumer, unrecord).Error; err != nil {
			return wrapDB("unrecord duplicates", err)
		}
	}
	if len(moved) == 0 {
		return nil
	}
	keys := make([]aggKey, 0, len(moved))
	versions := make([]int64, 0, len(moved))
	for k, v := range moved {
		keys = append(keys, k)
		versions = append(versions, v)
	}
	if _, err := in.upsertMarks(tx, keys, versions, "excluded.version", ""); err != nil {
		return wrapDB("advance watermarks", err)
	}
	return nil
}

// handle runs h for e inside tx, with the context Middleware documents; a
// panic is returned as an error and kept in e.
func (in *Inbox) handle(owned *uow.Owned, e *entry, h message.HandlerFunc) (out []*message.Message, err error) {
	if e.span == nil {
		e.ctx, e.span = in.startConsume(e.msg.Context(), e.msg)
	}
	corr := e.msg.Metadata.Get(messaging.MetaCorrelationID)
	if corr == "" {
		corr = e.msg.UUID
	}
	hctx := owned.Join(e.ctx)
	hctx = tenant.With(hctx, e.tid)
	hctx = outbox.WithMetadata(hctx, outbox.Metadata{
		messaging.MetaCorrelationID: corr,
		messaging.MetaCausationID:   e.msg.UUID,
	})
	e.hctx = hctx
	orig := e.msg.Context()
	e.msg.SetContext(hctx)
	defer e.msg.SetContext(orig)
	defer func() {
		if p := recover(); p != nil {
			e.panicked = p
			err = middleware.RecoveredPanicError{V: p, Stacktrace: string(debug.Stack())}
		}
	}()
	return h(e.msg)
}

// skippedByWatermark is the log line of a message at or below its
// aggregate's watermark with no record of its own: a duplicate whose
// record was purged, or an event this consumer never applied (one the
// watermark was moved past by a release). It is logged at Warn level.
const skippedByWatermark = "skipped by the version watermark, with no record of the message: " +
	"a duplicate whose record was purged, or an event this consumer never applied"

// settle runs the after-commit hooks of the applied entries, counts them,
// and counts and logs the duplicates.
func (in *Inbox) settle(es []*entry) {
	for _, e := range es {
		switch {
		case e.applied:
			in.processed.Inc()
		case e.skipped != "":
			if e.span == nil {
				e.ctx, e.span = in.startConsume(e.msg.Context(), e.msg)
			}
			in.skipped(e.span, e.skipped, "message_id", e.msg.UUID, "event_type", e.msg.Metadata.Get(messaging.MetaEventType),
				"aggregate_id", e.agg.id, "version", e.agg.version)
		}
	}
}

// endSpan ends e's span, if it has one, as failed with err.
func (in *Inbox) endSpan(e *entry, err error) {
	if e.span != nil {
		tracing.End(e.span, err)
		e.span = nil
	}
}
