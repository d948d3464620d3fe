package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/fakeclock"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/partition"
)

// The behavioural suites of this package also run on a partitioned table.
func init() {
	testenv.PartitionTables(func(t testing.TB, db *gorm.DB) {
		require.NoError(t, outbox.MigrateWith(context.Background(), db, &partition.MigrateOpts{Partitioning: partition.Daily}))
	})
}

// nov1 is the first day of the partitioned tests' fake calendar.
var nov1 = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

// day returns nov1 plus n days and h hours.
func day(n int, h time.Duration) time.Time { return nov1.AddDate(0, 0, n).Add(h) }

// partitionedEnv returns a store over a fresh PostgreSQL schema whose
// outbox_events is partitioned daily, migrated on Nov 1 with partitions up
// to Nov 11, and a clock reading Nov 1.
func partitionedEnv(t *testing.T) *env {
	t.Helper()
	db, _ := testenv.Postgres(t)
	require.NoError(t, outbox.MigrateWith(context.Background(), db, &partition.MigrateOpts{
		Partitioning: partition.Daily, Ahead: 10, Clock: fakeclock.New(nov1),
	}))
	st := testenv.NewClock(nov1)
	store, err := outbox.NewStore(db, &outbox.Config{Clock: st})
	require.NoError(t, err)
	return &env{db: db, store: store, stamper: st}
}

// partitions lists outbox_events' partitions by name.
func partitions(t *testing.T, db *gorm.DB) []string {
	t.Helper()
	var names []string
	require.NoError(t, db.Raw(`SELECT c.relname FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
		WHERE h.inhparent = 'outbox_events'::regclass ORDER BY 1`).Scan(&names).Error)
	return names
}

// partitionOf returns the partition holding the row with id.
func partitionOf(t *testing.T, db *gorm.DB, id string) string {
	t.Helper()
	var name string
	require.NoError(t, db.Raw("SELECT tableoid::regclass::text FROM outbox_events WHERE id = ?", id).Scan(&name).Error)
	return name
}

// addAt writes one event stamped at, optionally publishing it (sent) or
// failing it for good (dead).
func (e *env) addAt(t *testing.T, at time.Time, outcome outbox.Status, opts *outbox.AddOpts) *outbox.Message {
	t.Helper()
	ctx := context.Background()
	e.stamper.Set(at)
	m := e.add(ctx, t, "order.paid", orderPaid{OrderID: at.Format(time.RFC3339)}, opts)
	switch outcome {
	case outbox.StatusSent, outbox.StatusDead:
		claimed, err := e.store.Claim(ctx, outbox.ClaimOpts{Worker: "w", Limit: 1, Lease: lease})
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		require.Equal(t, m.ID, claimed[0].ID)
		if outcome == outbox.StatusSent {
			n, err := e.store.MarkSent(ctx, "w", []string{m.ID})
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
		} else {
			ok, err := e.store.MarkFailed(ctx, "w", outbox.Failure{ID: m.ID, Err: errors.New("broken"), Dead: true})
			require.NoError(t, err)
			require.True(t, ok)
		}
	}
	return m
}

func TestPartitionedMigrateCreatesPartitions(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	names := partitions(t, e.db)
	require.Len(t, names, 12, "Nov 1 to Nov 11 and the default: %v", names)
	assert.Equal(t, "outbox_events_default", names[0])
	assert.Equal(t, "outbox_events_p20261101", names[1])
	assert.Equal(t, "outbox_events_p20261111", names[11])

	m := e.addAt(t, day(3, 5*time.Hour), outbox.StatusNew, nil)
	assert.Equal(t, "outbox_events_p20261104", partitionOf(t, e.db, m.ID))
	m = e.addAt(t, day(40, 0), outbox.StatusNew, nil)
	assert.Equal(t, "outbox_events_default", partitionOf(t, e.db, m.ID), "a row outside every range is kept, not refused")

	// Migrate again, with or without the option: nothing changes.
	require.NoError(t, outbox.Migrate(context.Background(), e.db))
	require.NoError(t, outbox.MigrateWith(context.Background(), e.db, &partition.MigrateOpts{Partitioning: partition.Daily, Clock: fakeclock.New(nov1)}))
	assert.Equal(t, names, partitions(t, e.db))
	assert.Equal(t, int64(2), countRows(t, e.db, ""))
}

func TestPartitionedMigrateErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	daily := &partition.MigrateOpts{Partitioning: partition.Daily}

	err := outbox.MigrateWith(ctx, testenv.SQLite(t), daily)
	require.ErrorIs(t, err, partition.ErrUnsupported)
	_, err = outbox.Maintain(ctx, testenv.SQLite(t), nil)
	require.ErrorIs(t, err, partition.ErrUnsupported)

	fresh, _ := testenv.Postgres(t)
	err = outbox.MigrateWith(ctx, fresh, &partition.MigrateOpts{Partitioning: partition.Interval(9)})
	require.ErrorIs(t, err, partition.ErrUnknownInterval)
	var table *string
	require.NoError(t, fresh.Raw("SELECT to_regclass('outbox_events')::text").Scan(&table).Error)
	assert.Nil(t, table, "a bad interval is refused before any table is created")

	plain, _ := testenv.Postgres(t)
	require.NoError(t, outbox.Migrate(ctx, plain))
	require.ErrorIs(t, outbox.MigrateWith(ctx, plain, daily), partition.ErrNotPartitioned,
		"an existing unpartitioned table is not silently kept")
	_, err = outbox.Maintain(ctx, plain, nil)
	require.ErrorIs(t, err, partition.ErrNotPartitioned)

	e := partitionedEnv(t)
	err = outbox.MigrateWith(ctx, e.db, &partition.MigrateOpts{Partitioning: partition.Monthly})
	require.ErrorIs(t, err, partition.ErrIntervalMismatch)
}

func TestMaintainDropsOnlyFullySentPartitions(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	ctx := context.Background()

	sent1 := e.addAt(t, day(0, time.Hour), outbox.StatusSent, nil)
	sent2 := e.addAt(t, day(1, time.Hour), outbox.StatusSent, nil)
	dead := e.addAt(t, day(2, time.Hour), outbox.StatusDead, nil) // keeps Nov 3
	sent4 := e.addAt(t, day(3, time.Hour), outbox.StatusSent, nil)
	pending := e.addAt(t, day(1, 2*time.Hour), outbox.StatusNew, nil) // keeps Nov 2

	now := day(20, 3*time.Hour) // Nov 21
	before := partitions(t, e.db)
	plan, err := outbox.Maintain(ctx, e.db, &partition.MaintainOpts{Clock: fakeclock.New(now), DryRun: true})
	require.NoError(t, err)
	assert.Equal(t, before, partitions(t, e.db), "a dry run changes nothing")
	res, err := outbox.Maintain(ctx, e.db, &partition.MaintainOpts{Clock: fakeclock.New(now)})
	require.NoError(t, err)
	assert.ElementsMatch(t, res.Created, plan.Created, "the dry run foresaw what was created")
	assert.ElementsMatch(t, res.Sealed, plan.Sealed, "... sealed")
	assert.ElementsMatch(t, res.Dropped, plan.Dropped, "... dropped")
	assert.ElementsMatch(t, res.Kept, plan.Kept, "... kept")
	assert.NotEmpty(t, plan.Sealed)

	assert.Contains(t, res.Dropped, "outbox_events_p20261101")
	assert.Contains(t, res.Dropped, "outbox_events_p20261104")
	assert.Contains(t, res.Dropped, "outbox_events_p20261111", "empty partitions go too")
	assert.ElementsMatch(t, []string{"outbox_events_p20261102", "outbox_events_p20261103"}, res.Kept)
	assert.NotContains(t, res.Dropped, "outbox_events_p20261114", "inside the retention window")
	assert.Len(t, res.Created, 8, "Nov 21 and the 7 days after it")
	assert.Contains(t, res.Created, "outbox_events_p20261128")
	assert.Empty(t, res.Blocked)

	names := partitions(t, e.db)
	for _, gone := range []string{"outbox_events_p20261101", "outbox_events_p20261104"} {
		assert.NotContains(t, names, gone)
	}
	assert.Contains(t, names, "outbox_events_p20261102")
	assert.Contains(t, names, "outbox_events_p20261103")
	for _, m := range []*outbox.Message{sent1, sent2, sent4} {
		_, err := e.store.Get(ctx, m.ID)
		if m == sent2 {
			assert.NoError(t, err, "a sent row shares a kept partition with a pending one")
		} else {
			assert.ErrorIs(t, err, gorm.ErrRecordNotFound)
		}
	}
	for _, m := range []*outbox.Message{pending, dead} {
		_, err := e.store.Get(ctx, m.ID)
		assert.NoError(t, err, "a row that is not sent is never dropped")
	}

	// Once the dead row is requeued and sent, its partition goes.
	e.stamper.Set(now)
	n, err := e.store.Requeue(ctx, outbox.Filter{IDs: []string{dead.ID}}, false)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	claimed := e.claim(t, "w", 10)
	require.ElementsMatch(t, []string{pending.ID, dead.ID}, ids(claimed))
	_, err = e.store.MarkSent(ctx, "w", []string{dead.ID})
	require.NoError(t, err)
	res, err = outbox.Maintain(ctx, e.db, &partition.MaintainOpts{Clock: fakeclock.New(now)})
	require.NoError(t, err)
	assert.Equal(t, []string{"outbox_events_p20261103"}, res.Dropped)
	assert.Equal(t, []string{"outbox_events_p20261102"}, res.Kept, "its row is still publishing")
	assert.Empty(t, res.Created, "a second run has nothing to create")
}

