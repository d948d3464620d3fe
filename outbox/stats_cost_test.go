package outbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// TestStatsNeverRaceTheRelay reads Stats while a relay writes one event,
// claims it and marks it sent, over and over, so the backlog keeps filling
// and emptying between any two statements. Every snapshot must succeed and
// agree with itself: the pending count is the sum of its statuses, and there
// is an oldest pending row exactly when something is pending.
func TestStatsNeverRaceTheRelay(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx, cancel := context.WithCancel(context.Background())
		relayErr := make(chan error, 1)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			relayErr <- relayOneAtATime(ctx, e)
		}()
		defer func() {
			cancel()
			wg.Wait()
			require.NoError(t, <-relayErr)
		}()

		// Read until many snapshots caught a backlog and many an empty one,
		// so the reads overlapped the relay's every step.
		const each = 100
		var sawPending, sawEmpty int
		deadline := time.Now().Add(30 * time.Second)
		for (sawPending < each || sawEmpty < each) && time.Now().Before(deadline) {
			st, err := e.store.Stats(ctx, nil)
			require.NoError(t, err)
			assert.Equal(t, st.Counts[outbox.StatusNew]+st.Counts[outbox.StatusPublishing]+st.Counts[outbox.StatusFailed],
				st.Pending, "pending is the sum of its statuses")
			assert.Equal(t, st.Pending > 0, !st.OldestPendingAt.IsZero(), "an oldest pending row exactly when something is pending: %+v", st)
			if st.Pending > 0 {
				sawPending++
			} else {
				sawEmpty++
			}
		}
		t.Logf("%s: %d reads saw a backlog, %d an empty one", b.Name, sawPending, sawEmpty)
		assert.GreaterOrEqual(t, sawPending, each, "reads that caught a backlog")
		assert.GreaterOrEqual(t, sawEmpty, each, "reads that caught an empty outbox")
	})
}

// relayOneAtATime writes, claims and sends one event at a time until ctx
// ends. It returns the first error that is not ctx's.
func relayOneAtATime(ctx context.Context, e *env) error {
	for v := int64(1); ; v++ {
		m := &outbox.Message{ID: e.stamper.NewID(epoch), Topic: "order.changed", AggregateType: "order",
			AggregateID: "busy", AggregateVersion: v, Payload: outbox.JSON(`{}`)}
		err := e.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return e.store.Insert(ctx, tx, []*outbox.Message{m})
		})
		if err == nil {
			var got []*outbox.Message
			got, err = e.store.Claim(ctx, outbox.ClaimOpts{Worker: "relay", Limit: 1, Lease: time.Minute})
			if err == nil && len(got) == 1 {
				_, err = e.store.MarkSent(ctx, "relay", []string{got[0].ID})
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// statementLog records the SQL of the statements a store runs, with their
// arguments inlined.
type statementLog struct {
	logger.Interface
	mu  sync.Mutex
	sql []string
}

func (l *statementLog) LogMode(logger.LogLevel) logger.Interface { return l }

func (l *statementLog) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	sql, _ := fc()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, sql)
}

func (l *statementLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.sql
	l.sql = nil
	return out
}

// TestMonitoringCostIgnoresSentRows fills the outbox with 20,000 sent rows
// and a backlog of 6, then runs every statement Stats and Breakdown issue
// under EXPLAIN (ANALYZE, BUFFERS): no statement may scan the table, and the
// rows their scans read must be the backlog's, not the history's. On SQLite,
// whose plans carry no row counts, every step that reads outbox_events must
// read it through an index.
func TestMonitoringCostIgnoresSentRows(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		e := setup(t, db, nil)
		ctx := context.Background()
		const sent, backlog = 20000, 6
		msgs := make([]*outbox.Message, sent)
		for i := range msgs {
			msgs[i] = &outbox.Message{ID: e.stamper.NewID(epoch), Topic: "order.placed", Payload: outbox.JSON(`{}`)}
		}
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return e.store.Insert(ctx, tx, msgs) }))
		require.NoError(t, db.Exec("UPDATE outbox_events SET status = 'sent', published_at = ?", epoch).Error)
		for i := range backlog {
			m := e.add(ctx, t, "order.paid", orderPaid{OrderID: "o-1"}, nil)
			if i == 0 {
				require.NoError(t, db.Exec("UPDATE outbox_events SET status = 'dead', attempts = 1 WHERE id = ?", m.ID).Error)
			}
		}
		if b.Name == "sqlite" {
			require.NoError(t, db.Exec("ANALYZE").Error)
		} else {
			require.NoError(t, db.Exec("VACUUM ANALYZE outbox_events").Error)
		}

		log := &statementLog{}
		watched, err := outbox.NewStore(db.Session(&gorm.Session{Logger: log}), &outbox.Config{Clock: e.stamper})
		require.NoError(t, err)
		log.take() // NewStore's check that the table exists
		st, err := watched.Stats(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, int64(backlog-1), st.Pending)
		assert.Equal(t, int64(1), st.Counts[outbox.StatusDead])
		_, err = watched.Breakdown(ctx, &outbox.StatsOpts{Tenant: "default"})
		require.NoError(t, err)

		statements := log.take()
		require.NotEmpty(t, statements)
		for _, sql := range statements {
			if b.Name == "sqlite" {
				var steps []struct{ Detail string }
				require.NoError(t, db.Raw("EXPLAIN QUERY PLAN "+sql).Scan(&steps).Error)
				require.NotEmpty(t, steps, sql)
				for _, s := range steps {
					if strings.Contains(s.Detail, "outbox_events") {
						assert.Contains(t, s.Detail, "INDEX outbox_events_unsent", "%s: %+v", sql, steps)
					}
				}
				continue
			}
			scans, read := scannedRows(t, db, sql)
			assert.NotContains(t, scans, "Seq Scan", "%s: a scan of the table", sql)
			assert.LessOrEqual(t, read, int64(2*backlog), "%s read %d rows of a table with %d sent and %d unsent: %v",
				sql, read, sent, backlog, scans)
		}
	})
}

// scannedRows runs sql under EXPLAIN (ANALYZE, BUFFERS) and returns the
// scan nodes of its plan and the rows they read (returned or filtered out).
// A sequential scan that read nothing (an empty partition) is named "Seq
// Scan of nothing".
func scannedRows(t *testing.T, db *gorm.DB, sql string) ([]string, int64) {
	t.Helper()
	var out []string
	require.NoError(t, db.Raw("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql).Scan(&out).Error)
	plan := strings.Join(out, "\n")
	var scans []string
	var read int64
	for _, n := range planNodes(t, plan) {
		if !strings.HasSuffix(n.kind, "Scan") {
			continue
		}
		read += n.read
		kind := n.kind
		if kind == "Seq Scan" && n.read == 0 {
			kind = "Seq Scan of nothing" // an empty partition
		}
		scans = append(scans, strings.TrimSpace(kind+" "+n.index))
	}
	if len(scans) == 0 {
		require.Fail(t, "no scan in the plan", plan)
	}
	return scans, read
}
