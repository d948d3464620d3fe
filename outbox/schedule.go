package outbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/clip"
	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/wire"
	"github.com/bentoevents/bento/tenant"
)

// Scheduled messages: a message written now, within the writer's
// transaction, to be relayed when it falls due. It waits in its own table
// (outbox_scheduled) until then; a projector moves it into outbox_events
// when the database's clock reaches its due time ([Store.ReleaseDue]) and
// relays it like any event: at least once, confirmed, retried, dead after
// the configured attempts. A scheduled message belongs to no aggregate, so
// it neither waits for an aggregate's events nor holds them back.

var (
	// ErrNotScheduled is returned by Cancel when no scheduled message has
	// the key: none was scheduled under it, or the ones that were have been
	// released and then removed by retention, or cancelled already.
	ErrNotScheduled = errors.New("outbox: no scheduled message has that key")
	// ErrCancelTooLate is returned by Cancel when every message scheduled
	// under the key was already released for delivery: the cancel lost the
	// race, and the message is, or will be, delivered. Handle it as the
	// message arriving anyway, for instance by checking state when it does.
	ErrCancelTooLate = errors.New("outbox: scheduled message already released for delivery")
)

// MaxScheduleKeyLen bounds a schedule key.
const MaxScheduleKeyLen = 255

// Due is when a scheduled message falls due: [At] a time or [After] a
// delay. Either is read by the database's clock on PostgreSQL (so a
// writer's skewed clock moves no due time), and by the host's on SQLite.
type Due struct {
	at    time.Time
	after time.Duration
	rel   bool
}

// At is due at t. A time already past is due at once.
func At(t time.Time) Due { return Due{at: t} }

// After is due d after the database's current time, when the write runs.
func After(d time.Duration) Due { return Due{after: d, rel: true} }

// String says when d falls due.
func (d Due) String() string {
	if d.rel {
		return "after " + d.after.String()
	}
	return "at " + d.at.UTC().Format(time.RFC3339Nano)
}

// check reports what is wrong with d, or "".
func (d Due) check() string {
	switch {
	case d.rel && d.after < 0:
		return fmt.Sprintf("delay %v is negative", d.after)
	case !d.rel && d.at.IsZero():
		return "has no time (use outbox.At or outbox.After)"
	}
	return ""
}

// ScheduleOpts are the optional fields of [Store.Schedule]. A nil
// *ScheduleOpts means none.
type ScheduleOpts struct {
	// Tenant is the message's tenant. Defaults to the tenant in ctx
	// (tenant.With), then tenant.Default.
	Tenant string
	// Key names the message for [Store.Cancel]: printable, at most
	// MaxScheduleKeyLen bytes. Several messages may share a key; a cancel
	// takes every one still waiting. Empty: the message cannot be
	// cancelled by key.
	Key string
	// PartitionKey chooses the consumer partition the message goes to
	// (messaging.MetaPartitionKey), so that a message about an order
	// reaches the partition that handles the order's other messages.
	// Defaults to the message's id: any partition.
	PartitionKey string
	// SchemaVersion is the payload's schema version. Defaults to 1.
	SchemaVersion int
	// Metadata is merged over the metadata in ctx (WithMetadata).
	Metadata Metadata
	// OccurredAt is when what the message reports happened. Defaults to
	// now, the time of the write.
	OccurredAt time.Time
}

// ScheduledMessage is a message written by [Store.Schedule].
type ScheduledMessage struct {
	// ID is the id the message is relayed with (its event id).
	ID       string
	TenantID string
	Topic    string
	Key      string
	// DueAt is when it falls due, as the database computed it.
	DueAt time.Time
	// Payload is the message's JSON; CreatedAt when it was scheduled. Only
	// ListScheduled fills them.
	Payload   JSON
	CreatedAt time.Time
}

// ScheduledFilter narrows [Store.ListScheduled].
type ScheduledFilter struct {
	// Tenant and Key, when set, keep the messages of that tenant and key.
	Tenant, Key string
	// Limit is the most messages returned. Defaults to 100.
	Limit int
}

