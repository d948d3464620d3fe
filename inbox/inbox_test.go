package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
	"github.com/bentoevents/bento/uow"
)

// Effect is the row a handler writes: counting them counts applications.
type Effect struct {
	ID        uint `gorm:"primaryKey"`
	MessageID string
}

// Stock is the aggregate a chained handler changes.
type Stock struct {
	aggregate.Base
	Reserved int
}

func (*Stock) AggregateType() string { return "stock" }

type StockReserved struct {
	SKU     string `json:"sku"`
	OrderID string `json:"order_id"`
}

func (StockReserved) EventType() string { return "stock.reserved" }

// Bomb makes a transaction fail at COMMIT: its reference is checked only
// then (a deferred foreign key), so every statement before succeeds.
type Bomb struct {
	ID  uint `gorm:"primaryKey"`
	Ref uint
}

type env struct {
	db    *gorm.DB
	in    *inbox.Inbox
	units *uow.Manager
}

func setup(t testing.TB, db *gorm.DB, consumer string) *env {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, outbox.Migrate(ctx, db))
	require.NoError(t, inbox.Migrate(ctx, db))
	require.NoError(t, db.AutoMigrate(&Effect{}, &Stock{}))
	require.NoError(t, db.Exec(`CREATE TABLE IF NOT EXISTS targets (id INTEGER PRIMARY KEY)`).Error)
	require.NoError(t, db.Exec(`CREATE TABLE IF NOT EXISTS bombs (id INTEGER PRIMARY KEY,
		ref INTEGER REFERENCES targets(id) DEFERRABLE INITIALLY DEFERRED)`).Error)
	in, err := inbox.New(db, &inbox.Config{Consumer: consumer})
	require.NoError(t, err)
	units, err := uow.New(db, nil)
	require.NoError(t, err)
	return &env{db: db, in: in, units: units}
}

func (e *env) count(t testing.TB, model any, where string, args ...any) int64 {
	t.Helper()
	var n int64
	q := e.db.Model(model)
	if where != "" {
		q = q.Where(where, args...)
	}
	require.NoError(t, q.Count(&n).Error)
	return n
}

// writeEffect is a handler that writes one Effect row in the inbox's
// transaction.
func writeEffect(calls *atomic.Int32) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		return nil, uow.DB(msg.Context(), nil).Create(&Effect{MessageID: msg.UUID}).Error
	}
}

func newMsg(id string) *message.Message {
	m := message.NewMessage(id, []byte(`{}`))
	m.Metadata.Set(messaging.MetaTenantID, "acme")
	return m
}

func TestSameMessageTwiceAppliesOnce(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "billing")
		var calls atomic.Int32
		h := e.in.Middleware(writeEffect(&calls))
		for i := 0; i < 3; i++ {
			_, err := h(newMsg("m-1"))
			require.NoError(t, err, "a duplicate is acknowledged, not an error")
		}
		assert.EqualValues(t, 1, calls.Load())
		assert.Equal(t, int64(1), e.count(t, &Effect{}, ""))
		assert.Equal(t, int64(1), e.count(t, &inbox.Record{}, "consumer = 'billing' AND message_id = 'm-1' AND tenant_id = 'acme'"))

		// Another consumer of the same message applies it for itself.
		other, err := inbox.New(db, &inbox.Config{Consumer: "shipping"})
		require.NoError(t, err)
		_, err = other.Middleware(writeEffect(&calls))(newMsg("m-1"))
		require.NoError(t, err)
		assert.Equal(t, int64(2), e.count(t, &Effect{}, ""))
		ok, err := other.Processed(context.Background(), "m-1")
		require.NoError(t, err)
		assert.True(t, ok)
	})
}

// TestRacingDeliveriesApplyOnce delivers each of 30 messages twice at the
// same moment from two goroutines.
func TestRacingDeliveriesApplyOnce(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "billing")
		var calls atomic.Int32
		h := e.in.Middleware(writeEffect(&calls))
		for i := 0; i < 30; i++ {
			id := fmt.Sprintf("m-%d", i)
			start := make(chan struct{})
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for g := 0; g < 2; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					<-start
					_, errs[g] = h(newMsg(id))
				}(g)
			}
			close(start)
			wg.Wait()
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
		}
		assert.EqualValues(t, 30, calls.Load())
		assert.Equal(t, int64(30), e.count(t, &Effect{}, ""))
		var distinct int64
		require.NoError(t, db.Model(&Effect{}).Distinct("message_id").Count(&distinct).Error)
		assert.Equal(t, int64(30), distinct)
	})
}

