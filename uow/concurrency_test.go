package uow_test

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/uow"
)

// TestConcurrentWritersOneWinnerPerVersion runs rounds in which 8 goroutines
// load the same account at the same version and then all commit a deposit at
// once. Exactly one commit per round may win; the others must get
// ErrConcurrencyConflict and write nothing, so the outbox holds exactly the
// winners' events and every winner produced a distinct version.
func TestConcurrentWritersOneWinnerPerVersion(t *testing.T) {
	const writers, rounds = 8, 6
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		e.commitNew(t, "acc-1")

		var winnerEvents []aggregate.Recorded
		versions := map[int64]bool{}
		for round := 0; round < rounds; round++ {
			copies := make([]*Account, writers)
			for i := range copies {
				copies[i] = e.load(t, "acc-1")
				require.NoError(t, copies[i].Deposit(int64(i+1)))
			}
			var (
				wg      sync.WaitGroup
				start   = make(chan struct{})
				errs    = make([]error, writers)
				winners atomic.Int32
			)
			for i := range copies {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					<-start
					u, err := e.units.Begin(ctx, nil)
					if err != nil {
						errs[i] = err
						return
					}
					if err := u.Track(copies[i]); err != nil {
						errs[i] = err
						return
					}
					errs[i] = u.Commit(ctx)
					if errs[i] == nil {
						winners.Add(1)
					}
				}(i)
			}
			close(start)
			wg.Wait()

			require.EqualValues(t, 1, winners.Load(), "round %d: exactly one writer must win", round)
			for i, err := range errs {
				if err == nil {
					assert.Empty(t, copies[i].PendingEvents())
					assert.False(t, versions[copies[i].Version], "version %d won twice", copies[i].Version)
					versions[copies[i].Version] = true
					continue
				}
				require.ErrorIs(t, err, uow.ErrConcurrencyConflict, "round %d writer %d", round, i)
				assert.Len(t, copies[i].PendingEvents(), 1, "a loser keeps its event")
			}
			for i, err := range errs {
				if err == nil {
					// Reconstruct the winner's event from its committed version.
					winnerEvents = append(winnerEvents, aggregate.Recorded{
						AggregateVersion: copies[i].Version,
						Event:            Deposited{AccountID: "acc-1", Amount: int64(i + 1)},
					})
				}
			}
		}

		stored := e.load(t, "acc-1")
		assert.Equal(t, int64(1+rounds), stored.Version)
		var wantBalance int64
		for _, w := range winnerEvents {
			wantBalance += w.Event.(Deposited).Amount
		}
		assert.Equal(t, wantBalance, stored.Balance, "balance is the sum of the winners' deposits")

		rows := e.outboxRows(t)
		require.Len(t, rows, 1+rounds, "outbox holds the opening event and one event per winner")
		sort.Slice(rows, func(i, j int) bool { return rows[i].AggregateVersion < rows[j].AggregateVersion })
		for i, w := range winnerEvents {
			r := rows[i+1]
			assert.Equal(t, w.AggregateVersion, r.AggregateVersion)
			assert.JSONEq(t, mustJSON(t, w.Event), string(r.Payload))
		}
	})
}

// TestRunRetriesConflict gives Run a function whose first attempt works on
// an aggregate loaded before another writer changed it: the commit conflicts,
// Run calls the function again, and the second attempt (which reloads)
// commits.
func TestRunRetriesConflict(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		e.commitNew(t, "acc-1")
		stale := e.load(t, "acc-1")
		rival := e.load(t, "acc-1")
		require.NoError(t, rival.Deposit(100))
		require.NoError(t, e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error { return u.Track(rival) }))

		calls := 0
		err := e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			calls++
			acc := stale
			if calls > 1 {
				var err error
				if acc, err = uow.Get[Account](ctx, u, "acc-1"); err != nil {
					return err
				}
			}
			if err := u.Track(acc); err != nil {
				return err
			}
			return acc.Deposit(5)
		})
		require.NoError(t, err)
		assert.Equal(t, 2, calls, "the conflicting attempt is retried once")
		stored := e.load(t, "acc-1")
		assert.Equal(t, int64(3), stored.Version)
		assert.Equal(t, int64(105), stored.Balance)
		rows := e.outboxRows(t)
		require.Len(t, rows, 3)
		assert.Len(t, stale.PendingEvents(), 1, "the losing attempt's aggregate keeps its event")
	})
}

// TestRunGivesUp checks that Run stops after MaxAttempts and returns the
// conflict.
func TestRunGivesUp(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		e.commitNew(t, "acc-1")
		units, err := uow.New(db, &uow.Config{MaxAttempts: 3})
		require.NoError(t, err)
		calls := 0
		err = units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			calls++
			stale := e.load(t, "acc-1")
			stale.Version-- // always behind the stored version
			require.NoError(t, u.Track(stale))
			return stale.Deposit(1)
		})
		require.ErrorIs(t, err, uow.ErrConcurrencyConflict)
		assert.Equal(t, 3, calls)
		assert.Len(t, e.outboxRows(t), 1)

		// A non-conflict error is not retried.
		calls = 0
		err = units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
			calls++
			return errors.New("domain rule broken")
		})
		require.Error(t, err)
		assert.Equal(t, 1, calls)
	})
}

// TestIDsSortInCommitOrder commits many events of one aggregate over several
// units and checks that ordering the outbox by id gives version order.
func TestIDsSortInCommitOrder(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		ctx := context.Background()
		e.commitNew(t, "acc-1")
		for i := 0; i < 20; i++ {
			err := e.units.Run(ctx, func(ctx context.Context, u *uow.UnitOfWork) error {
				acc, err := uow.Get[Account](ctx, u, "acc-1")
				if err != nil {
					return err
				}
				// Several events per unit, recorded in the same fake
				// millisecond: the ids must still increase.
				for j := 0; j < 3; j++ {
					if err := acc.Deposit(1); err != nil {
						return err
					}
				}
				return nil
			})
			require.NoError(t, err)
		}
		rows := e.outboxRows(t) // ordered by id
		require.Len(t, rows, 61)
		for i, r := range rows {
			assert.Equal(t, int64(i+1), r.AggregateVersion, "row %d (id %s)", i, r.ID)
		}
	})
}

// TestManyEventsInOneCommit commits 4,000 events of one aggregate, more than
// one INSERT statement can carry parameters for.
func TestManyEventsInOneCommit(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, b, db)
		a := OpenAccount("acc-1", "ann")
		for i := 0; i < 3999; i++ {
			require.NoError(t, a.Deposit(1))
		}
		err := e.units.Run(context.Background(), func(ctx context.Context, u *uow.UnitOfWork) error { return u.Add(a) })
		require.NoError(t, err)
		rows := e.outboxRows(t)
		require.Len(t, rows, 4000)
		assert.Equal(t, int64(4000), rows[3999].AggregateVersion)
		assert.Equal(t, int64(4000), e.load(t, "acc-1").Version)
	})
}
