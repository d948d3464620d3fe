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
// dbbus_deliveries_ready, and the rescue and a queue's take-over its leased
// rows through dbbus_deliveries_leased, whatever the planner's statistics say (never
// analyzed, or analyzed on a table where nearly every row is another
// group's, leased or dead), never by a sequential scan of the table.

// planNode is one node of an EXPLAIN (FORMAT JSON) plan.
type planNode struct {
	kind, relation, index string
}

// explainPlan runs query under EXPLAIN (ANALYZE, FORMAT JSON) in a
// transaction it rolls back, and returns the plan's nodes, depth first.
func explainPlan(t *testing.T, db *gorm.DB, query string, args map[string]any) []planNode {
	t.Helper()
	var out string
	tx := db.Begin()
	require.NoError(t, tx.Error)
	defer tx.Rollback()
	require.NoError(t, tx.Raw("EXPLAIN (ANALYZE, FORMAT JSON) "+query, args).Row().Scan(&out))
	var doc []struct{ Plan map[string]any }
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Len(t, doc, 1)
	var nodes []planNode
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		kind, _ := n["Node Type"].(string)
		relation, _ := n["Relation Name"].(string)
		index, _ := n["Index Name"].(string)
		nodes = append(nodes, planNode{kind: kind, relation: relation, index: index})
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
			takeOver := explainPlan(t, db, dbbus.TakeOverSQL, map[string]any{"queue": "billing", "owner": "new"})
			assertIndexed(t, "the take-over of a queue", takeOver, "dbbus_deliveries_leased")
		})
	}
}
