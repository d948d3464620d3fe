package dbbus_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/internal/testenv"
)

// Plans that cannot flip: the claim must read a group's ready rows through
// dbbus_deliveries_ready, the rescue and a queue's take-over its leased
// rows through dbbus_deliveries_leased, and a browse its ready rows
// through dbbus_deliveries_ready, whatever the planner's statistics say (never
// analyzed, or analyzed on a table where nearly every row is another
// group's, leased or dead), never by a sequential scan of the table.

// planNode is one node of an EXPLAIN (FORMAT JSON) plan; the first node
// of a plan carries the buffers the whole statement touched.
type planNode struct {
	kind, relation, index string
	buffers               int
	cost                  float64 // the planner's estimate, total
}

// explainPlan runs query under EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) in
// a transaction it rolls back, and returns the plan's nodes, depth first.
// args are a map of named arguments or positional ones.
func explainPlan(t *testing.T, db *gorm.DB, query string, args ...any) []planNode {
	t.Helper()
	var out string
	tx := db.Begin()
	require.NoError(t, tx.Error)
	defer tx.Rollback()
	require.NoError(t, tx.Raw("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+query, args...).Row().Scan(&out))
	var doc []struct{ Plan map[string]any }
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Len(t, doc, 1)
	var nodes []planNode
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		kind, _ := n["Node Type"].(string)
		relation, _ := n["Relation Name"].(string)
		index, _ := n["Index Name"].(string)
		hit, _ := n["Shared Hit Blocks"].(float64)
		read, _ := n["Shared Read Blocks"].(float64)
		cost, _ := n["Total Cost"].(float64)
		nodes = append(nodes, planNode{kind: kind, relation: relation, index: index, buffers: int(hit + read), cost: cost})
		children, _ := n["Plans"].([]any)
		for _, c := range children {
			walk(c.(map[string]any))
		}
	}
	walk(doc[0].Plan)
	return nodes
}

// assertIndexed checks that plan reads dbbus_deliveries through index and
// never sequentially.
func assertIndexed(t *testing.T, what string, plan []planNode, index string) {
	t.Helper()
	used := false
	for _, n := range plan {
		if n.kind == "Seq Scan" && n.relation == "dbbus_deliveries" {
			t.Errorf("%s scans dbbus_deliveries sequentially: %v", what, plan)
		}
		used = used || n.index == index
	}
	assert.True(t, used, "%s does not use %s: %v", what, index, plan)
}

// skew fills group billing with 10,000 rows leased for an hour and 10,000
// acked (deleted) ones, group other with 10,000 ready rows, then adds 5
// ready rows of billing.
func skew(t *testing.T, db *gorm.DB) {
	t.Helper()
	const n = 10000
	require.NoError(t, db.Exec(`INSERT INTO dbbus_deliveries (group_name, message_id)
		SELECT 'billing', 'acked-' || g FROM generate_series(1, ?) AS g`, n).Error)
	require.NoError(t, db.Exec(`DELETE FROM dbbus_deliveries WHERE message_id LIKE 'acked-%'`).Error)
	require.NoError(t, db.Exec(`INSERT INTO dbbus_deliveries (group_name, message_id, lease_token, leased_until)
		SELECT 'billing', 'leased-' || g, 'tok', now() + interval '1 hour' FROM generate_series(1, ?) AS g`, n).Error)
	require.NoError(t, db.Exec(`INSERT INTO dbbus_deliveries (group_name, message_id)
		SELECT 'other', 'other-' || g FROM generate_series(1, ?) AS g`, n).Error)
	require.NoError(t, db.Exec(`INSERT INTO dbbus_deliveries (group_name, message_id)
		SELECT 'billing', 'ready-' || g FROM generate_series(1, 5) AS g`).Error)
}

func TestPostgresClaimPlans(t *testing.T) {
	t.Parallel()
	for _, analyzed := range []bool{false, true} {
		t.Run(fmt.Sprintf("analyzed=%v", analyzed), func(t *testing.T) {
			t.Parallel()
			db, _ := testenv.Postgres(t)
			require.NoError(t, dbbus.Migrate(t.Context(), db))
			skew(t, db)
			if analyzed {
				require.NoError(t, db.Exec("ANALYZE dbbus_deliveries").Error)
			}
			claim := explainPlan(t, db, dbbus.PostgresClaimSQL, map[string]any{
				"group": "billing", "limit": 16, "token": "t", "ms": 30000,
			})
			assertIndexed(t, "the claim", claim, "dbbus_deliveries_ready")
			rescue := explainPlan(t, db, dbbus.PostgresRescueSQL, map[string]any{"group": "billing", "limit": 1000})
			assertIndexed(t, "the rescue", rescue, "dbbus_deliveries_leased")
			// An operator's browse of a dead-letter queue, from the start and
			// from a later batch.
			for _, after := range []int64{0, 10000} {
				browse := explainPlan(t, db, dbbus.PostgresBrowseSQL, map[string]any{"group": "billing", "after": after, "limit": 100})
				assertIndexed(t, "the browse", browse, "dbbus_deliveries_ready")
			}
			takeOver := explainPlan(t, db, dbbus.TakeOverSQL, map[string]any{"queue": "billing", "owner": "new"})
			assertIndexed(t, "the take-over of a queue", takeOver, "dbbus_deliveries_leased")
		})
	}
}

// pile fills the bus with n published messages, each with one ready
// delivery in group other, and adds 10 messages with a delivery of group
// billing leased under token tok. It returns those 10 messages' ids and
// their deliveries' ids.
func pile(t *testing.T, db *gorm.DB, n int) (msgIDs []string, deliveries []int64) {
	t.Helper()
	require.NoError(t, db.Exec(`INSERT INTO dbbus_messages (id, topic, metadata, payload)
		SELECT 'other-' || g, 'orders', '{"k":"v"}', convert_to(repeat('x', 100), 'UTF8') FROM generate_series(1, ?) AS g`, n).Error)
	require.NoError(t, db.Exec(`INSERT INTO dbbus_deliveries (group_name, message_id, topic)
		SELECT 'other', 'other-' || g, 'orders' FROM generate_series(1, ?) AS g`, n).Error)
	require.NoError(t, db.Exec(`INSERT INTO dbbus_messages (id, topic, metadata, payload)
		SELECT 'mine-' || g, 'orders', '{}', '' FROM generate_series(1, 10) AS g`).Error)
	require.NoError(t, db.Raw(`INSERT INTO dbbus_deliveries (group_name, message_id, topic, lease_token, leased_until)
		SELECT 'billing', 'mine-' || g, 'orders', 'tok', now() + interval '1 hour' FROM generate_series(1, 10) AS g
		RETURNING id`).Scan(&deliveries).Error)
	for i := 1; i <= 10; i++ {
		msgIDs = append(msgIDs, fmt.Sprintf("mine-%d", i))
	}
	return msgIDs, deliveries
}

// TestPostgresSettlePlans: what a claim leases and reads and what its settling writes
// (the bodies read, locked and deleted, the deliveries acked, given back
// and renewed) is found by index probes, one per key, whatever the
// statistics: never analyzed (the planner then guesses a table's rows from
// its pages and its columns' declared widths, and misjudges them), at two
// sizes, and analyzed. Each statement, for 10 keys beside the other
// messages, reads neither table sequentially, touches fewer than 300
// buffers and is estimated at under a tenth of jit_above_cost, so that
// PostgreSQL does not compile a batch of 100 with JIT first (keyed by the
// id alone, the delete of bodies was estimated at 90,000 for 10 ids
// beside 100,000 messages).
func TestPostgresSettlePlans(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		others   int
		analyzed bool
	}{{20000, false}, {100000, false}, {20000, true}} {
		t.Run(fmt.Sprintf("others=%d/analyzed=%v", c.others, c.analyzed), func(t *testing.T) {
			t.Parallel()
			db, _ := testenv.Postgres(t)
			require.NoError(t, dbbus.Migrate(t.Context(), db))
			msgIDs, deliveries := pile(t, db, c.others)
			if c.analyzed {
				require.NoError(t, db.Exec("ANALYZE dbbus_messages, dbbus_deliveries").Error)
			}
			topics := make([]string, len(msgIDs))
			for i := range topics {
				topics[i] = "orders"
			}
			keys := dbbus.PostgresKeys(msgIDs, topics)
			statements := []struct {
				what  string
				query string
				args  []any
			}{
				{"the claim", dbbus.PostgresClaimSQL, []any{map[string]any{"group": "other", "limit": 10, "token": "t", "ms": 30000}}},
				{"the read of bodies", dbbus.PostgresReadBodiesSQL, keys},
				{"the lock of bodies", dbbus.PostgresLockBodiesSQL, keys},
				{"the ack", dbbus.DeleteDeliveriesSQL, []any{deliveries, "tok"}},
				{"a subscription's ack", dbbus.PostgresAsyncAckSQL, []any{deliveries, "tok"}},
				{"the delete of bodies", dbbus.PostgresDeleteBodiesSQL, keys},
				{"the give-back", dbbus.ReleaseDeliveriesSQL, []any{deliveries, "tok"}},
				{"the renewal", dbbus.PostgresRenewSQL, []any{30000, deliveries, "tok"}},
			}
			for _, s := range statements {
				plan := explainPlan(t, db, s.query, s.args...)
				for _, n := range plan {
					if n.kind == "Seq Scan" && (n.relation == "dbbus_deliveries" || n.relation == "dbbus_messages") {
						t.Errorf("%s scans %s sequentially: %v", s.what, n.relation, plan)
					}
				}
				assert.Less(t, plan[0].buffers, 300, "%s touches too many buffers: %v", s.what, plan)
				// Past jit_above_cost (100,000 by default) PostgreSQL
				// compiles the statement first: 100-200 ms here. For 10
				// keys a tenth of it, so that a batch of 100 stays under.
				assert.Less(t, plan[0].cost, 10000.0, "%s is estimated so costly that PostgreSQL would compile a batch of 100 with JIT", s.what)
			}
		})
	}
}
