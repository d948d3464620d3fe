package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// pileUp writes version 1 of aggregate "poison" and makes it dead, then n
// later versions of it, which wait behind the dead one.
func (e *env) pileUp(t *testing.T, n int) {
	t.Helper()
	ctx := context.Background()
	head := e.addAgg(t, "poison", 1)
	require.Equal(t, []string{head.ID}, ids(e.claim(t, "w", 1)))
	ok, err := e.store.MarkFailed(ctx, "w", outbox.Failure{ID: head.ID, Err: errors.New("poison"), Dead: true})
	require.NoError(t, err)
	require.True(t, ok)
	msgs := make([]*outbox.Message, n)
	for i := range msgs {
		msgs[i] = &outbox.Message{ID: e.stamper.NewID(epoch), Topic: "order.changed", AggregateType: "order", AggregateID: "poison",
			AggregateVersion: int64(i + 2), Payload: outbox.JSON(`{}`)}
	}
	require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error { return e.store.Insert(ctx, tx, msgs) }))
}

// indexRowsRead runs the claim statement under EXPLAIN ANALYZE in a
// transaction it rolls back, and returns how many rows its walk of the due
// rows read: the rows the scans of the (available_at, id) index returned
// plus those their filter removed.
func indexRowsRead(t *testing.T, db *gorm.DB, limit int) int64 {
	t.Helper()
	var plan string
	err := db.Transaction(func(tx *gorm.DB) error {
		var out []string
		if err := tx.Raw("EXPLAIN (ANALYZE, FORMAT JSON) "+outbox.PostgresClaimSQL(),
			outbox.PostgresClaimArgs(time.Now(), limit)).Scan(&out).Error; err != nil {
			return err
		}
		plan = strings.Join(out, "\n")
		return errors.New("roll back")
	})
	require.EqualError(t, err, "roll back")
	var sum int64
	for _, n := range planNodes(t, plan) {
		if strings.Contains(n.index, "ready") || strings.Contains(n.index, "due") || strings.Contains(n.index, "available_at_id") {
			sum += n.read
		}
	}
	return sum
}

// planNode is one node of an EXPLAIN (ANALYZE, FORMAT JSON) plan: its type,
// the table and index it scans, the rows it read (returned over all loops,
// plus those its filter removed) and, with BUFFERS, the shared buffers it
// and the nodes below it hit or read.
type planNode struct {
	kind, relation, index string
	read, buffers         int64
	removed               int64 // rows its filter dropped, over all its loops
}

// planNodes flattens a JSON plan, depth first.
func planNodes(t *testing.T, plan string) []planNode {
	t.Helper()
	var doc []struct{ Plan map[string]any }
	require.NoError(t, json.Unmarshal([]byte(plan), &doc), plan)
	require.Len(t, doc, 1)
	var out []planNode
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		kind, _ := n["Node Type"].(string)
		relation, _ := n["Relation Name"].(string)
		index, _ := n["Index Name"].(string)
		rows, _ := n["Actual Rows"].(float64)
		loops, _ := n["Actual Loops"].(float64)
		removed, _ := n["Rows Removed by Filter"].(float64)
		hit, _ := n["Shared Hit Blocks"].(float64)
		read, _ := n["Shared Read Blocks"].(float64)
		out = append(out, planNode{kind: kind, relation: relation, index: index,
			read: int64(rows*loops + removed), buffers: int64(hit + read), removed: int64(removed * loops)})
		children, _ := n["Plans"].([]any)
		for _, c := range children {
			walk(c.(map[string]any))
		}
	}
	walk(doc[0].Plan)
	return out
}