// TestBlockedDuplicateWaitsForTheFirst holds the first delivery inside its
// handler while a second delivery of the same message starts: the second
// must not apply it, and must apply it if the first rolls back.
func TestBlockedDuplicateWaitsForTheFirst(t *testing.T) {
	for _, outcome := range []string{"first commits", "first fails"} {
		t.Run(outcome, func(t *testing.T) {
			testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
				e := setup(t, db, "billing")
				entered, release := make(chan struct{}), make(chan struct{})
				var calls atomic.Int32
				first := e.in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
					calls.Add(1)
					if err := uow.DB(msg.Context(), nil).Create(&Effect{MessageID: msg.UUID}).Error; err != nil {
						return nil, err
					}
					close(entered)
					<-release
					if outcome == "first fails" {
						return nil, errors.New("handler failed")
					}
					return nil, nil
				})
				second := e.in.Middleware(writeEffect(&calls))

				firstDone := make(chan error, 1)
				go func() { _, err := first(newMsg("m-1")); firstDone <- err }()
				<-entered
				secondDone := make(chan error, 1)
				go func() { _, err := second(newMsg("m-1")); secondDone <- err }()
				select {
				case err := <-secondDone:
					t.Fatalf("the second delivery finished (%v) while the first was still applying", err)
				case <-time.After(100 * time.Millisecond):
				}
				close(release)
				errFirst := <-firstDone
				require.NoError(t, <-secondDone)
				if outcome == "first commits" {
					require.NoError(t, errFirst)
					assert.EqualValues(t, 1, calls.Load(), "the second delivery was skipped")
				} else {
					require.Error(t, errFirst)
					assert.EqualValues(t, 2, calls.Load(), "the second delivery applied it")
				}
				assert.Equal(t, int64(1), e.count(t, &Effect{}, ""))
				assert.Equal(t, int64(1), e.count(t, &inbox.Record{}, ""))
			})
		})
	}
}

// TestFailingTwiceThenSucceeding: exactly one effect and one inbox record.
func TestFailingTwiceThenSucceeding(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "billing")
		var calls atomic.Int32
		h := e.in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			n := calls.Add(1)
			if err := uow.DB(msg.Context(), nil).Create(&Effect{MessageID: msg.UUID}).Error; err != nil {
				return nil, err
			}
			if n <= 2 {
				return nil, fmt.Errorf("attempt %d fails", n)
			}
			return nil, nil
		})
		for i := 1; i <= 2; i++ {
			_, err := h(newMsg("m-1"))
			require.Error(t, err)
			assert.Equal(t, int64(0), e.count(t, &inbox.Record{}, ""), "a failed attempt leaves no record")
		}
		_, err := h(newMsg("m-1"))
		require.NoError(t, err)
		_, err = h(newMsg("m-1"))
		require.NoError(t, err)
		assert.EqualValues(t, 3, calls.Load())
		assert.Equal(t, int64(1), e.count(t, &Effect{}, ""))
		assert.Equal(t, int64(1), e.count(t, &inbox.Record{}, ""))
	})
}

