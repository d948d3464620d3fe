package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/dberr"
	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/tenant"
)

// ErrNothingParked is returned by Inspector.Aggregate for an aggregate
// that has neither parked events nor a hold in the group.
var ErrNothingParked = errors.New("consumer: the aggregate has no parked events and no hold")

// InspectOpts configures an [Inspector]. A nil *InspectOpts is a zero one;
// a zero field means its default.
type InspectOpts struct {
	// Versions is the group's Config.Versions. Release gives up what holds
	// an aggregate back by it, as the group's consumers would: under
	// inbox.VersionsContiguous a release also skips the versions the
	// aggregate's first parked event waits for. Defaults to
	// inbox.VersionsIgnored, Config.Versions' default.
	Versions inbox.Versions
	// TakeoverTime is the group's Config.TakeoverTime: a member's last
	// heartbeat is its expiry less the time a heartbeat keeps it live,
	// three quarters of TakeoverTime. Defaults to DefaultTakeoverTime.
	TakeoverTime time.Duration
}

// Inspector shows a consumer group's parked events, holds and members,
// and releases held aggregates, from the database alone: it opens no
// broker connection, runs nothing and needs no Close. Consumer.Parked and
// Consumer.Release are its Parked and Release. It is safe for concurrent
// use.
type Inspector struct {
	group string
	db    *gorm.DB
	inbox *inbox.Inbox
	ttl   time.Duration
}

// Inspect returns an Inspector of consumer group group over db, which
// holds the inbox tables (inbox.Migrate). It checks that they exist, with
// one query.
//
// Errors: ErrInvalidConfig, inbox.ErrNotMigrated, or the database error.
func Inspect(db *gorm.DB, group string, opts *InspectOpts) (*Inspector, error) {
	var o InspectOpts
	if opts != nil {
		o = *opts
	}
	if o.TakeoverTime < 0 {
		return nil, fmt.Errorf("%w: TakeoverTime %v is negative", ErrInvalidConfig, o.TakeoverTime)
	}
	if o.TakeoverTime == 0 {
		o.TakeoverTime = DefaultTakeoverTime
	}
	if _, err := dialect.Of(db); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	in, err := inbox.New(db, &inbox.Config{Consumer: group, Versions: o.Versions})
	switch {
	case errors.Is(err, inbox.ErrInvalidConfig):
		return nil, fmt.Errorf("%w: group: %w", ErrInvalidConfig, err)
	case err != nil:
		return nil, fmt.Errorf("consumer %s: %w", group, err)
	}
	return &Inspector{group: group, db: db, inbox: in, ttl: memberTTL(o.TakeoverTime)}, nil
}

// inspector returns the Inspector of c's group, over c's own inbox.
func (c *Consumer) inspector() *Inspector {
	return &Inspector{group: c.cfg.Group, db: c.db, inbox: c.inbox, ttl: memberTTL(c.cfg.TakeoverTime)}
}

// Group returns the consumer group i inspects.
func (i *Inspector) Group() string { return i.group }

// Parked returns up to limit events the group parked instead of applying
// them out of order that f selects, oldest first (one aggregate's, in
// version order): those waiting behind a dead letter or a parked
// predecessor (inbox.ParkedHeld), those waiting for a predecessor
// (inbox.ParkedWaiting), and those that waited past GapTimeout
// (inbox.ParkedGap).
//
// Errors: inbox.ErrInvalidArgument (a limit below 1, an unknown reason),
// inbox.ErrClosed, or the database error.
func (i *Inspector) Parked(ctx context.Context, f inbox.ParkedFilter, limit int) ([]inbox.Parked, error) {
	return i.inbox.ListParked(ctx, f, limit)
}

// Holds returns up to limit of the group's holds that f selects (its
// Reason aside), oldest first: aggregates held back behind a dead letter,
// whose later events are parked until it is replayed and applied or the
// hold is released.
//
// Errors: inbox.ErrInvalidArgument (a limit below 1, an unknown reason),
// inbox.ErrClosed, or the database error.
func (i *Inspector) Holds(ctx context.Context, f inbox.ParkedFilter, limit int) ([]inbox.Hold, error) {
	return i.inbox.ListHolds(ctx, f, limit)
}

// ParkedAggregate is what holds one aggregate back in a group.
type ParkedAggregate struct {
	Aggregate inbox.Aggregate
	// Hold is the dead letter the aggregate is held behind, or nil.
	Hold *inbox.Hold
	// Events are its first parked events, in version order.
	Events []inbox.Parked
}