// TestClaimCostIgnoresHeldBackEvents piles 3,000 events up behind one dead
// event and checks that claims keep returning the other ready rows, and on
// PostgreSQL that, once a claim has seen the pile, the claim's walk of due
// rows reads only rows it can take, however many wait behind the dead one.
func TestClaimCostIgnoresHeldBackEvents(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		const pile, ready = 3000, 10
		e.pileUp(t, pile)
		var want []string
		for i := range ready {
			want = append(want, e.addAgg(t, fmt.Sprintf("fine-%d", i), 1).ID)
		}
		got := e.claim(t, "w", 500)
		assert.Equal(t, want, ids(got), "the ready rows behind the pile come out in one claim")
		assert.Equal(t, int64(pile), countRows(t, db, "held AND aggregate_id = 'poison'"),
			"the claim held back every event behind the dead one")
		_, err := e.store.MarkSent(ctx, "w", ids(got))
		require.NoError(t, err)

		for i := range ready {
			e.addAgg(t, fmt.Sprintf("fine-%d", i), 2)
		}
		if b.Name != "sqlite" {
			require.NoError(t, db.Exec("ANALYZE outbox_events").Error)
			read := indexRowsRead(t, db, 500)
			assert.LessOrEqual(t, read, int64(2*ready),
				"the claim read %d rows of the due index for %d ready rows behind %d held back", read, ready, pile)
		}
		assert.Len(t, e.claim(t, "w", 500), ready)
	})
}

// TestHeldEventsFollowTheirHead checks that held-back events are released
// in order when the event in front of them is sent or discarded.
func TestHeldEventsFollowTheirHead(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		e.pileUp(t, 4) // poison v1 dead, v2..v5 behind it
		other := e.addAgg(t, "other", 1)
		assert.Equal(t, []string{other.ID}, ids(e.claim(t, "w", 10)))
		assert.Equal(t, int64(4), countRows(t, db, "held"))
		_, err := e.store.MarkSent(ctx, "w", []string{other.ID})
		require.NoError(t, err)

		n, err := e.store.Discard(ctx, outbox.Filter{AggregateID: "poison"}, false)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		assert.Equal(t, int64(3), countRows(t, db, "held"), "discarding the head releases the next event only")
		for v := int64(2); v <= 5; v++ {
			got := e.claim(t, "w", 10)
			require.Len(t, got, 1, "version %d", v)
			assert.Equal(t, v, got[0].AggregateVersion)
			if v%2 == 0 {
				_, err = e.store.MarkSent(ctx, "w", ids(got))
			} else {
				_, err = e.store.DeleteSent(ctx, "w", ids(got))
			}
			require.NoError(t, err)
		}
		assert.Empty(t, e.claim(t, "w", 10))
		assert.Equal(t, int64(0), countRows(t, db, "held OR status <> 'sent'"))
	})
}

