package main

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/uow"
)

type skuOrdered struct {
	SKU string `json:"sku"`
}

func (skuOrdered) EventType() string { return "sku.ordered" }

// applied is what the test consumer writes per event it applies.
type applied struct {
	MessageID string `gorm:"primaryKey"`
}

// TestConsumerDeadLettersThroughTheBinary: a consumer whose handler fails
// for good sends two events to its dead letters; the bento binary lists
// them, shows one (payload hidden unless asked), replays it after the fix
// (a dry run first changes nothing) and the consumer applies it exactly
// once; discard asks first and then removes the other, which is never
// applied.
func TestConsumerDeadLettersThroughTheBinary(t *testing.T) {
	t.Parallel()
	ex := testenv.NewExchange(t)
	db, _ := testenv.Postgres(t)
	ctx := context.Background()
	require.NoError(t, outbox.Migrate(ctx, db))
	require.NoError(t, inbox.Migrate(ctx, db))
	require.NoError(t, db.AutoMigrate(&applied{}))
	group := "cli" + aggregate.NewID()[18:]
	ex.Queues(consumer.DeadLetterQueue(group))
	ex.Partitioned(group, 2)
	amqpCfg := &messaging.AMQPConfig{URL: ex.URL, Exchange: ex.Name}
	cfg := consumer.DefaultConfig(group)
	cfg.Partitions, cfg.HoldBack = 2, false
	c, err := consumer.NewAMQP(ctx, db, amqpCfg, cfg)
	require.NoError(t, err)
	var fixed atomic.Bool
	require.NoError(t, consumer.Handle(c, func(ctx context.Context, tx *gorm.DB, e skuOrdered, env *messaging.Envelope) error {
		if !fixed.Load() {
			return consumer.Permanent(errors.New("unknown sku " + e.SKU))
		}
		return uow.DB(ctx, nil).Create(&applied{MessageID: env.ID}).Error
	}))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	<-c.Running()

	pub, err := messaging.NewAMQPPublisher(amqpCfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	var ids []string
	for i, sku := range []string{"kiwi", "fig"} {
		body, _ := json.Marshal(skuOrdered{SKU: sku})
		m, err := messaging.NewMessage(&outbox.Message{ID: aggregate.NewID(), TenantID: "default", Topic: "sku.ordered",
			AggregateType: "sku", AggregateID: sku, AggregateVersion: int64(i + 1), SchemaVersion: 1, Payload: body,
			OccurredAt: time.Now().UTC()})
		require.NoError(t, err)
		require.NoError(t, pub.Publish("sku.ordered", m))
		ids = append(ids, m.UUID)
	}

	env := []string{"AMQP_URL=" + ex.URL, "BENTO_EXCHANGE=" + ex.Name}
	list := func(args ...string) []deadLetterRow {
		t.Helper()
		r := bentoEnv(t, env, "", append([]string{"consumer", "dead", "list", "--group", group, "--json"}, args...)...)
		require.Equal(t, 0, r.code, r.stderr)
		var rows []deadLetterRow
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &rows), r.stdout)
		return rows
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(list()) < 2 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	rows := list()
	require.Len(t, rows, 2)
	assert.Equal(t, consumer.CausePermanent, rows[0].Cause)
	assert.Contains(t, rows[0].Error+rows[1].Error, "unknown sku kiwi")
	assert.Equal(t, 1, rows[0].Attempts)
	assert.NotNil(t, rows[0].DeadAt)
	assert.Len(t, list("--aggregate", "sku/fig"), 1)
	assert.Empty(t, list("--older-than", "1h"))

	r := bentoEnv(t, env, "", "consumer", "dead", "list", "--group", group)
	assert.Contains(t, r.stdout, "permanent")
	assert.Contains(t, r.stdout, ids[0])
	r = bentoEnv(t, env, "", "consumer", "dead", "show", ids[0], "--group", group)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "unknown sku kiwi")
	assert.Contains(t, r.stdout, "payload: hidden")
	assert.NotContains(t, r.stdout, `"sku":"kiwi"`)
	r = bentoEnv(t, env, "", "consumer", "dead", "show", ids[0], "--group", group, "--show-payload")
	assert.Contains(t, r.stdout, `"sku":"kiwi"`)

	r = bentoEnv(t, env, "", "consumer", "dead", "replay", ids[0], "--group", group, "--dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "would replay 1")
	assert.Len(t, list(), 2, "a dry run changes nothing")

	fixed.Store(true)
	r = bentoEnv(t, env, "", "consumer", "dead", "replay", ids[0], "--group", group, "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "replayed 1")
	countApplied := func() int64 {
		var n int64
		require.NoError(t, db.Model(&applied{}).Count(&n).Error)
		return n
	}
	deadline = time.Now().Add(20 * time.Second)
	for countApplied() < 1 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	assert.Equal(t, int64(1), countApplied(), "the replayed event applied")

	r = bentoEnv(t, env, "n\n", "consumer", "dead", "discard", "--cause", "permanent", "--group", group)
	assert.Equal(t, 1, r.code, "declined at the prompt")
	assert.Len(t, list(), 1)
	r = bentoEnv(t, env, "", "consumer", "dead", "discard", "--cause", "permanent", "--group", group, "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "discarded 1")
	assert.Empty(t, list())
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, int64(1), countApplied(), "applied once; the discarded one never")

	r = bentoEnv(t, []string{"AMQP_URL="}, "", "consumer", "dead", "list", "--group", group)
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, "AMQP_URL")
	r = bentoEnv(t, env, "", "consumer", "dead", "replay", "--group", group)
	assert.Equal(t, 2, r.code, "replay needs ids, a filter or --all")
}