// Release returns the message id Release gives up to let the aggregate's
// parked events go on: the hold's dead letter, or else the first parked
// event (which, under inbox.VersionsContiguous, waits for lost versions).
// It returns "" when nothing holds the aggregate back.
func (a *ParkedAggregate) Release() string {
	switch {
	case a.Hold != nil:
		return a.Hold.MessageID
	case len(a.Events) > 0:
		return a.Events[0].MessageID
	}
	return ""
}

// Aggregate returns agg's hold and up to limit of its parked events, in
// version order. An empty tenant means the default tenant, as in Release.
//
// Errors: ErrNothingParked, inbox.ErrInvalidArgument (no aggregate type or
// id, a limit below 1), inbox.ErrClosed, or the database error.
func (i *Inspector) Aggregate(ctx context.Context, agg inbox.Aggregate, limit int) (*ParkedAggregate, error) {
	if agg.Type == "" || agg.ID == "" {
		return nil, fmt.Errorf("%w: aggregate %q/%q: want a type and an id", inbox.ErrInvalidArgument, agg.Type, agg.ID)
	}
	if agg.TenantID == "" {
		agg.TenantID = tenant.Default
	}
	f := inbox.ParkedFilter{TenantID: agg.TenantID, AggregateType: agg.Type, AggregateID: agg.ID}
	events, err := i.Parked(ctx, f, limit)
	if err != nil {
		return nil, err
	}
	holds, err := i.Holds(ctx, f, 1)
	if err != nil {
		return nil, err
	}
	out := &ParkedAggregate{Aggregate: agg, Events: events}
	if len(holds) > 0 {
		out.Hold = &holds[0]
	}
	if out.Hold == nil && len(events) == 0 {
		return nil, fmt.Errorf("%w: %s %s/%s in %s", ErrNothingParked, agg.TenantID, agg.Type, agg.ID, i.group)
	}
	return out, nil
}

// Release gives up what holds agg back, named by messageID, so that its
// parked events go on; Consumer.Release says how. The consumer of the
// events' partition applies them within about a second. An empty tenant
// means the default tenant.
//
// Errors: ErrStaleRelease, inbox.ErrClosed, or the database error.
func (i *Inspector) Release(ctx context.Context, agg inbox.Aggregate, messageID string) error {
	return i.inbox.Release(ctx, agg, messageID)
}

// Member is a live instance of a partitioned consumer group.
type Member struct {
	// ID is the instance's member id: host, process and a random part.
	ID string
	// Partitions is the group's partition count the instance runs with.
	Partitions int
	// Owns are the partitions the instance owns, as it deals them itself
	// among the live members.
	Owns []int
	// LastBeat is when it last renewed its membership, Expires when the
	// membership lapses unless renewed (the database's clock).
	LastBeat, Expires time.Time
}

// Members returns the group's live members in member id order, with the
// partitions each owns: those its heartbeat deals it from the same rows.
// A group whose instances run with different partition counts, which they
// refuse (ErrPartitionMismatch), shows it in Member.Partitions.
//
// Errors: inbox.ErrClosed, or the database error.
func (i *Inspector) Members(ctx context.Context) ([]Member, error) {
	d, err := dialect.Of(i.db)
	if err != nil {
		return nil, err
	}
	var rows []struct {
		MemberID   string
		Partitions int
		ExpiresMs  int64
		NowMs      int64
	}
	if err := i.db.WithContext(ctx).Raw(`SELECT member_id, partitions, expires_ms, `+nowMillis(d)+` AS now_ms
FROM consumer_members WHERE consumer = ? ORDER BY member_id`, i.group).Scan(&rows).Error; err != nil {
		return nil, dberr.Wrap("consumer: members of "+i.group, err)
	}
	// Expired rows are deleted by the next beat: the live ones deal.
	var ids []string
	for _, r := range rows {
		if r.ExpiresMs >= r.NowMs {
			ids = append(ids, r.MemberID)
		}
	}
	out := make([]Member, 0, len(ids))
	for _, r := range rows {
		if !slices.Contains(ids, r.MemberID) {
			continue
		}
		exp := time.UnixMilli(r.ExpiresMs).UTC()
		out = append(out, Member{ID: r.MemberID, Partitions: r.Partitions, Owns: assign(r.Partitions, ids, r.MemberID),
			LastBeat: exp.Add(-i.ttl), Expires: exp})
	}
	return out, nil
}
