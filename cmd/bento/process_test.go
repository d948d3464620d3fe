package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/process"
)

// checkoutState is a process manager's state model, as an application
// declares it: its table is checkouts.
type checkoutState struct {
	process.Base
	OrderID string
}

// TableName is the state table the commands are given.
func (checkoutState) TableName() string { return "checkouts" }

// seedCheckout writes a checkout process of tenantID under key, started
// at started, with the live timeouts named (each scheduled, an hour on,
// under the process's timeout key).
func seedCheckout(t *testing.T, db *gorm.DB, st *outbox.Store, tenantID, key string, started time.Time, completed bool, timeouts ...string) {
	t.Helper()
	s := checkoutState{Base: process.Base{TenantID: tenantID, Key: key, Process: "checkout", Version: 2, Completed: completed,
		StartedAt: started, UpdatedAt: started.Add(time.Minute), Timeouts: process.Timeouts{}}, OrderID: key}
	for _, name := range timeouts {
		m := scheduleOne(t, db, st, tenantID, "checkout.timeout", "checkout/"+key+"/"+name, started.Add(time.Hour))
		s.Timeouts[name] = m.ID
	}
	require.NoError(t, db.Create(&s).Error)
}

// TestProcessListAndAbandonThroughTheBinary lists and abandons processes
// on PostgreSQL and SQLite: the list holds the running processes of the
// table started first first, with --tenant, --key and --all narrowing or
// widening it; an abandon completes the process of its tenant only (the
// default tenant without --tenant) and cancels its timeouts, after a dry
// run and a confirmation; one not found or already completed says so and
// exits 1, and a bad table name exits 2.
func TestProcessListAndAbandonThroughTheBinary(t *testing.T) {
	onBusDatabases(t, func(t *testing.T, db *gorm.DB, dsn string) {
		ctx := t.Context()
		require.NoError(t, outbox.Migrate(ctx, db))
		require.NoError(t, db.AutoMigrate(&checkoutState{}))
		now := time.Now().UTC().Truncate(time.Second)
		clock := testenv.NewClock(now)
		st, err := outbox.NewStore(db, &outbox.Config{Clock: clock, Test: outbox.TestConfig{Clock: clock}})
		require.NoError(t, err)
		seedCheckout(t, db, st, "acme", "o-1", now.Add(-3*time.Hour), false, "payment", "reminder")
		seedCheckout(t, db, st, "globex", "o-1", now.Add(-2*time.Hour), false, "payment")
		seedCheckout(t, db, st, "default", "o-2", now.Add(-time.Hour), false)
		seedCheckout(t, db, st, "acme", "o-0", now.Add(-4*time.Hour), true)
		rfc := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }

		res := bento(t, dsn, "", "process", "list", "--table", "checkouts")
		require.Equal(t, 0, res.code, res.stderr)
		lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
		require.Len(t, lines, 4, res.stdout)
		assert.Equal(t, []string{"PROCESS", "TENANT", "KEY", "VERSION", "STATUS", "STARTED", "AT", "UPDATED", "AT", "TIMEOUTS"}, strings.Fields(lines[0]))
		assert.Equal(t, []string{"checkout", "acme", "o-1", "2", "running", rfc(now.Add(-3 * time.Hour)), rfc(now.Add(-3*time.Hour + time.Minute)),
			"payment,reminder"}, strings.Fields(lines[1]))
		assert.Equal(t, []string{"checkout", "globex", "o-1", "2", "running", rfc(now.Add(-2 * time.Hour)), rfc(now.Add(-2*time.Hour + time.Minute)),
			"payment"}, strings.Fields(lines[2]))
		assert.Equal(t, []string{"checkout", "default", "o-2", "2", "running", rfc(now.Add(-time.Hour)), rfc(now.Add(-time.Hour + time.Minute)),
			"-"}, strings.Fields(lines[3]))

		res = bento(t, dsn, "", "process", "list", "--table", "checkouts", "--tenant", "acme", "--all")
		require.Equal(t, 0, res.code, res.stderr)
		lines = strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
		require.Len(t, lines, 3, res.stdout)
		assert.Equal(t, []string{"checkout", "acme", "o-0", "2", "completed"}, strings.Fields(lines[1])[:5])
		assert.Equal(t, []string{"checkout", "acme", "o-1"}, strings.Fields(lines[2])[:3])
		assert.NotContains(t, res.stdout, "globex", "--tenant scopes the list")

		res = bento(t, dsn, "", "process", "list", "--table", "checkouts", "--key", "o-1", "--limit", "1")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Contains(t, res.stdout, "acme")
		assert.NotContains(t, res.stdout, "globex")
		assert.Contains(t, res.stdout, "(first 1; raise --limit or narrow the filter for more)")

		res = bento(t, dsn, "", "process", "list", "--table", "checkouts", "--tenant", "initech")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Equal(t, "no running processes in checkouts of tenant initech\n", res.stdout)

		running := func() []string {
			rows, err := process.List(ctx, db, "checkouts", process.Filter{})
			require.NoError(t, err)
			var out []string
			for _, p := range rows {
				out = append(out, p.TenantID+"/"+p.Key)
			}
			return out
		}
		waiting := func() []string {
			rows, err := st.ListScheduled(ctx, outbox.ScheduledFilter{})
			require.NoError(t, err)
			var keys []string
			for _, m := range rows {
				keys = append(keys, m.TenantID+"/"+m.Key)
			}
			return keys
		}
		all := []string{"acme/o-1", "globex/o-1", "default/o-2"}
		timeouts := []string{"acme/checkout/o-1/payment", "acme/checkout/o-1/reminder", "globex/checkout/o-1/payment"}
		require.ElementsMatch(t, timeouts, waiting())

		res = bento(t, dsn, "", "process", "abandon", "--table", "checkouts", "--key", "o-1", "--tenant", "acme", "--dry-run")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Equal(t, "would abandon the checkout process with key o-1 of tenant acme in checkouts, at version 2, "+
			"and cancel its 2 live timeouts (payment,reminder) (dry run: nothing changed)\n", res.stdout)
		assert.Equal(t, all, running(), "a dry run abandons nothing")

		res = bento(t, dsn, "n\n", "process", "abandon", "--table", "checkouts", "--key", "o-1", "--tenant", "acme")
		assert.Equal(t, 1, res.code)
		assert.Contains(t, res.stderr, "abandon the checkout process with key o-1 of tenant acme in checkouts? "+
			"It is completed without a step and its 2 live timeouts (payment,reminder) cancelled; later messages for it are dropped. [y/N]")
		assert.Contains(t, res.stderr, errDeclined.Error())
		assert.Equal(t, all, running(), "a declined abandon abandons nothing")

		res = bento(t, dsn, "y\n", "process", "abandon", "--table", "checkouts", "--key", "o-1", "--tenant", "acme")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Equal(t, "abandoned the checkout process with key o-1 of tenant acme in checkouts\n", res.stdout)
		assert.Equal(t, []string{"globex/o-1", "default/o-2"}, running(), "globex's process under the same key still runs")
		assert.Equal(t, []string{"globex/checkout/o-1/payment"}, waiting(), "acme's timeouts were cancelled, globex's waits")

		res = bento(t, dsn, "", "process", "abandon", "--table", "checkouts", "--key", "o-1", "--tenant", "acme", "--yes")
		assert.Equal(t, 1, res.code)
		assert.Empty(t, res.stdout)
		assert.Equal(t, "bento process abandon: nothing to abandon: the process completed already ("+
			process.ErrCompleted.Error()+": o-1 of tenant acme in checkouts)\n", res.stderr)

		// Without --tenant the key is the default tenant's: globex's stays.
		res = bento(t, dsn, "", "process", "abandon", "--table", "checkouts", "--key", "o-1", "--yes")
		assert.Equal(t, 1, res.code)
		assert.Equal(t, "bento process abandon: nothing to abandon: no such process ("+
			process.ErrNotFound.Error()+": o-1 of tenant default in checkouts)\n", res.stderr)
		assert.Equal(t, []string{"globex/o-1", "default/o-2"}, running())

		res = bento(t, dsn, "", "process", "abandon", "--table", "checkouts", "--key", "o-2", "--dry-run")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Equal(t, "would abandon the checkout process with key o-2 of tenant default in checkouts, at version 2, "+
			"which has no live timeouts (dry run: nothing changed)\n", res.stdout)
		res = bento(t, dsn, "", "process", "abandon", "--table", "checkouts", "--key", "o-2", "--yes")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Equal(t, "abandoned the checkout process with key o-2 of tenant default in checkouts\n", res.stdout)
		assert.Equal(t, []string{"globex/o-1"}, running())

		for _, args := range [][]string{
			{"process", "list"},
			{"process", "list", "--table", "checkouts; DROP TABLE checkouts"},
			{"process", "list", "--table", "checkouts", "--limit", "0"},
			{"process", "abandon", "--table", "checkouts"},
			{"process", "abandon", "--key", "o-1"},
			{"process", "abandon", "--table", "bad-table", "--key", "o-1", "--yes"},
			{"process", "abandon", "--table", "checkouts", "--key", "o-1", "--tenant", "bad tenant"},
		} {
			res = bento(t, dsn, "", args...)
			assert.Equal(t, 2, res.code, "bento %s: %s", strings.Join(args, " "), res.stderr)
		}
		assert.Equal(t, []string{"globex/o-1"}, running(), "nothing else was abandoned")
		assert.Equal(t, []string{"globex/checkout/o-1/payment"}, waiting())
	})
}

