package inbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/testenv"
)

// TestParkedAggregatesPagesThroughReleasable: among 30 aggregates with
// parked events, most held behind a dead letter or waiting for a missing
// predecessor, paging through ParkedAggregates with a window of 4 returns
// exactly the releasable ones of the partitions asked for, in at most
// (parked events / window) + 1 calls, and wraps around; Release named by a
// gap's parked event makes its aggregate releasable.
func TestParkedAggregatesPagesThroughReleasable(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, "sweep")
		ctx := context.Background()
		in := withVersions(t, e.db, "sweep", inbox.VersionsContiguous)
		h := in.Middleware(writeApplied)
		apply1 := func(id string) {
			_, err := h(versionMsg(id+"-1", id, 1))
			require.NoError(t, err)
		}
		const n, window = 30, 4
		want := map[string]bool{}
		for i := range n {
			id := fmt.Sprintf("c%02d", i)
			switch i {
			case 3, 22: // applied up to 1, the hold lifted: releasable
				apply1(id)
				require.NoError(t, in.Park(ctx, versionMsg(id+"-2", id, 2), 0, inbox.ParkedHeld))
				want[id] = true
			case 9: // version 2 waited, and version 1 was applied since: releasable
				require.NoError(t, in.Park(ctx, versionMsg(id+"-2", id, 2), 0, inbox.ParkedWaiting))
				apply1(id)
				want[id] = true
			case 8: // version 3 waits for version 2
				apply1(id)
				require.NoError(t, in.Park(ctx, versionMsg(id+"-3", id, 3), 0, inbox.ParkedWaiting))
				require.NoError(t, in.Park(ctx, versionMsg(id+"-4", id, 4), 0, inbox.ParkedHeld))
			case 17: // releasable, but on a partition not asked for
				apply1(id)
				require.NoError(t, in.Park(ctx, versionMsg(id+"-2", id, 2), 1, inbox.ParkedHeld))
			default: // held behind version 1's dead letter
				require.NoError(t, in.Hold(ctx, versionMsg(id+"-1", id, 1)))
				require.NoError(t, in.Park(ctx, versionMsg(id+"-2", id, 2), 0, inbox.ParkedHeld))
			}
		}
		const parked = n + 1
		sweep := func() (map[string]bool, int) {
			got, calls := map[string]bool{}, 0
			var after inbox.Aggregate
			for {
				aggs, next, err := in.ParkedAggregates(ctx, []int{0}, after, window)
				require.NoError(t, err)
				calls++
				for _, a := range aggs {
					assert.False(t, got[a.ID], "%s returned twice", a.ID)
					got[a.ID] = true
				}
				if next == (inbox.Aggregate{}) {
					return got, calls
				}
				after = next
			}
		}
		got, calls := sweep()
		t.Logf("%s: %d releasable of %d aggregates found in %d calls of window %d", b.Name, len(got), n, calls, window)
		assert.Equal(t, want, got)
		assert.LessOrEqual(t, calls, parked/window+1)

		c08 := inbox.Aggregate{TenantID: "acme", Type: "cart", ID: "c08"}
		require.ErrorIs(t, in.Release(ctx, c08, "c08-4"), inbox.ErrStaleRelease,
			"version 4 does not wait for a gap")
		require.NoError(t, in.Release(ctx, c08, "c08-3"), "version 2 is given up")
		require.ErrorIs(t, in.Release(ctx, c08, "c08-3"), inbox.ErrStaleRelease,
			"given up already")
		mark, err := in.Watermark(ctx, "acme", "cart", "c08")
		require.NoError(t, err)
		assert.EqualValues(t, 2, mark)
		got, _ = sweep()
		want["c08"] = true
		assert.Equal(t, want, got)

		err = in.Release(ctx, inbox.Aggregate{TenantID: "acme", Type: "cart", ID: "c00"}, "c00-2")
		require.ErrorIs(t, err, inbox.ErrStaleRelease, "c00 is held behind c00-1")
		require.NoError(t, in.Release(ctx, inbox.Aggregate{TenantID: "acme", Type: "cart", ID: "c00"}, "c00-1"))
		got, _ = sweep()
		want["c00"] = true
		assert.Equal(t, want, got)
	})
}
