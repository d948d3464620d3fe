package projector

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/tracing"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// TxPublisher is implemented by publishers whose queues live in a
// database, such as dbbus.Bus: PublishTx publishes inside the caller's
// transaction on DB, if and only if it commits, and never commits itself.
//
// When the projector's publisher is a TxPublisher whose DB is the outbox
// store's database (the same connection pool), the hop from the outbox to
// the bus is exactly once: the projector publishes each claimed batch and
// marks it sent (outbox.Store.MarkSentTx, or DeleteSentTx) in one
// transaction, which commits only while the projector still holds the
// lease of every row of it. Any failure rolls back both, nothing
// published and nothing marked; the rows are then retried as after a
// failed publish, or, when another projector took their lease over,
// released to it untouched. On any other database the projector uses
// Publish, at least once.
type TxPublisher interface {
	DB() *gorm.DB
	PublishTx(tx *gorm.DB, topic string, msgs ...*message.Message) error
}

// errLeaseLost rolls back a batch's transaction when some of its rows are
// no longer leased to the projector.
var errLeaseLost = errors.New("projector: lease lost to another projector; nothing published")

// txPublisherOn returns pub as a TxPublisher when it is one on db's
// connection pool, nil otherwise.
func txPublisherOn(pub message.Publisher, db *gorm.DB) TxPublisher {
	tp, ok := pub.(TxPublisher)
	if !ok || tp.DB() == nil || db == nil {
		return nil
	}
	a, errA := tp.DB().DB()
	b, errB := db.DB()
	if errA != nil || errB != nil || a != b {
		return nil
	}
	return tp
}

// publishTx publishes rows through p.txPub and marks them sent in one
// transaction, bounded by PublishTimeout, and returns each row's outcome:
// nil (published and marked), the error that rolled the transaction back,
// an error of the row's own (it was left out), or errNotTried when ctx had
// ended or the lease of a row was lost (the rows still leased are then
// released). Messages of one topic are published in claim order.
func (p *OutboxProjector) publishTx(ctx context.Context, rows []*outbox.Message) []error {
	outcomes := make([]error, len(rows))
	if ctx.Err() != nil {
		for i := range outcomes {
			outcomes[i] = errNotTried
		}
		return outcomes
	}
	var (
		in      []int // rows in the transaction
		ids     []string
		spans   []trace.Span
		topics  []string
		byTopic = map[string][]*message.Message{}
	)
	for i, row := range rows {
		msg, err := messaging.NewMessage(row)
		if err == nil {
			err = messaging.ValidateTopic(row.Topic)
		}
		if err != nil {
			outcomes[i] = err
			continue
		}
		in = append(in, i)
		ids = append(ids, row.ID)
		spans = append(spans, p.startPublish(ctx, row, msg))
		if _, ok := byTopic[row.Topic]; !ok {
			topics = append(topics, row.Topic)
		}
		byTopic[row.Topic] = append(byTopic[row.Topic], msg)
	}
	if len(in) == 0 {
		return outcomes
	}
	settle := p.store.MarkSentTx
	if p.cfg.DeleteOnSuccess {
		settle = p.store.DeleteSentTx
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.PublishTimeout)
	defer cancel()
	err := p.store.DB().WithContext(tctx).Transaction(func(tx *gorm.DB) error {
		// A crash of the server can only undo the transaction as a whole:
		// the rows are then relayed again, and nothing that read what it
		// published can have committed without it (dialect.CommitAsync).
		if err := dialect.CommitAsync(tx); err != nil {
			return err
		}
		// Fence first: on PostgreSQL the marked rows stay locked, so no
		// claim takes them over before the commit.
		n, err := settle(tctx, tx, p.cfg.WorkerID, ids)
		if err != nil {
			return err
		}
		if int(n) != len(ids) {
			return fmt.Errorf("%w (%d of %d rows)", errLeaseLost, len(ids)-int(n), len(ids))
		}
		for _, topic := range topics {
			if err := p.txPub.PublishTx(tx, topic, byTopic[topic]...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && errors.Is(tctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("%w after %v: %w", ErrPublishTimeout, p.cfg.PublishTimeout, err)
	}
	outcome := err
	if errors.Is(err, errLeaseLost) {
		p.log.Warn("lease lost before publishing; another projector owns rows of the batch", "rows", len(ids), "err", err)
		outcome = errNotTried
	}
	for j, i := range in {
		tracing.End(spans[j], err)
		outcomes[i] = outcome
	}
	return outcomes
}
