package projector_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/rabbitmq"
)

// TestOversizedEventFailsAlone relays 60 events, one of them with 200 KB of
// metadata, more than one AMQP frame of RabbitMQ's default size can carry
// as headers (a store configured past the default metadata limit wrote it,
// as a store of an older version could have). The big event goes dead at
// its first attempt, since no retry can publish it; the 59 others are
// published at their first attempt, each once, and none is charged a
// failure.
func TestOversizedEventFailsAlone(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		cfg, queue := rabbit(t)
		require.NoError(t, outbox.Migrate(ctx, db))
		store, err := outbox.NewStore(db, &outbox.Config{MaxMetadataBytes: 1 << 20})
		require.NoError(t, err)

		const n, bigAt = 60, 30
		var bigID string
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			for i := range n {
				opts := &outbox.AddOpts{Metadata: outbox.Metadata{"note": "fine"}}
				if i == bigAt {
					opts.Metadata = outbox.Metadata{"blob": strings.Repeat("x", 200<<10)}
				}
				m, err := store.Add(ctx, tx, "counter.noted", map[string]int{"i": i}, opts)
				if err != nil {
					return err
				}
				if i == bigAt {
					bigID = m.ID
				}
			}
			return nil
		}))

		pub, err := rabbitmq.NewConfirmPublisher(t.Context(), cfg)
		require.NoError(t, err)
		defer pub.Close()
		pcfg := fastConfig()
		pcfg.BatchSize = 100
		p, err := projector.New(store, pub, pcfg)
		require.NoError(t, err)
		res, err := p.Drain(ctx)
		require.NoError(t, err)
		assert.Equal(t, n-1, res.Published)

		var rows []outbox.Message
		require.NoError(t, db.Order("id").Find(&rows).Error)
		require.Len(t, rows, n)
		for _, r := range rows {
			if r.ID == bigID {
				assert.Equal(t, outbox.StatusDead, r.Status, "the oversized event is dead at once")
				assert.Equal(t, 1, r.Attempts)
				require.NotNil(t, r.LastError)
				assert.Contains(t, *r.LastError, messaging.ErrMessageTooLarge.Error())
				continue
			}
			assert.Equal(t, outbox.StatusSent, r.Status, r.ID)
			assert.Zero(t, r.Attempts, "%s was charged for its neighbour", r.ID)
		}

		got := byMessageID(drainQueue(t, cfg.URL, queue))
		assert.Len(t, got, n-1)
		assert.NotContains(t, got, bigID)
		for id, c := range got {
			assert.Equal(t, 1, c, "%s published once", id)
		}
	})
}
