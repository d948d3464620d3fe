package uow_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/uow"
)

var errInjected = errors.New("injected failure")

// failOn registers a GORM callback that fails statements on table when armed.
// The returned function disarms it.
func failOn(t *testing.T, db *gorm.DB, kind, table string) (disarm func()) {
	t.Helper()
	armed := true
	fail := func(tx *gorm.DB) {
		// GORM's own statements name their table; the outbox writes its
		// rows with a plain INSERT (through the Raw chain).
		if armed && (tx.Statement.Table == table ||
			strings.HasPrefix(tx.Statement.SQL.String(), "INSERT INTO "+table+" ")) {
			_ = tx.AddError(errInjected)
		}
	}
	name := "test:fail_" + kind + "_" + table
	var errs []error
	switch kind {
	case "before_create": // during the INSERT, before it reaches the database
		errs = append(errs, db.Callback().Create().Before("gorm:create").Register(name, fail),
			db.Callback().Raw().Before("gorm:raw").Register(name, fail))
	case "after_update": // after the UPDATE has run in the transaction
		errs = append(errs, db.Callback().Update().After("gorm:update").Register(name, fail))
	case "after_create":
		errs = append(errs, db.Callback().Create().After("gorm:create").Register(name, fail),
			db.Callback().Raw().After("gorm:raw").Register(name, fail))
	default:
		t.Fatalf("unknown kind %q", kind)
	}
	require.NoError(t, errors.Join(errs...))
	return func() { armed = false }
}

// TestCommitAtomicity injects a failure at each point of the commit and
// checks that neither the aggregate nor any event is visible afterwards, and
// that the aggregate still holds its pending events and version, so a later
// commit writes them exactly once.
func TestCommitAtomicity(t *testing.T) {
	cases := []struct {
		name string
		// existing: the account is stored first and the failing unit updates it.
		existing bool
		kind     string
		table    string
	}{
		{"new aggregate, outbox insert fails", false, "before_create", "outbox_events"},
		{"new aggregate, fails after outbox insert ran", false, "after_create", "outbox_events"},
		{"new aggregate, fails after aggregate insert", false, "after_create", "accounts"},
		{"existing aggregate, fails after aggregate update", true, "after_update", "accounts"},
		{"existing aggregate, outbox insert fails", true, "before_create", "outbox_events"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
				e := setup(t, b, db)
				ctx := context.Background()
				var a *Account
				if tc.existing {
					e.commitNew(t, "acc-1")
					a = e.load(t, "acc-1")
				} else {
					a = OpenAccount("acc-1", "ann")
				}
				require.NoError(t, a.Deposit(10))
				before := a.PendingEvents()
				versionBefore := a.Version
				rowsBefore := e.outboxRows(t)

				disarm := failOn(t, db, tc.kind, tc.table)
				err := e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Track(a) })
				require.ErrorIs(t, err, errInjected)
				disarm()

				// Nothing of the failed unit is visible.
				assert.Equal(t, rowsBefore, e.outboxRows(t), "outbox changed by a failed commit")
				if tc.existing {
					stored := e.load(t, "acc-1")
					assert.Equal(t, int64(1), stored.Version)
					assert.Equal(t, int64(0), stored.Balance)
				} else {
					assert.Equal(t, int64(0), e.count(t, &Account{}), "aggregate saved by a failed commit")
				}
				// The aggregate is as it was before the commit.
				assert.Equal(t, before, a.PendingEvents())
				assert.Equal(t, versionBefore, a.Version)

				// Committing again writes the same events exactly once.
				err = e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Track(a) })
				require.NoError(t, err)
				assert.Empty(t, a.PendingEvents())
				rows := e.outboxRows(t)
				require.Len(t, rows, len(rowsBefore)+len(before))
				for i, ev := range before {
					row := rows[len(rowsBefore)+i]
					assert.Equal(t, ev.AggregateVersion, row.AggregateVersion)
					assert.Equal(t, ev.Topic(), row.Topic)
				}
				assert.Equal(t, versionBefore, e.load(t, "acc-1").Version)
			})
		})
	}
}

// TestFunctionErrorRollsBack checks that an error or panic from Run's
// function discards everything the unit did, including the caller's own
// queries on the unit's transaction.
func TestFunctionErrorRollsBack(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		a := OpenAccount("acc-1", "ann")
		err := e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			require.NoError(t, u.Track(a))
			// A write of the caller's own through the context's transaction.
			other := OpenAccount("acc-2", "bob")
			other.Version = 1
			require.NoError(t, uow.DB(ctx, db).Create(other).Error)
			return errInjected
		})
		require.ErrorIs(t, err, errInjected)
		assert.Equal(t, int64(0), e.count(t, &Account{}))
		assert.Empty(t, e.outboxRows(t))
		assert.Len(t, a.PendingEvents(), 1)

		assert.PanicsWithValue(t, "boom", func() {
			_ = e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
				require.NoError(t, u.Track(a))
				require.NoError(t, u.Tx(ctx).Create(&Account{Owner: "x", Base: a.Base}).Error)
				panic("boom")
			})
		})
		assert.Equal(t, int64(0), e.count(t, &Account{}))
		assert.Empty(t, e.outboxRows(t))
	})
}

// TestFailureAtCommitLeavesNothing makes the database refuse the COMMIT
// itself (a deferred foreign key checked only then). Nothing is written, the
// aggregate keeps its events, and the connection is clean for the next unit
// (the pool holds one connection, so a transaction left open on it would
// break the next Begin).
func TestFailureAtCommitLeavesNothing(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		sqlDB, err := db.DB()
		require.NoError(t, err)
		sqlDB.SetMaxOpenConns(1)
		require.NoError(t, db.Exec(`CREATE TABLE targets (id INTEGER PRIMARY KEY)`).Error)
		require.NoError(t, db.Exec(`CREATE TABLE bombs (id INTEGER PRIMARY KEY,
			ref INTEGER REFERENCES targets(id) DEFERRABLE INITIALLY DEFERRED)`).Error)

		a := OpenAccount("acc-1", "ann")
		err = e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			require.NoError(t, u.Add(a))
			return u.Tx(ctx).Exec("INSERT INTO bombs (id, ref) VALUES (1, 42)").Error
		})
		require.Error(t, err, "the COMMIT is refused")
		assert.Len(t, a.PendingEvents(), 1)
		assert.Equal(t, int64(0), e.count(t, &Account{}))
		assert.Empty(t, e.outboxRows(t))
		var bombs int64
		require.NoError(t, db.Table("bombs").Count(&bombs).Error)
		assert.Equal(t, int64(0), bombs)

		require.NoError(t, e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(a) }),
			"the next unit on the same connection works")
		assert.Len(t, e.outboxRows(t), 1)
	})
}
