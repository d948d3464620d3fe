package dbbus_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// setup migrates db and returns a bus on it with cfg (its Logger silenced),
// closed at cleanup.
func setup(t *testing.T, db *gorm.DB, cfg dbbus.Config) *dbbus.Bus {
	t.Helper()
	require.NoError(t, dbbus.Migrate(t.Context(), db))
	cfg.Logger = discard
	bus, err := dbbus.New(db, &cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = bus.Close() })
	return bus
}

// subscribe subscribes a new subscriber of bus to group, closed at cleanup.
func subscribe(t *testing.T, bus *dbbus.Bus, group string) (*dbbus.Subscriber, <-chan *message.Message) {
	t.Helper()
	sub := bus.Subscriber()
	t.Cleanup(func() { _ = sub.Close() })
	ch, err := sub.Subscribe(t.Context(), group)
	require.NoError(t, err)
	return sub, ch
}

// receive returns the next message of ch, failing the test after within.
func receive(t *testing.T, ch <-chan *message.Message, within time.Duration) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		require.True(t, ok, "the channel was closed")
		return m
	case <-time.After(within):
		t.Fatalf("no message within %v", within)
		return nil
	}
}

// depth is dbbus.Depth, failing the test on error.
func depth(t *testing.T, db *gorm.DB, group string) int {
	t.Helper()
	n, err := dbbus.Depth(t.Context(), db, group)
	require.NoError(t, err)
	return n
}

func newMessage(payload string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(payload))
	m.Metadata.Set("event_type", "order.paid")
	return m
}

// TestLeaseExpiryRedelivers has a process die holding a message (its
// connections gone, it can neither renew nor give back): once the lease
// expires, a subscriber of another process must receive it, under a new
// lease that counts the expired one as a failed attempt. The first lease's
// ack must then fail with ErrLeaseLost and leave the new lease's delivery
// in place; the second lease's ack deletes it. (A live holder renews its
// leases: TestSlowHandlerKeepsItsLeases.)
func TestLeaseExpiryRedelivers(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dead, db *gorm.DB) {
		cfg := dbbus.Config{VisibilityTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond}
		deadBus, bus := setup(t, dead, cfg), setup(t, db, cfg)
		ctx := t.Context()
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing", "order.*"))
		_, first := subscribe(t, deadBus, "billing")
		m := newMessage(`{"n":1}`)
		require.NoError(t, bus.Publish("order.paid", m))

		held := receive(t, first, 5*time.Second)
		oldLease, ok := dbbus.LeaseOf(held)
		require.True(t, ok)
		assert.Equal(t, 0, oldLease.Attempts)
		sqlDB, err := dead.DB()
		require.NoError(t, err)
		require.NoError(t, sqlDB.Close())
		_ = deadBus.Close()

		_, second := subscribe(t, bus, "billing")
		again := receive(t, second, 5*time.Second)
		require.Equal(t, m.UUID, again.UUID)
		newLease, ok := dbbus.LeaseOf(again)
		require.True(t, ok)
		assert.NotEqual(t, oldLease.Token, newLease.Token)
		assert.Equal(t, 1, newLease.Attempts, "an expired lease counts as a failed attempt")

		err = dbbus.Ack(ctx, db, oldLease)
		require.ErrorIs(t, err, dbbus.ErrLeaseLost)
		assert.Equal(t, 1, depth(t, db, "billing"), "a stale ack deleted the new lease's delivery")
		require.ErrorIs(t, dbbus.Nack(ctx, db, oldLease), dbbus.ErrLeaseLost)

		again.Ack()
		testenv.WaitFor(t, 5*time.Second, "the ack to delete the delivery", func() bool {
			return depth(t, db, "billing") == 0
		})
		var bodies int64
		require.NoError(t, db.Raw("SELECT count(*) FROM dbbus_messages").Scan(&bodies).Error)
		assert.Zero(t, bodies, "the body outlived its last delivery")
	})
}

// TestAttemptsCountFailuresOnly nacks a message, then closes the
// subscriber holding its redelivery: the nack counts an attempt, the
// give-back does not, and the give-back makes it ready at once (long before
// the visibility timeout).
func TestAttemptsCountFailuresOnly(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{VisibilityTimeout: time.Hour})
		require.NoError(t, dbbus.DeclareGroup(t.Context(), db, "billing", "order.paid"))
		sub, ch := subscribe(t, bus, "billing")
		require.NoError(t, bus.Publish("order.paid", newMessage(`{}`)))

		receive(t, ch, 5*time.Second).Nack()
		m := receive(t, ch, 5*time.Second)
		l, _ := dbbus.LeaseOf(m)
		assert.Equal(t, 1, l.Attempts, "a nack counts a failed attempt")
		require.NoError(t, sub.Close())

		_, ch2 := subscribe(t, bus, "billing")
		m2 := receive(t, ch2, 5*time.Second)
		l2, _ := dbbus.LeaseOf(m2)
		assert.Equal(t, 1, l2.Attempts, "a give-back counted as a failed attempt")
		m2.Ack()
	})
}

