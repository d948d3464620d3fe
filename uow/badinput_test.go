package uow_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
	"github.com/bentoevents/bento/uow"
)

// rawEvent lets a test record any type name and payload.
type rawEvent struct {
	Type string `json:"-"`
	Data any    `json:"data"`
}

func (e rawEvent) EventType() string { return e.Type }

// badType is an aggregate whose type name is malformed.
type badType struct{ Account }

func (*badType) AggregateType() string { return "9lives" }

func (*badType) TableName() string { return "accounts" }

// TestBadInputIsRejectedAndLosesNothing commits aggregates carrying each kind
// of bad input: the commit returns the typed error, the database is
// unchanged, and the aggregate keeps its pending events.
func TestBadInputIsRejectedAndLosesNothing(t *testing.T) {
	type tc struct {
		name string
		// make returns the aggregate to commit (already tracked by the test).
		make func(e *env) aggregate.Root
		opts *uow.BeginOpts
		want error
	}
	cases := []tc{
		{"empty topic", func(e *env) aggregate.Root { return withEvent(e, rawEvent{Type: "", Data: 1}) }, nil, uow.ErrInvalidEvent},
		{"topic with wildcard", func(e *env) aggregate.Root { return withEvent(e, rawEvent{Type: "order.*", Data: 1}) }, nil, outbox.ErrInvalidEvent},
		{"topic with space", func(e *env) aggregate.Root { return withEvent(e, rawEvent{Type: "order paid", Data: 1}) }, nil, outbox.ErrInvalidEvent},
		{"topic too long", func(e *env) aggregate.Root {
			return withEvent(e, rawEvent{Type: strings.Repeat("a", 101), Data: 1})
		}, nil, outbox.ErrInvalidEvent},
		{"payload that does not encode", func(e *env) aggregate.Root {
			return withEvent(e, rawEvent{Type: "account.odd", Data: func() {}})
		}, nil, outbox.ErrInvalidEvent},
		{"oversized payload", func(e *env) aggregate.Root {
			return withEvent(e, rawEvent{Type: "account.big", Data: strings.Repeat("x", outbox.DefaultMaxPayloadBytes)})
		}, nil, uow.ErrPayloadTooLarge},
		{"nil event", func(e *env) aggregate.Root { return withEvent(e, nil) }, nil, outbox.ErrInvalidEvent},
		{"empty aggregate id", func(e *env) aggregate.Root { return OpenAccount("", "ann") }, nil, uow.ErrInvalidAggregate},
		{"aggregate id too long", func(e *env) aggregate.Root {
			return OpenAccount(strings.Repeat("i", 65), "ann")
		}, nil, uow.ErrInvalidAggregate},
		{"id set after recording", func(e *env) aggregate.Root {
			a := OpenAccount("", "ann")
			a.ID = "acc-late"
			return a
		}, nil, outbox.ErrInvalidEvent},
		{"malformed aggregate type", func(e *env) aggregate.Root {
			b := &badType{}
			b.ID = "acc-9"
			b.Record(Opened{AccountID: "acc-9"})
			return b
		}, nil, uow.ErrInvalidAggregate},
		{"invalid tenant", func(e *env) aggregate.Root { return OpenAccount("acc-t", "ann") },
			&uow.BeginOpts{Tenant: "no spaces allowed"}, tenant.ErrInvalid},
		{"tenant too long", func(e *env) aggregate.Root { return OpenAccount("acc-t", "ann") },
			&uow.BeginOpts{Tenant: strings.Repeat("t", 33)}, tenant.ErrInvalid},
	}
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		e.commitNew(t, "acc-0") // something in both tables already
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				rowsBefore := e.outboxRows(t)
				accountsBefore := e.count(t, &Account{})
				a := c.make(e)
				pending := a.AggregateBase().PendingEvents()
				version := a.AggregateBase().Version

				u, err := e.units.Begin(ctx, c.opts)
				if err == nil {
					require.NoError(t, u.Track(a))
					err = u.Commit(ctx)
				}
				require.ErrorIs(t, err, c.want)
				t.Logf("error: %v", err)

				assert.Equal(t, rowsBefore, e.outboxRows(t))
				assert.Equal(t, accountsBefore, e.count(t, &Account{}))
				assert.Equal(t, versions(pending), versions(a.AggregateBase().PendingEvents()), "the aggregate keeps its events")
				assert.Equal(t, version, a.AggregateBase().Version)
			})
		}
	})
}