// TestConcurrentRelayLeavesNothingHeld races writers appending versions to
// a few hot aggregates against four claimers that publish, fail and
// release at random: every event ends sent, each aggregate's events were
// claimed one at a time in version order, and no row is left held.
func TestConcurrentRelayLeavesNothingHeld(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		const aggs, versions = 8, 40
		var writers sync.WaitGroup
		for a := range aggs {
			writers.Add(1)
			go func() {
				defer writers.Done()
				for v := int64(1); v <= versions; v++ {
					err := db.Transaction(func(tx *gorm.DB) error {
						_, err := e.store.Add(ctx, tx, "order.changed", orderPaid{}, &outbox.AddOpts{
							AggregateType: "order", AggregateID: fmt.Sprintf("hot-%d", a), AggregateVersion: v})
						return err
					})
					if !assert.NoError(t, err) {
						return
					}
				}
			}()
		}
		writersDone := make(chan struct{})
		go func() { writers.Wait(); close(writersDone) }()

		var (
			mu       sync.Mutex
			inFlight = map[string]bool{}  // aggregate -> claimed, not settled
			last     = map[string]int64{} // aggregate -> last version sent
			wg       sync.WaitGroup
		)
		workers := 4
		if b.Name == "sqlite" {
			workers = 2
		}
		deadline := time.Now().Add(60 * time.Second)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				worker := fmt.Sprintf("w%d", w)
				for time.Now().Before(deadline) {
					got, err := e.store.Claim(ctx, outbox.ClaimOpts{Worker: worker, Limit: 5, Lease: lease})
					if !assert.NoError(t, err) {
						return
					}
					if len(got) == 0 {
						select {
						case <-writersDone:
							if countRows(t, db, "status <> 'sent'") == 0 {
								return
							}
						default:
						}
						continue
					}
					mu.Lock()
					for _, m := range got {
						if inFlight[m.AggregateID] {
							t.Errorf("%s claimed %s v%d while an earlier event is in flight", worker, m.AggregateID, m.AggregateVersion)
						}
						inFlight[m.AggregateID] = true
					}
					mu.Unlock()
					// Settle while holding mu, so no claim of an aggregate's
					// next event can be checked before this one is recorded.
					mu.Lock()
					var sent []string
					for _, m := range got {
						switch rand.IntN(4) {
						case 0: // a failed publish, retried at once
							_, err = e.store.MarkFailed(ctx, worker, outbox.Failure{ID: m.ID, Err: errors.New("nack")})
						case 1: // not tried
							_, err = e.store.Release(ctx, worker, []string{m.ID})
						default:
							sent = append(sent, m.ID)
							if m.AggregateVersion != last[m.AggregateID]+1 {
								t.Errorf("%s v%d sent after v%d", m.AggregateID, m.AggregateVersion, last[m.AggregateID])
							}
							last[m.AggregateID] = m.AggregateVersion
						}
						assert.NoError(t, err)
						inFlight[m.AggregateID] = false
					}
					_, err = e.store.MarkSent(ctx, worker, sent)
					mu.Unlock()
					assert.NoError(t, err)
				}
			}()
		}
		wg.Wait()
		<-writersDone
		assert.Equal(t, int64(aggs*versions), countRows(t, db, "status = 'sent'"), "every event is sent")
		assert.Equal(t, int64(0), countRows(t, db, "held"), "no event is left held")
		for a := range aggs {
			assert.Equal(t, int64(versions), last[fmt.Sprintf("hot-%d", a)])
		}
	})
}

// TestClaimLeavesRowsBehindItsOwnClaims writes three versions of four
// aggregates in one transaction and relays them four at a time. A claim
// takes heads only, and on PostgreSQL it leaves the later versions as they
// are, not held: they wait for nothing but the claim's own rows, so
// marking them held (and released again) would double the writes of a
// relay working through busy aggregates. Instead each claimed row says
// that a later version waits behind it (NextWaits), until the last one.
func TestClaimLeavesRowsBehindItsOwnClaims(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		var msgs []*outbox.Message
		for a := range 4 {
			for v := int64(1); v <= 3; v++ {
				msgs = append(msgs, &outbox.Message{ID: e.stamper.NewID(epoch), Topic: "order.changed",
					AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", a), AggregateVersion: v, Payload: outbox.JSON(`{}`)})
			}
		}
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return e.store.Insert(ctx, tx, msgs) }))

		sentUpTo := map[string]int64{}
		for claims := 0; len(sentUpTo) < 4 || slices.ContainsFunc(slices.Collect(maps.Values(sentUpTo)), func(v int64) bool { return v < 3 }); claims++ {
			require.Less(t, claims, 12, "every event relayed in at most 12 claims")
			got := e.claim(t, "w", 4)
			require.NotEmpty(t, got, "a claim after settling finds the next versions due")
			if b.Name != "sqlite" {
				assert.Zero(t, countRows(t, db, "held"), "nothing waits behind anything but the claim's own rows")
			}
			var ids []string
			for _, m := range got {
				assert.Equal(t, sentUpTo[m.AggregateID]+1, m.AggregateVersion, "%s in version order", m.AggregateID)
				assert.Equal(t, m.AggregateVersion < 3, m.NextWaits, "%s v%d: a later version waits", m.AggregateID, m.AggregateVersion)
				sentUpTo[m.AggregateID] = m.AggregateVersion
				ids = append(ids, m.ID)
			}
			_, err := e.store.MarkSent(ctx, "w", ids)
			require.NoError(t, err)
		}
		assert.Equal(t, int64(12), countRows(t, db, "status = 'sent'"))
	})
}