// TestUnroutableKept publishes to a topic no group is bound to: the
// message must be kept in the unroutable group, and a subscriber of that
// group must receive it.
func TestUnroutableKept(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{})
		ctx := t.Context()
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing", "order.*"))
		m := newMessage(`{"lost":true}`)
		require.NoError(t, bus.Publish("invoice.sent", m))
		assert.Equal(t, 0, depth(t, db, "billing"))
		assert.Equal(t, 1, depth(t, db, dbbus.UnroutableGroup))

		_, ch := subscribe(t, bus, dbbus.UnroutableGroup)
		got := receive(t, ch, 5*time.Second)
		assert.Equal(t, m.UUID, got.UUID)
		assert.Equal(t, `{"lost":true}`, string(got.Payload))
		got.Ack()
	})
}

// TestNames checks the typed errors for names: a bad group or pattern, the
// reserved unroutable group, an undeclared group.
func TestNames(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	bus := setup(t, db, dbbus.Config{})
	ctx := t.Context()
	require.ErrorIs(t, dbbus.DeclareGroup(ctx, db, "bad group", "order.*"), messaging.ErrInvalidName)
	require.ErrorIs(t, dbbus.DeclareGroup(ctx, db, "billing", "order..x"), messaging.ErrInvalidName)
	require.ErrorIs(t, dbbus.DeclareGroup(ctx, db, "billing"), messaging.ErrInvalidName)
	require.ErrorIs(t, dbbus.DeclareGroup(ctx, db, dbbus.UnroutableGroup, "#"), messaging.ErrInvalidName)
	_, err := dbbus.Depth(ctx, db, "nobody")
	require.ErrorIs(t, err, messaging.ErrQueueNotFound)
	_, err = bus.Subscriber().Subscribe(ctx, "nobody")
	require.ErrorIs(t, err, messaging.ErrQueueNotFound)
	require.ErrorIs(t, bus.Publish("bad topic", newMessage(`{}`)), messaging.ErrInvalidName)
	_, err = dbbus.New(db, &dbbus.Config{BatchSize: -1, PollInterval: -time.Second})
	require.ErrorIs(t, err, dbbus.ErrInvalidConfig)
	_, err = dbbus.New(testenv.SQLite(t), nil)
	require.ErrorIs(t, err, dbbus.ErrNotMigrated)
}

// TestRoutingAndRepublish routes by pattern to several groups, and
// publishes a message whose UUID the bus still holds a second time: it
// must not be delivered twice.
func TestRoutingAndRepublish(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{})
		ctx := t.Context()
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "exact", "order.paid"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "star", "order.*"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "hash", "order.#", "order.paid"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "other", "invoice.*"))
		m := newMessage(`{}`)
		require.NoError(t, bus.Publish("order.paid", m))
		require.NoError(t, bus.Publish("order.paid", m))
		require.NoError(t, bus.Publish("order.paid.late", newMessage(`{}`)))
		for group, want := range map[string]int{"exact": 1, "star": 1, "hash": 2, "other": 0, dbbus.UnroutableGroup: 0} {
			assert.Equal(t, want, depth(t, db, group), "depth of %s", group)
		}
	})
}

// TestPublishTx publishes inside the caller's transaction: nothing is
// delivered when it rolls back, the messages once it commits.
func TestPublishTx(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{})
		ctx := t.Context()
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing", "order.*"))
		rollback := errors.New("roll back")
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			require.NoError(t, bus.PublishTx(tx, "order.paid", newMessage(`{}`)))
			return rollback
		})
		require.ErrorIs(t, err, rollback)
		assert.Equal(t, 0, depth(t, db, "billing"))

		m := newMessage(`{}`)
		require.NoError(t, db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return bus.PublishTx(tx, "order.paid", m)
		}))
		_, ch := subscribe(t, bus, "billing")
		got := receive(t, ch, 5*time.Second)
		assert.Equal(t, m.UUID, got.UUID)
		got.Ack()
	})
}

