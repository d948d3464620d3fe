package embedded_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/projector"
	"github.com/bentoevents/bento/uow"
)

// Account is the tests' aggregate.
type Account struct {
	aggregate.Base
	Balance int64
}

func (*Account) AggregateType() string { return "account" }

// Opened is consumed by no group in these tests.
type Opened struct{}

func (Opened) EventType() string { return "account.opened" }

// Deposited is consumed by the "ledger" group.
type Deposited struct {
	Amount int64 `json:"amount"`
}

func (Deposited) EventType() string { return "account.deposited" }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openAccount(ctx context.Context, units *uow.Manager, id string) error {
	return units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
		a := &Account{}
		a.ID = id
		a.Record(Opened{})
		a.Balance = 10
		a.Record(Deposited{Amount: 10})
		return u.Add(a)
	})
}

// openMemory opens a stack on a new SQLite file and the in-memory bus.
func openMemory(t *testing.T) *embedded.Stack {
	t.Helper()
	s, err := embedded.Open(context.Background(), &embedded.Config{Path: filepath.Join(t.TempDir(), "bento.db"), Memory: true})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	require.NoError(t, s.DB.AutoMigrate(&Account{}))
	return s
}

// TestUnconsumedEventDoesNotHoldBackItsAggregate: an aggregate's first
// event is one no group consumes, its second one a group does. The
// in-memory bus parks the first in its alternate queue, as RabbitMQ does, so both
// are relayed and the group receives the second. Without the alternate
// queue the first fails to publish and holds the second back: the attack
// the default defends against.
func TestUnconsumedEventDoesNotHoldBackItsAggregate(t *testing.T) {
	for _, tc := range []struct {
		name      string
		alternate bool
	}{{"with the default alternate queue", true}, {"without an alternate queue", false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := openMemory(t)
			if !tc.alternate {
				require.NoError(t, s.Memory.DeclareAlternate(""))
			}
			ledger, err := consumer.NewMemory(s.DB, s.Memory, &consumer.Config{Group: "ledger", Logger: quiet})
			require.NoError(t, err)
			var (
				mu       sync.Mutex
				received []int64
			)
			require.NoError(t, consumer.Handle(ledger, func(ctx context.Context, _ *gorm.DB, e Deposited, env *messaging.Envelope) error {
				mu.Lock()
				defer mu.Unlock()
				received = append(received, env.AggregateVersion)
				return nil
			}))
			done := make(chan error, 1)
			go func() { done <- ledger.Run(ctx) }()
			<-ledger.Running()
			defer func() { cancel(); require.NoError(t, <-done) }()

			require.NoError(t, openAccount(ctx, s.Units, "acc-1"))
			res, err := s.Projector.Drain(ctx)
			require.NoError(t, err)
			if !tc.alternate {
				assert.Equal(t, 1, res.Failed, "the unconsumed event fails to publish")
				assert.Equal(t, 0, res.Published, "and holds back the event after it")
				stats, err := s.Outbox.Stats(ctx, nil)
				require.NoError(t, err)
				assert.EqualValues(t, 2, stats.Pending, "both events wait in the outbox")
				return
			}
			assert.Equal(t, 0, res.Failed)
			assert.Equal(t, 2, res.Published, "both events relayed")
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				mu.Lock()
				n := len(received)
				mu.Unlock()
				if n > 0 {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			mu.Lock()
			assert.Equal(t, []int64{2}, received, "the ledger received the deposit, version 2")
			mu.Unlock()
			parked, err := s.Memory.Subscriber(messaging.MemoryUnroutableQueue).Subscribe(ctx, "")
			require.NoError(t, err)
			select {
			case m := <-parked:
				assert.Equal(t, "account.opened", m.Metadata.Get(messaging.MetaEventType), "the unconsumed event is parked")
				m.Ack()
			case <-time.After(5 * time.Second):
				t.Fatal("nothing parked in the alternate queue")
			}
		})
	}
}

