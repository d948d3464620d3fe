package aggregate_test

import (
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/aggregate"
)

type Renamed struct {
	Name string `json:"name"`
}

func (Renamed) EventType() string { return "thing.renamed" }

type RenamedV2 struct{ Renamed }

func (RenamedV2) SchemaVersion() int { return 2 }

type Thing struct {
	aggregate.Base
	Name string
}

func (*Thing) AggregateType() string { return "thing" }

func (t *Thing) Rename(name string) {
	t.Name = name
	t.Record(Renamed{Name: name})
}

func TestRecordNotesVersionsAndNothingElse(t *testing.T) {
	t.Parallel()
	th := &Thing{}
	th.ID = "thing-1"
	th.Version = 4 // loaded at version 4
	th.Rename("a")
	th.Rename("b")

	assert.Equal(t, int64(6), th.Version)
	assert.Equal(t, int64(4), th.PersistedVersion())
	evs := th.PendingEvents()
	require.Len(t, evs, 2)
	for i, ev := range evs {
		assert.Equal(t, aggregate.Recorded{Event: ev.Event, AggregateID: "thing-1", AggregateVersion: int64(5 + i)}, ev,
			"an event carries its aggregate and version; its id and time come at commit")
		assert.Equal(t, "thing.renamed", ev.Topic())
	}
	assert.Equal(t, Renamed{Name: "b"}, evs[1].Event)
}

func TestPendingEventsIsACopyAndPullEmpties(t *testing.T) {
	t.Parallel()
	th := &Thing{}
	th.ID = "thing-1"
	th.Rename("a")
	cp := th.PendingEvents()
	cp[0].AggregateID = "tampered"
	assert.Equal(t, "thing-1", th.PendingEvents()[0].AggregateID)

	pulled := th.PullEvents()
	require.Len(t, pulled, 1)
	assert.Empty(t, th.PendingEvents())
	assert.Equal(t, int64(1), th.Version)
	assert.Equal(t, int64(1), th.PersistedVersion())
}

func TestSystemClock(t *testing.T) {
	t.Parallel()
	before := time.Now()
	var c aggregate.Clock = aggregate.SystemClock{}
	now := c.Now()
	assert.False(t, now.Before(before.Truncate(time.Microsecond)))
	assert.Equal(t, time.UTC, now.Location(), "the clock is in UTC")
	id := ulid.MustParse(c.NewID(now))
	assert.Equal(t, now.UnixMilli(), int64(id.Time()), "the id carries the time it is made for")
}

func TestSchemaVersionOf(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 1, aggregate.SchemaVersionOf(Renamed{}))
	assert.Equal(t, 2, aggregate.SchemaVersionOf(RenamedV2{}))
}

// TestMonotonicIDs checks that ids strictly increase within one millisecond,
// when the clock steps backwards, and across goroutines.
func TestMonotonicIDs(t *testing.T) {
	t.Parallel()
	var m aggregate.Monotonic
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	times := []time.Time{t0, t0, t0, t0.Add(-time.Hour), t0.Add(time.Millisecond), t0.Add(time.Millisecond), t0.Add(-time.Second)}
	var prev string
	for i, at := range times {
		id := m.NewID(at)
		require.Len(t, id, 26)
		assert.Greater(t, id, prev, "id %d (%v) must exceed the previous one", i, at)
		prev = id
	}

	const goroutines, each = 8, 2000
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		all []string
	)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]string, each)
			for i := range local {
				local[i] = m.NewID(t0)
			}
			assert.True(t, sort.StringsAreSorted(local), "each goroutine sees increasing ids")
			mu.Lock()
			all = append(all, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	seen := make(map[string]bool, len(all))
	for _, id := range all {
		require.False(t, seen[id], "duplicate id %s", id)
		seen[id] = true
	}
}

func TestPackageNewIDIncreases(t *testing.T) {
	t.Parallel()
	a, b := aggregate.NewID(), aggregate.NewIDAt(time.Unix(0, 0))
	assert.Greater(t, b, a, "an earlier time still gives a later id")
}