// TestChainedHandlerCommitsAllOrNothing consumes order.placed in a handler
// that changes a Stock aggregate through a unit of work (joining the inbox
// transaction) and so emits stock.reserved. The first attempt's transaction
// is killed at COMMIT: no state change, no outbox row, no inbox record. On
// redelivery all three appear once, and stock.reserved carries the
// consumed message's correlation id and its id as causation id.
func TestChainedHandlerCommitsAllOrNothing(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "inventory")
		ctx := context.Background()
		require.NoError(t, e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			s := &Stock{}
			s.ID = "apple"
			return u.Add(s)
		}))
		var attempts, woken atomic.Int32
		// The handler's unit joins the inbox transaction; its AfterCommit
		// hook must run only once that transaction has committed.
		hooked, err := uow.New(db, &uow.Config{AfterCommit: func(n int) { woken.Add(int32(n)) }})
		require.NoError(t, err)
		h := e.in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			n := attempts.Add(1)
			err := hooked.Run(msg.Context(), func(ctx context.Context, u *uow.UnitOfWork) error {
				s, err := uow.Get[Stock](ctx, u, "apple")
				if err != nil {
					return err
				}
				s.Reserved++
				s.Record(StockReserved{SKU: "apple", OrderID: "o-1"})
				if n == 1 { // plant a reference checked only at COMMIT
					return u.Tx(ctx).Exec("INSERT INTO bombs (id, ref) VALUES (1, 42)").Error
				}
				return nil
			})
			return nil, err
		})
		placed := newMsg("01ORDERPLACEDEVENT00000001")
		placed.Metadata.Set(messaging.MetaCorrelationID, "corr-42")

		_, err = h(placed)
		require.Error(t, err, "the commit fails")
		assert.Zero(t, woken.Load(), "no AfterCommit hook for a transaction that failed to commit")
		t.Logf("commit error: %v", err)
		assert.Equal(t, int64(0), e.count(t, &Stock{}, "reserved > 0"), "no state change")
		assert.Equal(t, int64(0), e.count(t, &outbox.Message{}, "topic = 'stock.reserved'"), "no outbox row")
		assert.Equal(t, int64(0), e.count(t, &inbox.Record{}, ""), "no inbox record")

		for i := 0; i < 2; i++ { // the redelivery, then a duplicate of it
			_, err = h(placed)
			require.NoError(t, err)
		}
		assert.EqualValues(t, 2, attempts.Load())
		assert.EqualValues(t, 1, woken.Load(), "the hook ran once, for the one event committed")
		assert.Equal(t, int64(1), e.count(t, &Stock{}, "reserved = 1 AND version = 2"))
		assert.Equal(t, int64(1), e.count(t, &inbox.Record{}, ""))
		var rows []outbox.Message
		require.NoError(t, db.Where("topic = 'stock.reserved'").Find(&rows).Error)
		require.Len(t, rows, 1)
		assert.Equal(t, "corr-42", rows[0].Metadata[messaging.MetaCorrelationID])
		assert.Equal(t, placed.UUID, rows[0].Metadata[messaging.MetaCausationID])
		assert.Equal(t, "acme", rows[0].TenantID, "the emitted event keeps the message's tenant")
	})
}

func TestHandlerPanicRollsBack(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "billing")
		h := e.in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			require.NoError(t, uow.DB(msg.Context(), nil).Create(&Effect{MessageID: msg.UUID}).Error)
			panic("boom")
		})
		assert.PanicsWithValue(t, "boom", func() { _, _ = h(newMsg("m-1")) })
		assert.Equal(t, int64(0), e.count(t, &Effect{}, ""))
		assert.Equal(t, int64(0), e.count(t, &inbox.Record{}, ""))
	})
}

func TestUnusableMessagesAreRejected(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "billing")
		var calls atomic.Int32
		h := e.in.Middleware(writeEffect(&calls))
		_, err := h(message.NewMessage("", []byte(`{}`)))
		require.ErrorIs(t, err, inbox.ErrNoMessageID)
		_, err = h(message.NewMessage(string(make([]byte, 129)), []byte(`{}`)))
		require.ErrorIs(t, err, inbox.ErrNoMessageID)
		bad := newMsg("m-1")
		bad.Metadata.Set(messaging.MetaTenantID, "no spaces")
		_, err = h(bad)
		require.ErrorIs(t, err, messaging.ErrMalformedMessage)
		require.ErrorIs(t, err, tenant.ErrInvalid)
		assert.EqualValues(t, 0, calls.Load())
		assert.Equal(t, int64(0), e.count(t, &inbox.Record{}, ""))

		_, err = inbox.New(db, &inbox.Config{Consumer: "has space"})
		require.ErrorIs(t, err, inbox.ErrInvalidConfig)
		_, err = inbox.New(nil, nil)
		require.ErrorIs(t, err, inbox.ErrInvalidConfig)
		_, err = inbox.New(db, nil)
		require.ErrorIs(t, err, inbox.ErrInvalidConfig, "Consumer has no default")
		assert.Contains(t, err.Error(), "Consumer:")
		_, err = inbox.New(db, &inbox.Config{Consumer: "c", Versions: 9})
		require.ErrorIs(t, err, inbox.ErrInvalidConfig)
		assert.Contains(t, err.Error(), "Versions:")
		zero, err := inbox.New(db, &inbox.Config{Consumer: "c"})
		require.NoError(t, err, "every other field has a default")
		assert.Equal(t, "c", zero.Consumer())
	})
}

