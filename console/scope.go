package console

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/rabbitmq"
	"github.com/bentoevents/bento/tenant"
)

// scope is how every page and action reaches what it shows or changes:
// the outbox, the consumer groups' dead letters, parked events, holds and
// members, and the unroutable queue.
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

// unroutableFilter returns f narrowed to the scope's tenant.
func (s scope) unroutableFilter(f rabbitmq.UnroutableFilter) rabbitmq.UnroutableFilter {
	if s.tenant != "" {
		f.TenantID = s.tenant
	}
	return f
}

func (s scope) listUnroutable(ctx context.Context, f rabbitmq.UnroutableFilter, limit int) ([]*message.Message, error) {
	return rabbitmq.ListUnroutable(ctx, s.unroutable, s.unroutableFilter(f), limit)
}

func (s scope) replayUnroutable(ctx context.Context, f rabbitmq.UnroutableFilter) ([]*message.Message, int, error) {
	return rabbitmq.ReplayUnroutable(ctx, s.unroutable, s.unroutableFilter(f))
}
