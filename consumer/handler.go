package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/uow"
)

// HandlerFunc handles one event of type E inside the inbox transaction
// of its message. tx is that transaction, bound to ctx: write through it
// (or through a unit of work begun with ctx, which joins it), so the
// handler's writes commit with the inbox record, exactly once, or roll
// back with it. A write through any other *gorm.DB runs outside that
// transaction: it is not undone when the message is retried, and on
// SQLite it waits for the lock the inbox transaction holds. env is the
// event's envelope (id, aggregate, tenant, occurred_at, correlation and
// causation ids).
type HandlerFunc[E aggregate.Event] func(ctx context.Context, tx *gorm.DB, e E, env *messaging.Envelope) error

// handler is a registered HandlerFunc, over any event type.
type handler func(ctx context.Context, tx *gorm.DB, ev aggregate.Event, env *messaging.Envelope) error

// Handle registers fn as the consumer's handler for events of type E: E is
// registered in the consumer's registry as the current type of its event
// type, and the group's queue is bound to that event type. fn receives the
// inbox transaction (see HandlerFunc), the decoded event (upcast from
// older schema versions) and its envelope; ctx carries the transaction
// too, so units of work begun with it join it.
//
// Errors: messaging.ErrRegistration, an error for a second handler of the
// same event type, ErrRunning.
func Handle[E aggregate.Event](c *Consumer, fn HandlerFunc[E]) error {
	if err := messaging.Register[E](c.cfg.Registry); err != nil {
		return err
	}
	var zero E
	eventType := zero.EventType()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return ErrRunning
	}
	if _, dup := c.handlers[eventType]; dup {
		return fmt.Errorf("consumer: a handler for %s is already registered in %s", eventType, c.cfg.Group)
	}
	c.handlers[eventType] = func(ctx context.Context, tx *gorm.DB, ev aggregate.Event, env *messaging.Envelope) error {
		e, ok := ev.(E)
		if !ok {
			return Permanent(fmt.Errorf("event %s decoded as %T, handler wants %T", env.ID, ev, zero))
		}
		return fn(ctx, tx, e, env)
	}
	return nil
}

// dispatch calls the handler of a message's event type with the envelope
// decoded once for the delivery (messaging.EnvelopeOf).
func (c *Consumer) dispatch(msg *message.Message) error {
	env, err := messaging.EnvelopeOf(msg)
	if err != nil {
		return err
	}
	c.mu.Lock()
	h := c.handlers[env.EventType]
	c.mu.Unlock()
	if h == nil {
		return fmt.Errorf("%w: %s in %s", ErrNoHandler, env.EventType, c.cfg.Group)
	}
	ev, err := c.cfg.Registry.Decode(env)
	if err != nil {
		return err
	}
	ctx := msg.Context()
	tx, ok := uow.TxFromContext(ctx)
	if !ok { // the inbox middleware always runs dispatch in a transaction
		return fmt.Errorf("consumer: message %s reached its handler outside an inbox transaction", env.ID)
	}
	start := time.Now()
	err = h(ctx, tx.WithContext(ctx), ev, env)
	result := "ok"
	if err != nil {
		result = "error"
	}
	c.metrics.handlerSeconds.WithLabelValues(env.EventType, result).Observe(time.Since(start).Seconds())
	return err
}