func TestPartitionedClaimPrunesSealedPartitions(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	ctx := context.Background()
	for d := 0; d < 3; d++ {
		for h := 1; h <= 3; h++ {
			e.addAt(t, day(d, time.Duration(h)*time.Hour), outbox.StatusSent, nil)
		}
	}
	ready := e.addAt(t, day(3, time.Hour), outbox.StatusNew, nil)

	now := day(3, 2*time.Hour)
	res, err := outbox.Maintain(ctx, e.db, &partition.MaintainOpts{Clock: fakeclock.New(now)})
	require.NoError(t, err)
	assert.Equal(t, []string{"outbox_events_p20261101", "outbox_events_p20261102", "outbox_events_p20261103"}, res.Sealed)
	assert.Empty(t, res.Dropped, "all within retention")

	require.NoError(t, e.db.Exec("ANALYZE outbox_events").Error)
	var lines []string
	require.NoError(t, e.db.Raw("EXPLAIN "+outbox.PostgresClaimSQL(), outbox.PostgresClaimArgs(now, 100)).Scan(&lines).Error)
	plan := strings.Join(lines, "\n")
	t.Logf("claim plan with Nov 1-3 sealed:\n%s", plan)
	for _, sealed := range res.Sealed {
		assert.NotContains(t, plan, sealed, "a sealed partition is pruned from the claim")
	}
	assert.Contains(t, plan, "outbox_events_p20261104", "today's partition is scanned")
	assert.Contains(t, plan, "outbox_events_default", "the default partition is scanned")

	e.stamper.Set(now)
	assert.Equal(t, []string{ready.ID}, ids(e.claim(t, "w", 10)))

	// A late event stamped inside a sealed range fails its commit (and
	// writes nothing) rather than hiding where no claim looks.
	e.stamper.Set(day(1, 5*time.Hour))
	tx := begin(t, e.db)
	_, err = e.store.Add(ctx, tx, "order.paid", orderPaid{OrderID: "late"}, nil)
	require.Error(t, err)
	tx.Rollback()
	assert.Equal(t, int64(10), countRows(t, e.db, ""))
}