// TestLongTransactionStallsNobody holds a transaction open in another
// session (with a transaction id, so it holds back the xmin horizon) while
// a message is published and received: delivery must not wait for it.
func TestLongTransactionStallsNobody(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	bus := setup(t, db, dbbus.Config{PollInterval: time.Hour}) // LISTEN/NOTIFY only
	ctx := t.Context()
	require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing", "order.*"))

	sqlDB, err := db.DB()
	require.NoError(t, err)
	conn, err := sqlDB.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	long, err := conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = long.Rollback() }()
	_, err = long.ExecContext(ctx, "SELECT 1")
	require.NoError(t, err)
	_, err = long.ExecContext(ctx, "SELECT txid_current()")
	require.NoError(t, err)

	_, ch := subscribe(t, bus, "billing")
	m := newMessage(`{}`)
	require.NoError(t, bus.Publish("order.paid", m))
	got := receive(t, ch, 5*time.Second)
	assert.Equal(t, m.UUID, got.UUID)
	got.Ack()
	testenv.WaitFor(t, 5*time.Second, "the ack", func() bool { return depth(t, db, "billing") == 0 })
}

// TestListenWakesOtherProcess publishes from one bus and receives on
// another bus on the same database, with polling all but off: the
// notification must wake the subscriber.
func TestListenWakesOtherProcess(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	pub := setup(t, db, dbbus.Config{NoListen: true})
	sub := setup(t, db, dbbus.Config{PollInterval: time.Hour})
	require.NoError(t, dbbus.DeclareGroup(t.Context(), db, "billing", "order.*"))
	_, ch := subscribe(t, sub, "billing")
	// Give the subscription time for its first claim, so that the message
	// is found through the notification only. This is no wait for a
	// condition: should the claim run later, it finds the message and the
	// test passes without proving anything, but it cannot fail because of
	// it.
	time.Sleep(100 * time.Millisecond)
	m := newMessage(`{}`)
	require.NoError(t, pub.Publish("order.paid", m))
	got := receive(t, ch, 5*time.Second)
	assert.Equal(t, m.UUID, got.UUID)
	got.Ack()
}

// TestCloseGivesBack closes a bus whose subscription holds a message: the
// message must be ready again at once for a subscriber of another bus.
func TestCloseGivesBack(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		first := setup(t, db, dbbus.Config{VisibilityTimeout: time.Hour})
		require.NoError(t, dbbus.DeclareGroup(t.Context(), db, "billing", "order.*"))
		ctx, cancel := context.WithCancel(t.Context())
		ch, err := first.Subscriber().Subscribe(ctx, "billing")
		require.NoError(t, err)
		m := newMessage(`{}`)
		require.NoError(t, first.Publish("order.paid", m))
		receive(t, ch, 5*time.Second)
		cancel()
		for range ch {
		}
		second := setup(t, db, dbbus.Config{})
		_, ch2 := subscribe(t, second, "billing")
		got := receive(t, ch2, 5*time.Second)
		assert.Equal(t, m.UUID, got.UUID)
		got.Ack()
	})
}

// TestAckNotHeldBack acks one message of a claim and holds the next: the
// subscription deletes acks of one claim together, but the first ack must
// not wait for the held message (its lease could expire meanwhile and the
// acked message come back).
func TestAckNotHeldBack(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{VisibilityTimeout: time.Hour})
		require.NoError(t, dbbus.DeclareGroup(t.Context(), db, "billing", "order.*"))
		require.NoError(t, bus.Publish("order.paid", newMessage(`1`), newMessage(`2`)))
		_, ch := subscribe(t, bus, "billing")
		receive(t, ch, 5*time.Second).Ack()
		held := receive(t, ch, 5*time.Second)
		testenv.WaitFor(t, 5*time.Second, "the first ack while the second message is held", func() bool {
			return depth(t, db, "billing") == 1
		})
		held.Ack()
		testenv.WaitFor(t, 5*time.Second, "the second ack", func() bool { return depth(t, db, "billing") == 0 })
	})
}

