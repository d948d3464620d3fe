package console

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/process"
	"github.com/bentoevents/bento/rabbitmq"
	"github.com/bentoevents/bento/tenant"
)

// scope is how every page and action reaches what it shows or changes:
// the outbox and its scheduled messages, the process managers' processes,
// the consumer groups' dead letters, parked events, holds and members, and
// the unroutable queue (of RabbitMQ or the database bus).
// It is the one place that narrows them to Config.Tenant: with a tenant
// set, each read and change below selects that tenant's rows and messages
// only, whatever filter the handler passes. The handlers hold no store or
// broker of their own, and a test of the package fails when a file other
// than this one calls the outbox store or the dead-letter and unroutable
// functions.
type scope struct {
	// tenant is Config.Tenant: "" for every tenant.
	tenant     string
	store      *outbox.Store
	consumers  *Consumers
	unroutable *rabbitmq.Config
	// unroutableDB is the database bus's database, when the unroutable
	// page shows the database bus's kept messages.
	unroutableDB *gorm.DB
}

// outboxFilter returns f narrowed to the scope's tenant.
func (s scope) outboxFilter(f outbox.Filter) outbox.Filter {
	if s.tenant != "" {
		f.Tenant = s.tenant
	}
	return f
}

// statsOpts narrows the figures to t ("" for all), or to the scope's
// tenant when it has one.
func (s scope) statsOpts(t string) *outbox.StatsOpts {
	if s.tenant != "" {
		t = s.tenant
	}
	return &outbox.StatsOpts{Tenant: t}
}

func (s scope) listDead(ctx context.Context, f outbox.Filter, limit int) ([]outbox.Message, error) {
	return s.store.ListDead(ctx, s.outboxFilter(f), limit)
}

func (s scope) countDead(ctx context.Context, f outbox.Filter) (int64, error) {
	return s.store.CountDead(ctx, s.outboxFilter(f))
}

func (s scope) requeue(ctx context.Context, f outbox.Filter) (int64, error) {
	return s.store.Requeue(ctx, s.outboxFilter(f), false)
}

func (s scope) discard(ctx context.Context, f outbox.Filter) (int64, error) {
	return s.store.Discard(ctx, s.outboxFilter(f), false)
}

func (s scope) stats(ctx context.Context, t string) (*outbox.Stats, error) {
	return s.store.Stats(ctx, s.statsOpts(t))
}

func (s scope) breakdown(ctx context.Context, t string) ([]outbox.Group, error) {
	return s.store.Breakdown(ctx, s.statsOpts(t))
}

func (s scope) activity(ctx context.Context, minutes int, t string) ([]outbox.Minute, error) {
	return s.store.Activity(ctx, minutes, s.statsOpts(t))
}

// now is the store's clock.
func (s scope) now() time.Time { return s.store.Config().Clock.Now() }

// deadFilter returns f narrowed to the scope's tenant.
func (s scope) deadFilter(f consumer.DeadFilter) consumer.DeadFilter {
	if s.tenant != "" {
		f.TenantID = s.tenant
	}
	return f
}

// deadLetters returns the bus the groups' dead letters are on:
// Consumers.DeadLetters, or RabbitMQ.
func (s scope) deadLetters() *consumer.DeadLetters {
	if s.consumers.DeadLetters != nil {
		return s.consumers.DeadLetters
	}
	return consumer.RabbitMQDeadLetters(s.consumers.AMQP)
}

func (s scope) groupDead(ctx context.Context, group string, f consumer.DeadFilter, limit int) ([]consumer.DeadLetter, error) {
	return s.deadLetters().List(ctx, group, s.deadFilter(f), limit)
}

func (s scope) replayGroupDead(ctx context.Context, group string, f consumer.DeadFilter) ([]consumer.DeadLetter, error) {
	return s.deadLetters().Replay(ctx, group, s.deadFilter(f))
}

func (s scope) discardGroupDead(ctx context.Context, group string, f consumer.DeadFilter) ([]consumer.DeadLetter, error) {
	return s.deadLetters().Discard(ctx, group, s.deadFilter(f))
}

// parkedFilter returns f narrowed to the scope's tenant.
func (s scope) parkedFilter(f inbox.ParkedFilter) inbox.ParkedFilter {
	if s.tenant != "" {
		f.TenantID = s.tenant
	}
	return f
}

// inspector returns the Inspector of group over the store's database.
// Only the methods below may use it: they keep to the scope's tenant.
func (s scope) inspector(group string) (*consumer.Inspector, error) {
	var opts *consumer.InspectOpts
	if s.consumers != nil {
		opts = s.consumers.Inspect[group]
	}
	return consumer.Inspect(s.store.DB(), group, opts)
}

// ownAggregate returns consumer.ErrNothingParked for an aggregate of
// another tenant than the scope's (an empty tenant is the default one).
func (s scope) ownAggregate(agg inbox.Aggregate) error {
	t := agg.TenantID
	if t == "" {
		t = tenant.Default
	}
	if s.tenant != "" && t != s.tenant {
		return fmt.Errorf("%w: %s/%s is not of tenant %s", consumer.ErrNothingParked, agg.Type, agg.ID, s.tenant)
	}
	return nil
}

// groupParked returns up to limit parked events of group that f selects
// and, unless f selects another reason than held, as many holds.
func (s scope) groupParked(ctx context.Context, group string, f inbox.ParkedFilter, limit int) ([]inbox.Parked, []inbox.Hold, error) {
	insp, err := s.inspector(group)
	if err != nil {
		return nil, nil, err
	}
	f = s.parkedFilter(f)
	parked, err := insp.Parked(ctx, f, limit)
	if err != nil || (f.Reason != "" && f.Reason != inbox.ParkedHeld) {
		return parked, nil, err
	}
	holds, err := insp.Holds(ctx, f, limit)
	return parked, holds, err
}