// ListScheduled returns the scheduled messages still waiting that f
// selects, first due first.
//
// Errors: ErrClosed, or the database error.
func (s *Store) ListScheduled(ctx context.Context, f ScheduledFilter) ([]ScheduledMessage, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	args := map[string]any{"tenant": f.Tenant, "key": f.Key, "limit": f.Limit}
	rows, err := s.db.WithContext(ctx).Raw(listScheduledSQL(f.Tenant != "", f.Key != ""), args).Rows()
	if err != nil {
		return nil, wrapDB("outbox: list scheduled", err)
	}
	defer rows.Close()
	var out []ScheduledMessage
	for rows.Next() {
		var (
			m            ScheduledMessage
			payload      []byte
			due, created any
		)
		if err := rows.Scan(&m.ID, &m.TenantID, &m.Topic, &m.Key, &payload, &due, &created); err != nil {
			return nil, wrapDB("outbox: list scheduled", err)
		}
		m.Payload = JSON(payload)
		if m.DueAt, err = dbTime(due); err != nil {
			return nil, fmt.Errorf("outbox: list scheduled: %w", err)
		}
		if m.CreatedAt, err = dbTime(created); err != nil {
			return nil, fmt.Errorf("outbox: list scheduled: %w", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, wrapDB("outbox: list scheduled", err)
	}
	return out, nil
}

// Schedule writes, within tx, the caller's transaction, a message with
// topic and payload that a projector relays once due: it commits or rolls
// back with the caller's other writes, and nothing of it is visible to
// consumers before it falls due. payload is encoded as with
// [EncodePayload] and checked as [Store.Add] checks an event.
//
// Errors: a *ValidationError wrapping ErrInvalidEvent (also for a bad due
// time or key), ErrPayloadTooLarge, ErrMetadataTooLarge or
// tenant.ErrInvalid; ErrClosed; or the database error. Nothing is written
// when Schedule returns an error.
func (s *Store) Schedule(ctx context.Context, tx *gorm.DB, topic string, payload any, due Due, opts *ScheduleOpts) (*ScheduledMessage, error) {
	if opts == nil {
		opts = &ScheduleOpts{}
	}
	if tx == nil {
		return nil, errors.New("outbox: schedule: nil transaction")
	}
	if r := due.check(); r != "" {
		return nil, &ValidationError{Topic: topic, Field: "due_at", Reason: r, Err: ErrInvalidEvent}
	}
	if opts.Key != "" {
		if r := checkPrintable(opts.Key, MaxScheduleKeyLen); r != "" {
			return nil, &ValidationError{Topic: topic, Field: "schedule_key", Reason: fmt.Sprintf("%q %s", clip.String(opts.Key), r), Err: ErrInvalidEvent}
		}
	}
	body, err := EncodePayload(payload)
	if err != nil {
		return nil, &ValidationError{Topic: topic, Field: "payload", Reason: "cannot be encoded as JSON", Err: err}
	}
	tid, err := tenant.Resolve(ctx, opts.Tenant, "")
	if err != nil {
		return nil, &ValidationError{Topic: topic, Field: "tenant_id", Reason: "is invalid", Err: err}
	}
	md := opts.Metadata
	if opts.PartitionKey != "" {
		md = Metadata{}
		for k, v := range opts.Metadata {
			md[k] = v
		}
		md[wire.PartitionKey] = opts.PartitionKey
	}
	m := &Message{TenantID: tid, Topic: topic, SchemaVersion: opts.SchemaVersion, Payload: body,
		Metadata: s.traceInto(ctx, md), OccurredAt: opts.OccurredAt}
	if err := s.Prepare(ctx, []*Message{m}); err != nil {
		return nil, err
	}
	when := any(due.at.UTC())
	if due.rel {
		when = s.dueClock.in(due.after)
	}
	args := map[string]any{
		"id": m.ID, "tenant": m.TenantID, "topic": m.Topic, "key": opts.Key, "schema_version": m.SchemaVersion,
		"payload": m.Payload, "metadata": m.Metadata, "occurred_at": m.OccurredAt, "created_at": m.CreatedAt,
		"due": when, "size": m.SizeBytes,
	}
	var dueAt any
	if err := tx.WithContext(ctx).Raw(scheduleSQL, args).Row().Scan(&dueAt); err != nil {
		return nil, wrapDB("outbox: schedule", err)
	}
	t, err := dbTime(dueAt)
	if err != nil {
		return nil, fmt.Errorf("outbox: schedule: due time: %w", err)
	}
	return &ScheduledMessage{ID: m.ID, TenantID: m.TenantID, Topic: m.Topic, Key: opts.Key, DueAt: t}, nil
}

// CancelOpts are the optional fields of [Store.Cancel]. A nil *CancelOpts
// means none.
type CancelOpts struct {
	// Tenant is the tenant whose messages the key names. Defaults to the
	// tenant in ctx (tenant.With), then tenant.Default.
	Tenant string
}

// Cancel deletes, within tx, every message scheduled under key that is
// still waiting, and returns how many it deleted. Once tx commits, none of
// them is delivered. A message a projector is releasing at that moment is
// waited for: on PostgreSQL the delete blocks until the release commits,
// and then finds the message released.
//
// When nothing waiting has the key, Cancel returns ErrCancelTooLate if a
// message scheduled under it was already released (it is, or will be,
// delivered), and ErrNotScheduled otherwise. Errors besides: a
// *ValidationError wrapping tenant.ErrInvalid, ErrClosed, or the database
// error.
func (s *Store) Cancel(ctx context.Context, tx *gorm.DB, key string, opts *CancelOpts) (int64, error) {
	if opts == nil {
		opts = &CancelOpts{}
	}
	if tx == nil {
		return 0, errors.New("outbox: cancel: nil transaction")
	}
	tid, err := tenant.Resolve(ctx, opts.Tenant, "")
	if err != nil {
		return 0, &ValidationError{Field: "tenant_id", Reason: "is invalid", Err: err}
	}
	if key == "" {
		return 0, fmt.Errorf("outbox: cancel: %w: empty key", ErrNotScheduled)
	}
	args := map[string]any{"tenant": tid, "key": key}
	res := tx.WithContext(ctx).Exec(cancelSQL, args)
	if res.Error != nil {
		return 0, wrapDB("outbox: cancel", res.Error)
	}
	if res.RowsAffected > 0 {
		return res.RowsAffected, nil
	}
	var released int64
	if err := tx.WithContext(ctx).Raw(countKeySQL, args).Scan(&released).Error; err != nil {
		return 0, wrapDB("outbox: cancel", err)
	}
	if released > 0 {
		return 0, fmt.Errorf("outbox: cancel %q (tenant %s): %w", key, tid, ErrCancelTooLate)
	}
	return 0, fmt.Errorf("outbox: cancel %q (tenant %s): %w", key, tid, ErrNotScheduled)
}

// ReleaseOpts are the arguments of [Store.ReleaseDue].
type ReleaseOpts struct {
	// Tenant restricts the release to one tenant's messages (a projector
	// with a tenant releases its tenant's only). Empty: every tenant.
	Tenant string
	// Limit is the most messages one call releases. Defaults to 500.
	Limit int
	// MaxBytes, when positive, bounds the payload and metadata bytes of the
	// messages released together; the first due is released whatever its
	// size. Zero means no bound.
	MaxBytes int64
	// Worker, when set, leases the released messages to that worker for
	// Lease, as Store.Claim would, and returns them in Release.Leased, so
	// the worker publishes them without a claim of their own. Its outcomes
	// are recorded as a claim's: MarkSent, Fail, Release.
	Worker string
	// Lease is how long the released messages stay leased to Worker, by
	// the database's clock. Required with Worker.
	Lease time.Duration
}

// Release is what [Store.ReleaseDue] did.
type Release struct {
	// Released is how many messages it moved into the outbox.
	Released int
	// Next is how long until the next waiting message falls due (zero or
	// less: due already; zero after a full batch, which may have left more
	// due). Valid when Waiting.
	Next time.Duration
	// Waiting reports whether any message still waits.
	Waiting bool
	// Late is, for each message released, how long after its due time it
	// was released, by the database's clock.
	Late []time.Duration
	// Leased are the messages released, leased to ReleaseOpts.Worker, in
	// due order; empty without a Worker.
	Leased []*Message
}

// defaultReleaseLimit is ReleaseOpts.Limit's default.
const defaultReleaseLimit = 500

// ReleaseDue moves the scheduled messages that are due by the database's
// clock into the outbox, first due first, in one transaction: each becomes
// a new outbox row with its scheduled id, due at its due time, its
// metadata carrying that time (messaging.MetaDueAt), for the next claim,
// or, with opts.Worker, already leased to that worker and returned.
// Projectors call it before they claim; several may run it at once (on
// PostgreSQL each takes different rows). It also reports when the next
// waiting message falls due, so a projector can sleep until then.
//
// Errors: ErrInvalidClaim for a Worker without a positive Lease or a
// negative MaxBytes, ErrClosed, or the database error; nothing is
// released then.
func (s *Store) ReleaseDue(ctx context.Context, opts ReleaseOpts) (Release, error) {
	if opts.MaxBytes < 0 || opts.Worker != "" && opts.Lease <= 0 {
		return Release{}, fmt.Errorf("%w: release for worker %q, lease %v, max bytes %d",
			ErrInvalidClaim, opts.Worker, opts.Lease, opts.MaxBytes)
	}
	limit := opts.Limit
	if limit <= 0 {
		limit = defaultReleaseLimit
	}
	maxBytes := opts.MaxBytes
	if maxBytes == 0 {
		maxBytes = math.MaxInt64
	}
	args := map[string]any{"now": s.clock.now(), "due_now": s.dueClock.now(), "tenant": opts.Tenant,
		"limit": limit, "max_bytes": maxBytes}
	if opts.Worker != "" {
		args["worker"], args["until"] = opts.Worker, s.clock.in(opts.Lease)
	}
	var (
		out Release
		err error
	)
	if s.dialect == dialect.Postgres {
		out.Late, out.Leased, err = s.releasePostgres(ctx, args)
	} else {
		out.Late, out.Leased, err = s.releaseSQLite(ctx, args)
	}
	if err != nil {
		return Release{}, wrapDB("outbox: release due", err)
	}
	out.Released = len(out.Late)
	if out.Released == limit {
		// A full batch: more may be due already, so look again at once
		// rather than spend a statement on when.
		out.Waiting = true
		return out, nil
	}
	out.Next, out.Waiting, err = s.nextDue(ctx, args)
	if err != nil {
		return out, wrapDB("outbox: release due: next due time", err)
	}
	return out, nil
}

// releasePostgres releases in one statement and returns how late each
// released message is, and the messages when they were leased.
func (s *Store) releasePostgres(ctx context.Context, args map[string]any) ([]time.Duration, []*Message, error) {
	leased := args["worker"] != nil
	rows, err := s.db.WithContext(ctx).Raw(pgReleaseDueSQL(args["tenant"] != "", leased), args).Rows()
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var (
		late []time.Duration
		msgs []*Message
	)
	for rows.Next() {
		var secs float64
		if leased {
			m, _, err := scanClaimed(rows, &secs)
			if err != nil {
				return nil, nil, err
			}
			msgs = append(msgs, m)
		} else if err := rows.Scan(&secs); err != nil {
			return nil, nil, err
		}
		late = append(late, seconds(secs))
	}
	return late, msgs, rows.Err()
}

// releaseSQLite marks and copies in two statements of one transaction,
// which SQLite runs alone (its first statement writes), and then reads the
// copies when they were leased.
func (s *Store) releaseSQLite(ctx context.Context, args map[string]any) ([]time.Duration, []*Message, error) {
	leased := args["worker"] != nil
	var (
		late []time.Duration
		msgs []*Message
	)
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		rows, err := tx.Raw(sqliteReleaseMarkSQL(args["tenant"] != ""), args).Rows()
		if err != nil {
			return err
		}
		type marked struct {
			id  string
			due time.Time
		}
		var got []marked
		for rows.Next() {
			var (
				m  marked
				at any
			)
			if err := rows.Scan(&m.id, &at); err != nil {
				rows.Close()
				return err
			}
			if m.due, err = dbTime(at); err != nil {
				rows.Close()
				return err
			}
			got = append(got, m)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return err
		}
		if len(got) == 0 {
			return nil
		}
		// Due order, which RETURNING does not promise.
		sort.Slice(got, func(a, b int) bool {
			return got[a].due.Before(got[b].due) || got[a].due.Equal(got[b].due) && got[a].id < got[b].id
		})
		now := s.dueClock.goNow()
		ids := make([]string, len(got))
		for i, m := range got {
			ids[i] = m.id
			late = append(late, now.Sub(m.due))
		}
		copyArgs := map[string]any{"now": args["now"], "ids": ids, "worker": args["worker"], "until": args["until"]}
		res := tx.Exec(sqliteReleaseCopySQL(leased), copyArgs)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected != int64(len(ids)) {
			return fmt.Errorf("released %d scheduled messages, wrote %d outbox rows", len(ids), res.RowsAffected)
		}
		if leased {
			msgs, _, err = readClaim(tx, copyArgs, sqliteLeasedSQL, nil)
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return late, msgs, nil
}

// nextDue returns how long until the first waiting message falls due, and
// whether one waits.
func (s *Store) nextDue(ctx context.Context, args map[string]any) (time.Duration, bool, error) {
	query := nextDueSQL(s.dialect, args["tenant"] != "")
	q := s.db.WithContext(ctx).Raw(query, bind(query, args)...)
	if s.dialect == dialect.Postgres {
		var secs []float64
		if err := q.Scan(&secs).Error; err != nil {
			return 0, false, err
		}
		if len(secs) == 0 {
			return 0, false, nil
		}
		return seconds(secs[0]), true, nil
	}
	rows, err := q.Rows()
	if err != nil {
		return 0, false, err
	}
	defer rows.Close()
	if !rows.Next() {
		return 0, false, rows.Err()
	}
	var due any
	if err := rows.Scan(&due); err != nil {
		return 0, false, err
	}
	t, err := dbTime(due)
	if err != nil {
		return 0, false, err
	}
	return t.Sub(s.dueClock.goNow()), true, nil
}

// seconds converts a count of seconds to a Duration, saturating.
func seconds(f float64) time.Duration {
	d := f * float64(time.Second)
	switch {
	case d >= math.MaxInt64:
		return math.MaxInt64
	case d <= math.MinInt64:
		return math.MinInt64
	}
	return time.Duration(d)
}

// ScheduledBacklog is what [Store.ScheduledBacklog] reports.
type ScheduledBacklog struct {
	// Waiting counts the scheduled messages not yet released.
	Waiting int64
	// FirstDue is the earliest due time among them; zero when none waits.
	FirstDue time.Time
	// Overdue is how long past FirstDue it is by the Store's clock, zero
	// when FirstDue has not come: a message that waits past its due time
	// means the relay is behind or not running.
	Overdue time.Duration
}

// ScheduledBacklog counts the scheduled messages still waiting (of tenant,
// or of every tenant when it is empty) and finds the first due time. A
// message whose due time has passed while it still waits is late: the
// relay is behind, or not running.
//
// Errors: ErrClosed, or the database error.
func (s *Store) ScheduledBacklog(ctx context.Context, tenant string) (ScheduledBacklog, error) {
	var (
		n     int64
		first any
	)
	query := scheduledBacklogSQL(tenant != "")
	err := s.db.WithContext(ctx).Raw(query, bind(query, map[string]any{"tenant": tenant})...).Row().Scan(&n, &first)
	if err != nil {
		return ScheduledBacklog{}, wrapDB("outbox: scheduled backlog", err)
	}
	out := ScheduledBacklog{Waiting: n}
	if first != nil {
		t, err := dbTime(first)
		if err != nil {
			return ScheduledBacklog{}, fmt.Errorf("outbox: scheduled backlog: first due time: %w", err)
		}
		out.FirstDue = t
		out.Overdue = max(s.dueClock.goNow().Sub(t), 0)
	}
	return out, nil
}

// dbTime reads a timestamp as a driver returns it: a time.Time, or the
// text SQLite keeps (see parseDBTime).
func dbTime(v any) (time.Time, error) {
	switch t := v.(type) {
	case time.Time:
		return t.UTC(), nil
	case string:
		return parseDBTime(t)
	case []byte:
		return parseDBTime(string(t))
	}
	return time.Time{}, fmt.Errorf("unexpected timestamp %T", v)
}