func TestPartitionedDedupKeySpansPartitions(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	ctx := context.Background()
	first := e.addAt(t, day(0, time.Hour), outbox.StatusSent, &outbox.AddOpts{DedupKey: "k1",
		AggregateType: "order", AggregateID: "o-1", AggregateVersion: 1})

	e.stamper.Set(day(5, time.Hour))
	tx := begin(t, e.db)
	_, err := e.store.Add(ctx, tx, "order.paid", orderPaid{}, &outbox.AddOpts{AggregateType: "order", AggregateID: "o-1", AggregateVersion: 1})
	require.ErrorIs(t, err, outbox.ErrDuplicateVersion, "a version taken in another partition")
	tx.Rollback()
	tx = begin(t, e.db)
	_, err = e.store.Add(ctx, tx, "order.paid", orderPaid{OrderID: "again"}, &outbox.AddOpts{DedupKey: "k1"})
	require.ErrorIs(t, err, outbox.ErrDuplicateKey, "a key taken in another partition")
	tx.Rollback()
	other := e.addAt(t, day(5, time.Hour), outbox.StatusNew, &outbox.AddOpts{DedupKey: "k1", Tenant: "acme"})
	assert.NotEqual(t, partitionOf(t, e.db, first.ID), partitionOf(t, e.db, other.ID))

	// Dropping the partition of the first event frees its key.
	res, err := outbox.Maintain(ctx, e.db, &partition.MaintainOpts{Clock: fakeclock.New(day(9, 0))})
	require.NoError(t, err)
	require.Contains(t, res.Dropped, "outbox_events_p20261101")
	e.addAt(t, day(9, time.Hour), outbox.StatusNew, &outbox.AddOpts{DedupKey: "k1"})
	var keys int64
	require.NoError(t, e.db.Raw("SELECT count(*) FROM outbox_dedup_keys").Scan(&keys).Error)
	assert.Equal(t, int64(2), keys, "default k1 (new) and acme k1")
	require.NoError(t, e.db.Raw("SELECT count(*) FROM outbox_aggregate_versions").Scan(&keys).Error)
	assert.Equal(t, int64(0), keys, "the dropped event's version is free again")
}

func TestMaintainYieldsOnLockTimeout(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	ctx := context.Background()
	e.addAt(t, day(0, time.Hour), outbox.StatusSent, nil)
	e.stamper.Set(day(20, 0))
	ready := e.add(ctx, t, "order.paid", orderPaid{OrderID: "now"}, nil)

	// A long reader holds the table: maintenance must give up quickly, and
	// leave the partition alone.
	reader := begin(t, e.db)
	require.NoError(t, reader.Exec("LOCK TABLE outbox_events IN ACCESS SHARE MODE").Error)
	start := time.Now()
	res, err := outbox.Maintain(ctx, e.db, &partition.MaintainOpts{
		LockTimeout: 50 * time.Millisecond, Clock: fakeclock.New(day(20, 0)),
	})
	elapsed := time.Since(start)
	require.ErrorIs(t, err, partition.ErrLockTimeout)
	var me *partition.StepError
	require.ErrorAs(t, err, &me)
	assert.Equal(t, "create", me.Step, "the first step that needs a lock the reader holds")
	assert.Less(t, elapsed, 3*time.Second, "maintenance stops at the first lock timeout")
	assert.NotContains(t, res.Dropped, "outbox_events_p20261101")
	assert.Contains(t, partitions(t, e.db), "outbox_events_p20261101")

	// Nothing waits behind it: a claim goes through while the reader holds on.
	claimCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	claimed, err := e.store.Claim(claimCtx, outbox.ClaimOpts{Worker: "w", Limit: 10, Lease: lease})
	require.NoError(t, err)
	assert.Equal(t, []string{ready.ID}, ids(claimed))

	require.NoError(t, reader.Rollback().Error)
	res, err = outbox.Maintain(ctx, e.db, &partition.MaintainOpts{Clock: fakeclock.New(day(20, 0))})
	require.NoError(t, err)
	assert.Contains(t, res.Dropped, "outbox_events_p20261101")
}

