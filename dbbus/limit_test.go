package dbbus_test

import (
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/embeddb"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/internal/wire"
	"github.com/bentoevents/bento/messaging"
)

// opener returns a handle on one fresh database of backend b and a
// function that opens another handle, with its own connection pool, on
// the same database: what another process sharing it has.
func opener(t *testing.T, b testenv.Backend) (*gorm.DB, func() *gorm.DB) {
	t.Helper()
	if b.Name == "sqlite" {
		path := filepath.Join(t.TempDir(), "bus.db")
		open := func() *gorm.DB {
			db, err := embeddb.Open(path, nil)
			require.NoError(t, err)
			sqlDB, _ := db.DB()
			t.Cleanup(func() { _ = sqlDB.Close() })
			return db
		}
		return open(), open
	}
	db, dsn := testenv.Postgres(t)
	return db, func() *gorm.DB {
		other, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
		require.NoError(t, err)
		sqlDB, err := other.DB()
		require.NoError(t, err)
		t.Cleanup(func() { _ = sqlDB.Close() })
		return other
	}
}

// TestDeliveryLimitDeadLettersOnce: with a delivery limit of 2, a message
// whose subscriber dies holding it (its process gone: no renewal, no
// give-back, the lease lapses) three times in a row is dead-lettered by
// the bus at its next claim, once, into the group's dead-letter queue,
// with the poison cause, a reason and its attempts, and never handed out
// again; each death counted one attempt, each redelivery said so
// (messaging.MetaDeliveryCount); the healthy messages published after it
// are delivered once, without a delivery count, and nothing else is
// dead-lettered.
func TestDeliveryLimitDeadLettersOnce(t *testing.T) {
	t.Parallel()
	for _, b := range testenv.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			const limit = 2
			db, open := opener(t, b)
			cfg := dbbus.Config{VisibilityTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond, DeliveryLimit: limit}
			bus := setup(t, db, cfg)
			ctx := t.Context()
			require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing", "order.*"))
			require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing.dead", wire.DeadLetterTopic("billing")))
			poison := newMessage(`{"poison":true}`)
			require.NoError(t, bus.Publish("order.paid", poison))
			healthy := make([]*message.Message, 5)
			for i := range healthy {
				healthy[i] = newMessage(fmt.Sprintf(`{"n":%d}`, i))
			}
			require.NoError(t, bus.Publish("order.paid", healthy...))

			// Three processes in turn take the poison (the oldest
			// message; they claim one at a time) and die holding it.
			dying := cfg
			dying.BatchSize = 1
			for death := range limit + 1 {
				if death > 0 {
					testenv.WaitFor(t, 10*time.Second, "the dead process's lease to lapse", func() bool { return lapsed(t, db) == 1 })
				}
				proc := open()
				procBus := setup(t, proc, dying)
				_, ch := subscribe(t, procBus, "billing")
				m := receive(t, ch, 10*time.Second)
				require.Equal(t, poison.UUID, m.UUID, "death %d", death)
				l, ok := dbbus.LeaseOf(m)
				require.True(t, ok)
				assert.Equal(t, death, l.Attempts, "each death counts one attempt")
				if death == 0 {
					assert.Empty(t, m.Metadata.Get(messaging.MetaDeliveryCount))
					assert.Empty(t, m.Metadata.Get(messaging.MetaRedelivered))
				} else {
					assert.Equal(t, strconv.Itoa(death), m.Metadata.Get(messaging.MetaDeliveryCount))
					assert.Equal(t, "true", m.Metadata.Get(messaging.MetaRedelivered))
				}
				sqlDB, err := proc.DB()
				require.NoError(t, err)
				require.NoError(t, sqlDB.Close())
				_ = procBus.Close()
			}

			// A live subscriber: the poison comes back a fourth time,
			// past the limit, and is dead-lettered instead.
			_, ch := subscribe(t, bus, "billing")
			for i := range healthy {
				m := receive(t, ch, 10*time.Second)
				assert.Equal(t, healthy[i].UUID, m.UUID, "healthy message %d", i)
				assert.Empty(t, m.Metadata.Get(messaging.MetaDeliveryCount), "a healthy message was delivered before")
				m.Ack()
			}
			testenv.WaitFor(t, 10*time.Second, "the poison dead-lettered", func() bool {
				return depth(t, db, "billing.dead") == 1 && depth(t, db, "billing") == 0
			})
			select {
			case m := <-ch:
				t.Fatalf("message %s handed out after the healthy ones", m.UUID)
			case <-time.After(3 * cfg.VisibilityTimeout):
			}
			var dead []dbbus.Browsed
			require.NoError(t, dbbus.Peek(ctx, db, "billing.dead", 10, func(b dbbus.Browsed) bool {
				dead = append(dead, b)
				return true
			}))
			require.Len(t, dead, 1, "dead-lettered once")
			md := dead[0].Message.Metadata
			assert.Equal(t, poison.UUID, dead[0].Message.UUID)
			assert.Equal(t, `{"poison":true}`, string(dead[0].Message.Payload))
			assert.Equal(t, wire.DeadLetterTopic("billing"), dead[0].Topic)
			assert.Equal(t, wire.CausePoison, md.Get(wire.DeadCause))
			assert.Contains(t, md.Get(wire.DeadReason), "more than the bus's delivery limit of 2")
			assert.Equal(t, "3", md.Get(wire.DeadAttempts))
			assert.NotEmpty(t, md.Get(wire.DeadAt))
			assert.Equal(t, "order.paid", md.Get(messaging.MetaEventType), "the message's own metadata is kept")
			assert.Empty(t, md.Get(messaging.MetaDeliveryCount))
			assert.Equal(t, 1, countBodies(t, db), "the poison's body on order.paid outlived its last delivery")
			assert.Zero(t, depth(t, db, dbbus.UnroutableGroup))
		})
	}
}

// TestDeliveryLimitConfig: the limit defaults to DefaultDeliveryLimit; a
// negative one means none: a delivery that failed more often than any
// limit is still handed out.
func TestDeliveryLimitConfig(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	assert.Equal(t, dbbus.DefaultDeliveryLimit, setup(t, db, dbbus.Config{}).DeliveryLimit())
	bus := setup(t, db, dbbus.Config{DeliveryLimit: -1, PollInterval: 20 * time.Millisecond})
	assert.Negative(t, bus.DeliveryLimit())
	ctx := t.Context()
	require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing", "order.*"))
	m := newMessage(`{}`)
	require.NoError(t, bus.Publish("order.paid", m))
	require.NoError(t, db.Exec(`UPDATE dbbus_deliveries SET attempts = 10000`).Error)
	_, ch := subscribe(t, bus, "billing")
	got := receive(t, ch, 5*time.Second)
	assert.Equal(t, m.UUID, got.UUID)
	assert.Equal(t, "10000", got.Metadata.Get(messaging.MetaDeliveryCount))
}

// lapsed counts the leases whose expiry has passed, by the database's
// clock.
func lapsed(t *testing.T, db *gorm.DB) int {
	t.Helper()
	now := "now()"
	if db.Dialector.Name() == "sqlite" {
		now = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
	}
	var n int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM dbbus_deliveries WHERE lease_token IS NOT NULL AND leased_until < `+now).Scan(&n).Error)
	return int(n)
}