// TestDefaultBusSurvivesAClose: by default the projector publishes to the
// database bus in the same SQLite file. What it relayed and nobody
// consumed yet is still there when the file is opened again (as after a
// crash); an event no group is bound to is kept aside in
// dbbus.UnroutableGroup instead of failing and holding back the
// aggregate's next event.
func TestDefaultBusSurvivesAClose(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	path := filepath.Join(t.TempDir(), "bento.db")
	s, err := embedded.Open(ctx, &embedded.Config{Path: path})
	require.NoError(t, err)
	require.NotNil(t, s.Bus, "the database bus is the default")
	assert.Nil(t, s.Memory)
	require.NoError(t, s.DB.AutoMigrate(&Account{}))
	require.NoError(t, dbbus.DeclareGroup(ctx, s.DB, "ledger", "account.deposited"))
	require.NoError(t, openAccount(ctx, s.Units, "acc-1"))
	res, err := s.Projector.Drain(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, res.Published, "both events relayed, the unconsumed one too")
	require.NoError(t, s.Close())

	s, err = embedded.Open(ctx, &embedded.Config{Path: path})
	require.NoError(t, err)
	defer func() { assert.NoError(t, s.Close()) }()
	parked, err := dbbus.Depth(ctx, s.DB, dbbus.UnroutableGroup)
	require.NoError(t, err)
	assert.Equal(t, 1, parked, "account.opened is kept aside")
	msgs, err := s.Bus.Subscriber().Subscribe(ctx, "ledger")
	require.NoError(t, err)
	select {
	case m := <-msgs:
		assert.Equal(t, "account.deposited", m.Metadata.Get(messaging.MetaEventType))
		assert.Equal(t, "2", m.Metadata.Get(messaging.MetaAggregateVersion))
		m.Ack()
	case <-time.After(5 * time.Second):
		t.Fatal("the relayed event was lost when the stack closed")
	}
}

// TestCommitsWakeTheProjector: a commit wakes the running projector (no
// NOTIFY on SQLite), and the caller's AfterCommit runs too.
func TestCommitsWakeTheProjector(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var afterCommit sync.WaitGroup
	afterCommit.Add(1)
	pcfg := &projector.Config{IdleSleep: time.Hour} // only a wake-up can relay
	s, err := embedded.Open(ctx, &embedded.Config{
		Path:      filepath.Join(t.TempDir(), "bento.db"),
		Units:     &uow.Config{AfterCommit: func(events int) { assert.Equal(t, 2, events); afterCommit.Done() }},
		Projector: pcfg,
	})
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.DB.AutoMigrate(&Account{}))
	require.NoError(t, dbbus.DeclareGroup(ctx, s.DB, "audit", "account.*"))
	go func() { _ = s.Projector.Run(ctx) }()
	time.Sleep(50 * time.Millisecond) // the projector's first pass found nothing and sleeps
	require.NoError(t, openAccount(ctx, s.Units, "acc-1"))
	afterCommit.Wait()
	msgs, err := s.Bus.Subscriber().Subscribe(ctx, "audit")
	require.NoError(t, err)
	for _, want := range []string{"account.opened", "account.deposited"} {
		select {
		case m := <-msgs:
			assert.Equal(t, want, m.Metadata.Get(messaging.MetaEventType))
			m.Ack()
		case <-time.After(5 * time.Second):
			t.Fatalf("%s not relayed: the commit did not wake the projector", want)
		}
	}
}

// TestOpenWithYourDatabaseAndPublisher: Config.DB and Config.Publisher
// replace the SQLite file and the database bus; Close leaves both open.
func TestOpenWithYourDatabaseAndPublisher(t *testing.T) {
	ctx := context.Background()
	db, err := embedded.OpenSQLite(filepath.Join(t.TempDir(), "mine.db"), nil)
	require.NoError(t, err)
	bus := messaging.NewMemoryBus()
	defer bus.Close()
	s, err := embedded.Open(ctx, &embedded.Config{DB: db, Publisher: bus})
	require.NoError(t, err)
	assert.Same(t, db, s.DB)
	assert.Nil(t, s.Bus, "no bus of its own")
	assert.Nil(t, s.Memory, "no bus of its own")
	require.NoError(t, s.Close())
	sqlDB, err := db.DB()
	require.NoError(t, err)
	assert.NoError(t, sqlDB.Ping(), "your database stays open")
	assert.NoError(t, bus.DeclareQueue("g", "x.y"), "your bus stays open")
	var n int64
	require.NoError(t, db.Model(&outbox.Message{}).Count(&n).Error, "Open created the outbox table")
}

// TestOpenRejectsABadConfig: a contradictory projector config is refused
// with the projector's typed error, and nothing is left open.
func TestOpenRejectsABadConfig(t *testing.T) {
	pcfg := &projector.Config{BackoffFloor: time.Minute, BackoffCeiling: time.Second}
	_, err := embedded.Open(context.Background(), &embedded.Config{Path: filepath.Join(t.TempDir(), "bento.db"), Projector: pcfg})
	require.Error(t, err)
	assert.True(t, errors.Is(err, projector.ErrInvalidConfig), "got %v", err)
}