func TestMaintainConcurrently(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	ctx := context.Background()
	e.addAt(t, day(0, time.Hour), outbox.StatusSent, nil)
	const n = 4
	results := make([]*partition.MaintainResult, n)
	errs := make([]error, n)
	done := make(chan int)
	for i := range n {
		go func() {
			results[i], errs[i] = outbox.Maintain(ctx, e.db, &partition.MaintainOpts{Clock: fakeclock.New(day(20, 0))})
			done <- i
		}()
	}
	created, dropped := map[string]int{}, map[string]int{}
	for range n {
		i := <-done
		require.NoError(t, errs[i])
		for _, c := range results[i].Created {
			created[c]++
		}
		for _, d := range results[i].Dropped {
			dropped[d]++
		}
	}
	assert.Len(t, created, 8)
	for name, k := range created {
		assert.Equal(t, 1, k, "%s created once", name)
	}
	assert.Equal(t, 1, dropped["outbox_events_p20261101"])
}

// TestPurgeDoesNotBlockClaim checks the batched purge of an unpartitioned
// (or partitioned) table against the relay: a purge whose deletes are not
// committed yet holds row locks on sent rows only, which no claim wants.
func TestPurgeDoesNotBlockClaim(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		if !b.SkipLocked {
			t.Skip("SQLite serialises writers: a purge and a claim never overlap")
		}
		e := setup(t, db, nil)
		ctx := context.Background()
		for range 30 {
			e.add(ctx, t, "order.paid", orderPaid{OrderID: "old"}, nil)
		}
		sent := e.claim(t, "w", 30)
		_, err := e.store.MarkSent(ctx, "w", ids(sent))
		require.NoError(t, err)
		e.stamper.Advance(time.Hour)
		var ready []string
		for range 5 {
			ready = append(ready, e.add(ctx, t, "order.paid", orderPaid{OrderID: "new"}, nil).ID)
		}

		purger := begin(t, db)
		purgeStore, err := outbox.NewStore(purger, &outbox.Config{Clock: e.stamper})
		require.NoError(t, err)
		purged, err := purgeStore.PurgeSent(ctx, time.Minute, &outbox.PurgeOpts{BatchSize: 7})
		require.NoError(t, err)
		require.Equal(t, int64(30), purged)

		claimCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		claimed, err := e.store.Claim(claimCtx, outbox.ClaimOpts{Worker: "w2", Limit: 10, Lease: lease})
		require.NoError(t, err, "the claim is not blocked by the open purge")
		assert.ElementsMatch(t, ready, ids(claimed))
		n, err := e.store.MarkSent(claimCtx, "w2", ids(claimed))
		require.NoError(t, err)
		assert.Equal(t, int64(5), n)

		require.NoError(t, purger.Commit().Error)
		assert.Equal(t, int64(5), countRows(t, db, ""))
	})
}

func TestMaintainLeavesRangesTheDefaultHolds(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t) // partitions up to Nov 11
	ctx := context.Background()
	late := e.addAt(t, day(19, time.Hour), outbox.StatusNew, nil) // Nov 20: no partition yet
	require.Equal(t, "outbox_events_default", partitionOf(t, e.db, late.ID))

	res, err := outbox.Maintain(ctx, e.db, &partition.MaintainOpts{Clock: fakeclock.New(day(19, 2*time.Hour))})
	require.NoError(t, err)
	assert.Equal(t, []string{"outbox_events_p20261120"}, res.Blocked, "the default holds a row of Nov 20")
	assert.Len(t, res.Created, 7, "Nov 21 to Nov 27")
	assert.Equal(t, "outbox_events_default", partitionOf(t, e.db, late.ID), "the row stays where it is")
	e.stamper.Set(day(19, 2*time.Hour))
	assert.Equal(t, []string{late.ID}, ids(e.claim(t, "w", 10)), "and is claimed from there")
}
