package consumer_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
)

// TestInspectorShowsAndReleasesAHeldAggregate: an Inspector, built from
// the database alone, lists what a running consumer parked behind a dead
// letter (filtered by tenant, aggregate and reason), shows the aggregate's
// hold and parked event, and its Release lets the consumer apply them, as
// Consumer.Release does; a second Release is stale.
func TestInspectorShowsAndReleasesAHeldAggregate(t *testing.T) {
	s := newHoldSuite(t, memoryHarness(t), nil, 2)
	for v := int64(1); v <= 3; v++ {
		s.publish(t, Step{}.EventType(), stepMsg(t, 0, v))
	}
	s.publish(t, Step{}.EventType(), stepMsg(t, 1, 1))
	s.deadLetters(t, s.group, 1)
	s.waitParked(t, map[string]string{"a000-003": inbox.ParkedHeld})
	s.waitApplied(t, "a001", 1)

	insp, err := consumer.Inspect(s.db, s.group, nil)
	require.NoError(t, err)
	ctx := t.Context()
	ids := func(f inbox.ParkedFilter) []string {
		t.Helper()
		ps, err := insp.Parked(ctx, f, 10)
		require.NoError(t, err)
		var out []string
		for _, p := range ps {
			out = append(out, p.MessageID)
		}
		return out
	}
	assert.Equal(t, []string{"a000-003"}, ids(inbox.ParkedFilter{}))
	assert.Equal(t, []string{"a000-003"}, ids(inbox.ParkedFilter{TenantID: "default", AggregateType: "thing", AggregateID: "a000", Reason: inbox.ParkedHeld}))
	assert.Empty(t, ids(inbox.ParkedFilter{TenantID: "globex"}), "another tenant's")
	assert.Empty(t, ids(inbox.ParkedFilter{AggregateType: "thing", AggregateID: "a001"}), "another aggregate's")
	assert.Empty(t, ids(inbox.ParkedFilter{Reason: inbox.ParkedWaiting}), "another reason's")
	_, err = insp.Parked(ctx, inbox.ParkedFilter{Reason: "stuck"}, 10)
	assert.ErrorIs(t, err, inbox.ErrInvalidArgument)

	holds, err := insp.Holds(ctx, inbox.ParkedFilter{TenantID: "default"}, 10)
	require.NoError(t, err)
	require.Len(t, holds, 1)
	assert.Equal(t, "a000-002", holds[0].MessageID)
	assert.Equal(t, int64(2), holds[0].Version)
	holds, err = insp.Holds(ctx, inbox.ParkedFilter{TenantID: "globex"}, 10)
	require.NoError(t, err)
	assert.Empty(t, holds, "another tenant's")

	a000 := inbox.Aggregate{Type: "thing", ID: "a000"}
	agg, err := insp.Aggregate(ctx, a000, 10)
	require.NoError(t, err)
	require.NotNil(t, agg.Hold)
	assert.Equal(t, "a000-002", agg.Release(), "the hold is what a release names")
	require.Len(t, agg.Events, 1)
	assert.Equal(t, int64(3), agg.Events[0].Version)
	_, err = insp.Aggregate(ctx, inbox.Aggregate{TenantID: "globex", Type: "thing", ID: "a000"}, 10)
	assert.ErrorIs(t, err, consumer.ErrNothingParked, "another tenant's aggregate of the same id")
	assert.ErrorIs(t, insp.Release(ctx, inbox.Aggregate{TenantID: "globex", Type: "thing", ID: "a000"}, "a000-002"),
		consumer.ErrStaleRelease, "a release in another tenant's name")

	require.NoError(t, insp.Release(ctx, a000, "a000-002"))
	s.waitApplied(t, "a000", 1, 3)
	s.waitParked(t, map[string]string{})
	assert.ErrorIs(t, insp.Release(ctx, a000, "a000-002"), consumer.ErrStaleRelease)
	assert.ErrorIs(t, s.c.Release(ctx, a000, "a000-002"), consumer.ErrStaleRelease)
	_, err = insp.Aggregate(ctx, a000, 10)
	assert.ErrorIs(t, err, consumer.ErrNothingParked)
}