// withEvent returns a stored-looking new account carrying one event.
func withEvent(e *env, ev aggregate.Event) *Account {
	a := &Account{Owner: "ann"}
	a.ID = "acc-" + aggregate.NewID()
	a.Record(ev)
	return a
}

func TestGetMissingAggregate(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		err := e.units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error {
			_, err := uow.Get[Account](ctx, u, "nope")
			return err
		})
		require.ErrorIs(t, err, uow.ErrNotFound)
		assert.Contains(t, err.Error(), `account "nope"`)
	})
}

func TestUnitCannotBeReused(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		u, err := e.units.Begin(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, u.Commit(ctx))
		require.ErrorIs(t, u.Commit(ctx), uow.ErrDone)
		require.ErrorIs(t, u.Rollback(), uow.ErrDone)
		require.ErrorIs(t, u.Track(OpenAccount("a", "b")), uow.ErrDone)
		_, err = uow.Get[Account](ctx, u, "a")
		require.ErrorIs(t, err, uow.ErrDone)
		require.ErrorIs(t, u.Track(nil), uow.ErrDone)

		u, err = e.units.Begin(ctx, nil)
		require.NoError(t, err)
		require.ErrorIs(t, u.Track(nil), uow.ErrInvalidAggregate)
		require.NoError(t, u.Rollback())
	})
}

// TestClosedDatabase checks the error a unit of work gives once the
// database handle is closed, and that the aggregate keeps its events.
func TestClosedDatabase(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		a := OpenAccount("acc-1", "ann")
		sqlDB, err := db.DB()
		require.NoError(t, err)
		require.NoError(t, sqlDB.Close())

		err = e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Track(a) })
		require.ErrorIs(t, err, uow.ErrClosed)
		require.ErrorIs(t, err, outbox.ErrClosed, "one closed-database error across packages")
		assert.Contains(t, err.Error(), "database is closed")
		assert.Len(t, a.PendingEvents(), 1)
	})
}

// TestConfigValidation checks the config convention: nil and a zero
// Config take the documented defaults, and bad values fail with
// ErrInvalidConfig naming every field.
func TestConfigValidation(t *testing.T) {
	db := testenv.SQLite(t)
	require.NoError(t, outbox.Migrate(context.Background(), db))
	for name, cfg := range map[string]*uow.Config{"nil": nil, "zero": {}} {
		m, err := uow.New(db, cfg)
		require.NoError(t, err, name)
		c := m.Config()
		assert.Equal(t, tenant.Default, c.Tenant, name)
		assert.Equal(t, 4, c.MaxAttempts, name)
		assert.Equal(t, 2*time.Millisecond, c.RetryDelay, name)
		assert.NotNil(t, c.Outbox, name)
	}

	_, err := uow.New(db, &uow.Config{Tenant: "bad tenant", MaxAttempts: -1, RetryDelay: -1})
	require.ErrorIs(t, err, uow.ErrInvalidConfig)
	require.ErrorIs(t, err, tenant.ErrInvalid)
	for _, field := range []string{"Tenant:", "MaxAttempts:", "RetryDelay:"} {
		assert.Contains(t, err.Error(), field, "the error names every bad field")
	}
	_, err = uow.New(nil, nil)
	require.Error(t, err)
}

// versions lists the aggregate versions of rs (an event may hold a func,
// which no equality compares).
func versions(rs []aggregate.Recorded) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.AggregateVersion
	}
	return out
}