// TestPublishManyGroups publishes more messages than one INSERT writes to
// more groups than one statement's delivery rows hold: every group must
// get every message, in publish order.
func TestPublishManyGroups(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{})
		const groups, msgs = 50, 250 // 12,500 deliveries
		for g := range groups {
			require.NoError(t, dbbus.DeclareGroup(t.Context(), db, fmt.Sprintf("g%d", g), "order.#"))
		}
		var batch []*message.Message
		for i := range msgs {
			batch = append(batch, newMessage(fmt.Sprint(i)))
		}
		require.NoError(t, bus.Publish("order.paid", batch...))
		for g := range groups {
			assert.Equal(t, msgs, depth(t, db, fmt.Sprintf("g%d", g)))
		}
		_, ch := subscribe(t, bus, "g49")
		for i := range msgs {
			m := receive(t, ch, 5*time.Second)
			require.Equal(t, batch[i].UUID, m.UUID, "message %d out of order", i)
			m.Ack()
		}
	})
}

// TestUnreadableMessageStallsNobody stores a message whose metadata is not
// JSON, and a delivery whose message is missing, ahead of a good one: the
// good one must be delivered, and the bad ones kept (leased until their
// lease expires), not lost.
func TestUnreadableMessageStallsNobody(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{VisibilityTimeout: time.Hour})
		require.NoError(t, dbbus.DeclareGroup(t.Context(), db, "billing", "order.*"))
		require.NoError(t, db.Exec(`INSERT INTO dbbus_messages (id, topic, metadata, payload) VALUES ('bad', 'order.paid', 'not json', ?)`, []byte(`{}`)).Error)
		require.NoError(t, db.Exec(`INSERT INTO dbbus_deliveries (group_name, message_id, topic) VALUES ('billing', 'bad', 'order.paid')`).Error)
		require.NoError(t, db.Exec(`INSERT INTO dbbus_deliveries (group_name, message_id, topic) VALUES ('billing', 'gone', 'order.paid')`).Error)
		good := newMessage(`{}`)
		require.NoError(t, bus.Publish("order.paid", good))
		_, ch := subscribe(t, bus, "billing")
		got := receive(t, ch, 5*time.Second)
		assert.Equal(t, good.UUID, got.UUID)
		got.Ack()
		testenv.WaitFor(t, 5*time.Second, "the good message's ack", func() bool { return depth(t, db, "billing") == 2 })
		var leased int64
		require.NoError(t, db.Raw(`SELECT count(*) FROM dbbus_deliveries WHERE group_name = 'billing' AND lease_token IS NOT NULL`).Scan(&leased).Error)
		assert.Equal(t, int64(2), leased, "the unreadable and the missing message stay leased until their lease expires")
	})
}

// TestInProcessWake turns polling all but off (and LISTEN off): each
// message published through the bus must still reach its idle subscriber
// at once, woken in-process after the publishing transaction commits.
func TestInProcessWake(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{PollInterval: time.Hour, NoListen: true})
		require.NoError(t, dbbus.DeclareGroup(t.Context(), db, "billing", "order.*"))
		_, ch := subscribe(t, bus, "billing")
		for range 30 {
			m := newMessage(`{}`)
			require.NoError(t, bus.Publish("order.paid", m))
			got := receive(t, ch, 2*time.Second)
			require.Equal(t, m.UUID, got.UUID)
			got.Ack()
		}
	})
}

// TestSameUUIDOnAnotherTopic publishes a message, then, while it is still
// held, a copy with the same UUID and other metadata on another topic, as
// a consumer does when it dead-letters a message: the copy is a message of
// its own, delivered with its own metadata and payload, while publishing
// it again on the same topic (a relay's retry) still delivers it once.
func TestSameUUIDOnAnotherTopic(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{PollInterval: 20 * time.Millisecond})
		ctx := t.Context()
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing", "order.paid"))
		require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing.dead", "bento-dead.billing"))
		m := newMessage(`{"n":1}`)
		require.NoError(t, bus.Publish("order.paid", m))
		_, ch := subscribe(t, bus, "billing")
		held := receive(t, ch, 5*time.Second)

		dead := message.NewMessage(m.UUID, []byte(`{"n":1,"dead":true}`))
		for k, v := range held.Metadata {
			dead.Metadata.Set(k, v)
		}
		dead.Metadata.Set("bento_dead_reason", "permanent")
		require.NoError(t, bus.Publish("bento-dead.billing", dead))
		require.NoError(t, bus.Publish("bento-dead.billing", dead))
		assert.Equal(t, 1, depth(t, db, "billing.dead"), "a copy on another topic is a message of its own, delivered once")
		held.Ack()

		_, deadCh := subscribe(t, bus, "billing.dead")
		got := receive(t, deadCh, 5*time.Second)
		assert.Equal(t, m.UUID, got.UUID)
		assert.Equal(t, "permanent", got.Metadata.Get("bento_dead_reason"))
		assert.JSONEq(t, `{"n":1,"dead":true}`, string(got.Payload))
		got.Ack()
		testenv.WaitFor(t, 5*time.Second, "both acks", func() bool {
			return depth(t, db, "billing") == 0 && depth(t, db, "billing.dead") == 0
		})
		var bodies int64
		require.NoError(t, db.Raw("SELECT count(*) FROM dbbus_messages").Scan(&bodies).Error)
		assert.Zero(t, bodies, "a body outlived its last delivery")
	})
}

