package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

// TestDeadLettersListReplayDiscard: on RabbitMQ, two events whose handler
// fails for good are dead-lettered with their cause, error, attempts and
// time; listing leaves them in place; after the fix, replaying one applies
// it exactly once (a second replay of a copy is skipped by the inbox) and
// removes it; discarding the other removes it without applying it.
func TestDeadLettersListReplayDiscard(t *testing.T) {
	h := rabbitHarness(t)
	s := newSuite(t, h)
	cfg := s.config()
	cfg.Partitions, cfg.DisableHoldBack = 4, true
	var fixed atomic.Bool
	c := s.newConsumer(t, cfg)
	require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e OrderPlaced, env *messaging.Envelope) error {
		if !fixed.Load() {
			return consumer.Permanent(errors.New("no such sku: " + e.SKU))
		}
		return tx.Create(&Effect{MessageID: env.ID}).Error
	}))
	run(t, c)
	first := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o1", SKU: "kiwi"}, nil)
	second := eventMsg(t, "order.placed", 2, OrderPlaced{OrderID: "o2", SKU: "fig"}, nil)
	second.Metadata.Set(messaging.MetaAggregateID, "other")
	s.publish(t, "order.placed", first)
	s.publish(t, "order.placed", second)
	ctx := t.Context()
	var dead []consumer.DeadLetter
	testenv.WaitFor(t, 20*time.Second, "two dead letters", func() bool {
		var err error
		dead, err = consumer.ListDeadLetters(ctx, h.amqp, s.group, consumer.DeadFilter{}, 10)
		require.NoError(t, err)
		return len(dead) == 2
	})
	byID := map[string]consumer.DeadLetter{dead[0].MessageID: dead[0], dead[1].MessageID: dead[1]}
	d := byID[first.UUID]
	assert.Equal(t, consumer.CausePermanent, d.Cause)
	assert.Contains(t, d.Error, "no such sku: kiwi")
	assert.Equal(t, "order.placed", d.EventType)
	assert.Equal(t, 1, d.Attempts)
	assert.WithinDuration(t, time.Now(), d.DeadAt, time.Minute)
	assert.Zero(t, d.Replays)
	only, err := consumer.ListDeadLetters(ctx, h.amqp, s.group, consumer.DeadFilter{AggregateID: "other"}, 10)
	require.NoError(t, err)
	require.Len(t, only, 1)
	assert.Equal(t, second.UUID, only[0].MessageID)
	none, err := consumer.ListDeadLetters(ctx, h.amqp, s.group, consumer.DeadFilter{OlderThan: time.Hour}, 10)
	require.NoError(t, err)
	assert.Empty(t, none)
	assert.Zero(t, s.effects(t))

	fixed.Store(true)
	replayed, err := consumer.ReplayDeadLetters(ctx, h.amqp, s.group, consumer.DeadFilter{IDs: []string{first.UUID}})
	require.NoError(t, err)
	require.Len(t, replayed, 1)
	testenv.WaitFor(t, 20*time.Second, "the replayed event applied", func() bool { return s.effects(t) == 1 })
	s.publish(t, "order.placed", first) // a late copy of it: the inbox skips it
	left, err := consumer.ListDeadLetters(ctx, h.amqp, s.group, consumer.DeadFilter{}, 10)
	require.NoError(t, err)
	require.Len(t, left, 1, "the replayed one left the queue")
	assert.Equal(t, second.UUID, left[0].MessageID)

	discarded, err := consumer.DiscardDeadLetters(ctx, h.amqp, s.group, consumer.DeadFilter{Cause: consumer.CausePermanent})
	require.NoError(t, err)
	require.Len(t, discarded, 1)
	left, err = consumer.ListDeadLetters(ctx, h.amqp, s.group, consumer.DeadFilter{}, 10)
	require.NoError(t, err)
	assert.Empty(t, left)
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, int64(1), s.effects(t), "applied once; the discarded one never")
}
