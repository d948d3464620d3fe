package fakeclock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/internal/fakeclock"
)

var _ aggregate.Clock = (*fakeclock.Clock)(nil)

var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestTimeMovesOnlyWhenTold(t *testing.T) {
	t.Parallel()
	c := fakeclock.New(start.In(time.FixedZone("UTC+2", 7200)))
	assert.Equal(t, time.UTC, c.Now().Location(), "the clock reads UTC")
	assert.True(t, c.Now().Equal(start))
	c.Advance(90 * time.Second)
	assert.Equal(t, start.Add(90*time.Second), c.Now())
	c.Set(start.Add(-time.Hour))
	assert.Equal(t, start.Add(-time.Hour), c.Now())

	var zero fakeclock.Clock
	assert.True(t, zero.Now().IsZero())
	zero.Advance(time.Second)
	assert.Equal(t, time.Time{}.Add(time.Second), zero.Now())
}

func TestIDsAreDeterministicAndIncrease(t *testing.T) {
	t.Parallel()
	ids := func() []string {
		c := fakeclock.New(start)
		out := []string{c.NewID(c.Now()), c.NewID(c.Now())}
		c.Advance(time.Second)
		out = append(out, c.NewID(c.Now()), c.NewID(start)) // an earlier time still increases
		return out
	}
	first := ids()
	assert.Equal(t, first, ids(), "same start, same ids")
	assert.Equal(t, "01KDVDNA000000000000000001", first[0])
	for i := 1; i < len(first); i++ {
		assert.Greater(t, first[i], first[i-1])
	}
	assert.Equal(t, start.Add(time.Second), ulid.MustParse(first[2]).Timestamp().UTC(), "an id carries its time")
	assert.Equal(t, start.Add(time.Second), ulid.MustParse(first[3]).Timestamp().UTC(), "and never goes back")
}

func TestIDsAreUniqueUnderConcurrency(t *testing.T) {
	t.Parallel()
	c := fakeclock.New(start)
	const workers, each = 8, 100
	got := make([][]string, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				got[w] = append(got[w], c.NewID(c.Now()))
			}
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, ids := range got {
		for _, id := range ids {
			require.False(t, seen[id], "id %s twice", id)
			seen[id] = true
		}
	}
	assert.Len(t, seen, workers*each)
}