// TestAckOfALeaseWithoutTopic acks, with dbbus.Ack, leases built by hand
// without their Topic: the deliveries must go, and the body with the last
// of them, as with the leases LeaseOf returns.
func TestAckOfALeaseWithoutTopic(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		bus := setup(t, db, dbbus.Config{VisibilityTimeout: time.Hour})
		for _, g := range []string{"billing", "audit"} {
			require.NoError(t, dbbus.DeclareGroup(t.Context(), db, g, "order.*"))
		}
		require.NoError(t, bus.Publish("order.paid", newMessage(`1`)))
		bodies := func() (n int64) {
			require.NoError(t, db.Raw(`SELECT count(*) FROM dbbus_messages`).Scan(&n).Error)
			return n
		}
		for i, g := range []string{"billing", "audit"} {
			_, ch := subscribe(t, bus, g)
			l, ok := dbbus.LeaseOf(receive(t, ch, 5*time.Second))
			require.True(t, ok)
			assert.Equal(t, "order.paid", l.Topic)
			l.Topic = ""
			require.NoError(t, dbbus.Ack(t.Context(), db, l))
			assert.Zero(t, depth(t, db, g), "the delivery of %s is acked", g)
			assert.Equal(t, int64(1-i), bodies(), "the body goes with the last delivery, not before")
		}
	})
}

// TestClaimsAndAcksCommitAsynchronously: on PostgreSQL a claim and a
// subscription's ack make their own transaction commit without waiting
// for the WAL flush (a crash of the server can only undo them, which
// delivers their messages again), and leave the setting to that
// transaction: the next transaction on the same connection commits
// synchronously again. Ack, which may run inside the caller's
// transaction, must leave that transaction synchronous.
func TestClaimsAndAcksCommitAsynchronously(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	bus := setup(t, db, dbbus.Config{})
	ctx := t.Context()
	require.NoError(t, dbbus.DeclareGroup(ctx, db, "billing", "order.*"))
	require.NoError(t, bus.Publish("order.paid", newMessage(`{"n":1}`), newMessage(`{"n":2}`)))

	syncCommit := func(tx *gorm.DB) string {
		var s string
		require.NoError(t, tx.Raw("SHOW synchronous_commit").Row().Scan(&s))
		return s
	}
	require.NoError(t, db.WithContext(ctx).Connection(func(conn *gorm.DB) error {
		var rows []struct {
			ID        int64
			MessageID string
			Topic     string
		}
		require.NoError(t, conn.Transaction(func(tx *gorm.DB) error {
			require.NoError(t, tx.Raw(dbbus.PostgresClaimSQL, map[string]any{
				"group": "billing", "limit": 10, "token": "tok", "ms": 30000}).Scan(&rows).Error)
			assert.Equal(t, "off", syncCommit(tx), "the claim's transaction commits asynchronously")
			return nil
		}))
		require.Len(t, rows, 2)
		assert.Equal(t, "on", syncCommit(conn), "the claim leaves the next transaction synchronous")

		require.NoError(t, conn.Transaction(func(tx *gorm.DB) error {
			lease := dbbus.Lease{Group: "billing", Delivery: rows[0].ID, MessageID: rows[0].MessageID, Topic: rows[0].Topic, Token: "tok"}
			require.NoError(t, dbbus.Ack(ctx, tx, lease))
			assert.Equal(t, "on", syncCommit(tx), "Ack leaves the caller's transaction synchronous")
			return nil
		}))
		require.NoError(t, conn.Transaction(func(tx *gorm.DB) error {
			var gone []int64
			require.NoError(t, tx.Raw(dbbus.PostgresAsyncAckSQL, []int64{rows[1].ID}, "tok").Scan(&gone).Error)
			assert.Equal(t, []int64{rows[1].ID}, gone)
			assert.Equal(t, "off", syncCommit(tx), "a subscription's ack commits asynchronously")
			return nil
		}))
		assert.Equal(t, "on", syncCommit(conn), "the ack leaves the next transaction synchronous")
		return nil
	}))
}