// TestConsoleProcessTable: bento console --process-table shows the
// table's running processes on the Processes page, and refuses a table
// name that is no plain SQL identifier (exit 2).
func TestConsoleProcessTable(t *testing.T) {
	onBusDatabases(t, func(t *testing.T, db *gorm.DB, dsn string) {
		require.NoError(t, outbox.Migrate(t.Context(), db))
		require.NoError(t, db.AutoMigrate(&checkoutState{}))
		st, err := outbox.NewStore(db, nil)
		require.NoError(t, err)
		seedCheckout(t, db, st, "acme", "o-1", time.Now().UTC().Add(-time.Hour), false, "payment")

		base, stop := startConsole(t, dsn, "--addr", "127.0.0.1:0", "--process-table", "checkouts")
		res, err := http.Get(base + "processes")
		require.NoError(t, err)
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, res.StatusCode)
		assert.Contains(t, string(body), `data-tenant="acme" data-key="o-1"`)
		stop()

		r := bento(t, dsn, "", "console", "--addr", "127.0.0.1:0", "--process-table", "bad-table")
		assert.Equal(t, 2, r.code)
		assert.Contains(t, r.stderr, "ProcessTables[0]")
	})
}

// TestProcessPurgeThroughTheBinary purges completed processes on
// PostgreSQL and SQLite: a dry run counts those completed more than
// --completed-before ago, --tenant narrows them, the purge deletes them
// after a confirmation and keeps running and recent ones; nothing to
// delete says so; a missing age or a bad table exits 2.
func TestProcessPurgeThroughTheBinary(t *testing.T) {
	onBusDatabases(t, func(t *testing.T, db *gorm.DB, dsn string) {
		ctx := t.Context()
		require.NoError(t, outbox.Migrate(ctx, db))
		require.NoError(t, db.AutoMigrate(&checkoutState{}))
		now := time.Now().UTC()
		st, err := outbox.NewStore(db, nil)
		require.NoError(t, err)
		seedCheckout(t, db, st, "acme", "running", now.Add(-90*24*time.Hour), false)
		for _, p := range []struct {
			tenant, key string
			ago         time.Duration
		}{{"acme", "old-1", 40 * 24 * time.Hour}, {"globex", "old-2", 35 * 24 * time.Hour}, {"acme", "recent", time.Hour}} {
			seedCheckout(t, db, st, p.tenant, p.key, now.Add(-p.ago-time.Hour), true)
			done := now.Add(-p.ago)
			require.NoError(t, db.Model(&checkoutState{}).Where("tenant_id = ? AND process_key = ?", p.tenant, p.key).
				Update("completed_at", done).Error)
		}
		keys := func() []string {
			var out []string
			require.NoError(t, db.Model(&checkoutState{}).Order("tenant_id, process_key").Pluck("process_key", &out).Error)
			return out
		}

		res := bento(t, dsn, "", "process", "purge", "--table", "checkouts", "--completed-before", "30d", "--dry-run")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Equal(t, "would delete 2 processes in checkouts completed more than 30d ago (dry run: nothing changed)\n", res.stdout)
		res = bento(t, dsn, "", "process", "purge", "--table", "checkouts", "--completed-before", "30d", "--tenant", "globex", "--yes")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Equal(t, "deleted 1 process in checkouts completed more than 30d ago of tenant globex\n", res.stdout)
		assert.Equal(t, []string{"old-1", "recent", "running"}, keys())
		res = bento(t, dsn, "y\n", "process", "purge", "--table", "checkouts", "--completed-before", "30d")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Contains(t, res.stdout, "deleted 1 process in checkouts completed more than 30d ago\n")
		assert.Equal(t, []string{"recent", "running"}, keys(), "running and recently completed processes stay")
		res = bento(t, dsn, "", "process", "purge", "--table", "checkouts", "--completed-before", "30d", "--yes")
		require.Equal(t, 0, res.code, res.stderr)
		assert.Equal(t, "nothing to delete: no processes in checkouts completed more than 30d ago\n", res.stdout)

		res = bento(t, dsn, "", "process", "purge", "--table", "checkouts")
		assert.Equal(t, 2, res.code, "no age: %s", res.stderr)
		res = bento(t, dsn, "", "process", "purge", "--table", "check-outs", "--completed-before", "30d")
		assert.Equal(t, 2, res.code, "a bad table: %s", res.stderr)
	})
}