func (s scope) groupParkedAggregate(ctx context.Context, group string, agg inbox.Aggregate, limit int) (*consumer.ParkedAggregate, error) {
	if err := s.ownAggregate(agg); err != nil {
		return nil, err
	}
	insp, err := s.inspector(group)
	if err != nil {
		return nil, err
	}
	return insp.Aggregate(ctx, agg, limit)
}

func (s scope) releaseParked(ctx context.Context, group string, agg inbox.Aggregate, messageID string) error {
	if err := s.ownAggregate(agg); err != nil {
		return err
	}
	insp, err := s.inspector(group)
	if err != nil {
		return err
	}
	return insp.Release(ctx, agg, messageID)
}

// groupMembers returns the live members of group: instances, no tenant's
// data.
func (s scope) groupMembers(ctx context.Context, group string) ([]consumer.Member, error) {
	insp, err := s.inspector(group)
	if err != nil {
		return nil, err
	}
	return insp.Members(ctx)
}

// unroutableFilter returns the filter of the event types given, narrowed
// to the scope's tenant.
func (s scope) unroutableFilter(types []string) rabbitmq.UnroutableFilter {
	return rabbitmq.UnroutableFilter{EventTypes: types, TenantID: s.tenant}
}

// keptEvent is an unroutable event as the page shows it, on either bus.
type keptEvent struct {
	Msg *message.Message
	// Age is how long ago it was published; HasAge is false where the bus
	// does not say (RabbitMQ).
	Age    time.Duration
	HasAge bool
}

// unroutableQueue names where the unroutable events wait.
func (s scope) unroutableQueue() string {
	if s.unroutableDB != nil {
		return dbbus.UnroutableGroup
	}
	return rabbitmq.UnroutableQueue(s.unroutable.ExchangeName())
}

// listUnroutable returns up to limit unroutable events of the event types
// given (all when none), oldest first.
func (s scope) listUnroutable(ctx context.Context, types []string, limit int) ([]keptEvent, error) {
	f := s.unroutableFilter(types)
	if s.unroutableDB != nil {
		kept, err := dbbus.ListUnroutable(ctx, s.unroutableDB, dbbus.UnroutableFilter{EventTypes: f.EventTypes, TenantID: f.TenantID}, limit)
		out := make([]keptEvent, len(kept))
		for i, k := range kept {
			out[i] = keptEvent{Msg: k.Message, Age: k.Age, HasAge: true}
		}
		return out, err
	}
	msgs, err := rabbitmq.ListUnroutable(ctx, s.unroutable, f, limit)
	out := make([]keptEvent, len(msgs))
	for i, m := range msgs {
		out[i] = keptEvent{Msg: m}
	}
	return out, err
}

// replayUnroutable replays the unroutable events of the event types given
// and returns how many it delivered and how many are still bound to no
// queue.
func (s scope) replayUnroutable(ctx context.Context, types []string) (replayed, back int, err error) {
	f := s.unroutableFilter(types)
	if s.unroutableDB != nil {
		r, err := dbbus.ReplayUnroutable(ctx, s.unroutableDB, dbbus.UnroutableFilter{EventTypes: f.EventTypes, TenantID: f.TenantID})
		return len(r.Delivered), len(r.Kept), err
	}
	msgs, back, err := rabbitmq.ReplayUnroutable(ctx, s.unroutable, f)
	return len(msgs), back, err
}

// scopedTenant returns t ("" for every tenant), or the scope's tenant
// when it has one.
func (s scope) scopedTenant(t string) string {
	if s.tenant != "" {
		return s.tenant
	}
	return t
}

func (s scope) listScheduled(ctx context.Context, f outbox.ScheduledFilter) ([]outbox.ScheduledMessage, error) {
	f.Tenant = s.scopedTenant(f.Tenant)
	return s.store.ListScheduled(ctx, f)
}

func (s scope) scheduledBacklog(ctx context.Context, t string) (outbox.ScheduledBacklog, error) {
	return s.store.ScheduledBacklog(ctx, s.scopedTenant(t))
}

// cancelScheduled cancels, in a transaction of its own, the waiting
// messages scheduled under key in tenant t (the default tenant when t is
// empty), or in the scope's tenant when it has one, and returns how many
// it cancelled.
func (s scope) cancelScheduled(ctx context.Context, t, key string) (int64, error) {
	var n int64
	err := s.store.DB().WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		n, err = s.store.Cancel(ctx, tx, key, &outbox.CancelOpts{Tenant: s.scopedTenant(t)})
		return err
	})
	return n, err
}

// listProcesses returns the processes in table that f selects, narrowed
// to the scope's tenant.
func (s scope) listProcesses(ctx context.Context, table string, f process.Filter) ([]process.Info, error) {
	f.Tenant = s.scopedTenant(f.Tenant)
	return process.List(ctx, s.store.DB(), table, f)
}

// abandonProcess abandons the process of key in table of tenant t (the
// default tenant when t is empty), or of the scope's tenant when it has
// one: another tenant's process under the same key is not found.
func (s scope) abandonProcess(ctx context.Context, table, t, key string) error {
	t = s.scopedTenant(t)
	if t == "" {
		t = tenant.Default
	}
	return process.Abandon(ctx, s.store.DB(), s.store, table, t, key)
}