func TestPurgeKeepsTheWindow(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		setup(t, db, "billing")
		ctx := context.Background()
		now := time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)
		apply := func(consumer, id string, at time.Time) {
			in, err := inbox.New(db, &inbox.Config{Consumer: consumer, Clock: testenv.NewClock(at)})
			require.NoError(t, err)
			_, err = in.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(newMsg(id))
			require.NoError(t, err)
		}
		for i := 0; i < 5; i++ {
			apply("billing", fmt.Sprintf("old-%d", i), now.Add(-48*time.Hour))
		}
		apply("shipping", "old-s", now.Add(-48*time.Hour))
		apply("billing", "recent", now.Add(-time.Hour))

		clock := testenv.NewClock(now)
		n, err := inbox.CountPurgeable(ctx, db, 24*time.Hour, &inbox.PurgeOpts{Consumer: "billing", Clock: clock})
		require.NoError(t, err)
		assert.Equal(t, int64(5), n, "the dry run counts billing's old records")
		n, err = inbox.CountPurgeable(ctx, db, 24*time.Hour, &inbox.PurgeOpts{Clock: clock})
		require.NoError(t, err)
		assert.Equal(t, int64(6), n, "the dry run counts every consumer's old records")
		n, err = inbox.Purge(ctx, db, 24*time.Hour, &inbox.PurgeOpts{Consumer: "billing", BatchSize: 2, Clock: clock})
		require.NoError(t, err)
		assert.Equal(t, int64(5), n)
		n, err = inbox.Purge(ctx, db, 24*time.Hour, &inbox.PurgeOpts{Clock: clock})
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		var left []string
		require.NoError(t, db.Model(&inbox.Record{}).Pluck("message_id", &left).Error)
		assert.Equal(t, []string{"recent"}, left)

		// The crash counts of messages redelivered (inbox_attempts) go by
		// the same window: a row of a message never applied nor
		// dead-lettered (its group deleted, say) does not stay for ever.
		for id, at := range map[string]time.Time{"stale": now.Add(-48 * time.Hour), "fresh": now.Add(-time.Hour)} {
			require.NoError(t, db.Exec(`INSERT INTO inbox_attempts (consumer, message_id, running, crashes, updated_at)
VALUES ('billing', ?, 0, 2, ?)`, id, at).Error)
		}
		_, err = inbox.Purge(ctx, db, 24*time.Hour, &inbox.PurgeOpts{Clock: clock})
		require.NoError(t, err)
		var attempts []string
		require.NoError(t, db.Raw(`SELECT message_id FROM inbox_attempts`).Scan(&attempts).Error)
		assert.Equal(t, []string{"fresh"}, attempts)

		_, err = inbox.Purge(ctx, db, -time.Second, nil)
		assert.ErrorIs(t, err, inbox.ErrInvalidArgument)
		_, err = inbox.CountPurgeable(ctx, db, -time.Second, nil)
		assert.ErrorIs(t, err, inbox.ErrInvalidArgument)
	})
}

// TestClosedDatabase checks that a closed database handle gives the one
// closed-database error, whichever package's name the caller uses for it.
func TestClosedDatabase(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "closed")
		sqlDB, err := db.DB()
		require.NoError(t, err)
		require.NoError(t, sqlDB.Close())

		_, err = e.in.Processed(context.Background(), "m-1")
		require.ErrorIs(t, err, inbox.ErrClosed)
		require.ErrorIs(t, err, outbox.ErrClosed)
		require.ErrorIs(t, err, uow.ErrClosed)
		err = inbox.Migrate(context.Background(), db)
		require.ErrorIs(t, err, inbox.ErrClosed)
	})
}

// TestNewNeedsMigrate: New on a database without the inbox tables fails with
// ErrNotMigrated, and so it does when one of them is missing (a database
// migrated by an older bento); it succeeds once they exist (on the
// partitioned backend, partitioned from the start).
func TestNewNeedsMigrate(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		cfg := &inbox.Config{Consumer: "billing"}
		if !b.Partitioned {
			_, err := inbox.New(db, cfg)
			require.ErrorIs(t, err, inbox.ErrNotMigrated)
		}
		e := setup(t, db, "billing")
		require.NoError(t, e.db.Exec("DROP TABLE inbox_parked").Error)
		_, err := inbox.New(db, cfg)
		require.ErrorIs(t, err, inbox.ErrNotMigrated, "a table added by a later migration is missing")
	})
}