// TestInspectorReleasesAGapUnderTheGroupsVersions: under contiguous
// versions, releasing the first parked event of an aggregate whose
// predecessors are lost skips them only when the Inspector is told the
// group's Versions; without, it is refused as stale and changes nothing.
func TestInspectorReleasesAGapUnderTheGroupsVersions(t *testing.T) {
	s := gapSuite(t, memoryHarness(t), time.Hour)
	s.publish(t, Step{}.EventType(), stepMsg(t, 0, 1))
	s.publish(t, Step{}.EventType(), stepMsg(t, 0, 4)) // 2 and 3 are lost
	s.publish(t, Step{}.EventType(), stepMsg(t, 0, 5))
	s.waitParked(t, map[string]string{"a000-004": inbox.ParkedWaiting, "a000-005": inbox.ParkedHeld})
	a000 := inbox.Aggregate{Type: "thing", ID: "a000"}

	ignored, err := consumer.Inspect(s.db, s.group, nil)
	require.NoError(t, err)
	assert.ErrorIs(t, ignored.Release(t.Context(), a000, "a000-004"), consumer.ErrStaleRelease)

	insp, err := consumer.Inspect(s.db, s.group, &consumer.InspectOpts{Versions: inbox.VersionsContiguous})
	require.NoError(t, err)
	agg, err := insp.Aggregate(t.Context(), a000, 10)
	require.NoError(t, err)
	assert.Nil(t, agg.Hold)
	assert.Equal(t, "a000-004", agg.Release(), "the first parked event, in version order")
	waiting, err := insp.Parked(t.Context(), inbox.ParkedFilter{Reason: inbox.ParkedWaiting}, 10)
	require.NoError(t, err)
	require.Len(t, waiting, 1)
	assert.Equal(t, "a000-004", waiting[0].MessageID)
	require.NoError(t, insp.Release(t.Context(), a000, agg.Release()))
	s.waitApplied(t, "a000", 1, 4, 5)
}

// TestInspectorMembersAgreeWithTheInstances: the members an Inspector
// shows own the partitions the running instances own.
func TestInspectorMembersAgreeWithTheInstances(t *testing.T) {
	h := memoryHarness(t)
	s := newSuite(t, h)
	const partitions = 5
	var running []*consumer.Consumer
	for _, name := range []string{"one", "two"} {
		cfg := s.config()
		cfg.Partitions, cfg.TakeoverTime = partitions, 2*time.Second
		c := s.newConsumer(t, cfg)
		require.NoError(t, consumer.Handle(c, checkOrder(name)))
		run(t, c)
		running = append(running, c)
	}
	testenv.WaitFor(t, 10*time.Second, "partitions dealt between two instances", func() bool {
		n := 0
		for _, c := range running {
			if len(c.Partitions()) == 0 {
				return false
			}
			n += len(c.Partitions())
		}
		return n == partitions
	})
	insp, err := consumer.Inspect(s.db, s.group, &consumer.InspectOpts{TakeoverTime: 2 * time.Second})
	require.NoError(t, err)
	members, err := insp.Members(t.Context())
	require.NoError(t, err)
	require.Len(t, members, 2)
	var shown, owned [][]int
	for _, m := range members {
		assert.Equal(t, partitions, m.Partitions)
		assert.Equal(t, 1500*time.Millisecond, m.Expires.Sub(m.LastBeat), "three quarters of TakeoverTime")
		assert.WithinDuration(t, time.Now(), m.LastBeat, 5*time.Second)
		shown = append(shown, m.Owns)
	}
	for _, c := range running {
		owned = append(owned, c.Partitions())
	}
	cmp := func(a, b []int) int { return slices.Compare(a, b) }
	slices.SortFunc(shown, cmp)
	slices.SortFunc(owned, cmp)
	assert.Equal(t, owned, shown)

	other, err := consumer.Inspect(s.db, s.group+"-other", nil)
	require.NoError(t, err)
	members, err = other.Members(t.Context())
	require.NoError(t, err)
	assert.Empty(t, members, "another group's")
}

// TestInspectRefusesBadInput: a bad group name is ErrInvalidConfig, a
// database without the inbox tables inbox.ErrNotMigrated.
func TestInspectRefusesBadInput(t *testing.T) {
	db := testenv.SQLite(t)
	_, err := consumer.Inspect(db, "g", nil)
	assert.ErrorIs(t, err, inbox.ErrNotMigrated)
	require.NoError(t, inbox.Migrate(t.Context(), db))
	_, err = consumer.Inspect(db, "", nil)
	assert.ErrorIs(t, err, consumer.ErrInvalidConfig)
	_, err = consumer.Inspect(db, "g", &consumer.InspectOpts{TakeoverTime: -time.Second})
	assert.ErrorIs(t, err, consumer.ErrInvalidConfig)
	insp, err := consumer.Inspect(db, "g", nil)
	require.NoError(t, err)
	_, err = insp.Aggregate(t.Context(), inbox.Aggregate{Type: "thing"}, 10)
	assert.ErrorIs(t, err, inbox.ErrInvalidArgument)
	_, err = insp.Parked(t.Context(), inbox.ParkedFilter{}, 0)
	assert.ErrorIs(t, err, inbox.ErrInvalidArgument)
}
