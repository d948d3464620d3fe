package outbox_test

import (
	"context"
	"io/fs"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

type migrationRow struct {
	Component string
	Version   int
	Name      string
}

// requireMigrated checks that the outbox table, its indexes and exactly one
// bento_migrations row (outbox, 1) exist.
func requireMigrated(t *testing.T, db *gorm.DB) {
	t.Helper()
	var rows []migrationRow
	require.NoError(t, db.Raw("SELECT component, version, name FROM bento_migrations WHERE component = ?", "outbox").
		Scan(&rows).Error)
	want := []migrationRow{
		{Component: "outbox", Version: 1, Name: "outbox_events"},
		{Component: "outbox", Version: 2, Name: "relay_indexes"},
		{Component: "outbox", Version: 3, Name: "failed_at"},
	}
	if db.Dialector.Name() == "postgres" { // SQLite has no NOTIFY to spare
		want = append(want, migrationRow{Component: "outbox", Version: 4, Name: "idle_relays"})
	}
	want = append(want,
		migrationRow{Component: "outbox", Version: 5, Name: "head_of_line"},
		migrationRow{Component: "outbox", Version: 6, Name: "unique_aggregate_versions"},
		migrationRow{Component: "outbox", Version: 7, Name: "unsent_index"},
		migrationRow{Component: "outbox", Version: 8, Name: "aggregate_probes"},
		migrationRow{Component: "outbox", Version: 9, Name: "scheduled"})
	require.Equal(t, want, rows)
	require.True(t, db.Migrator().HasTable("outbox_scheduled"), "outbox_scheduled table")
	m := db.Migrator()
	require.True(t, m.HasTable(&outbox.Message{}), "outbox_events table")
	assert.True(t, m.HasIndex(&outbox.Message{}, "outbox_events_due"), "outbox_events_due index")
	assert.False(t, m.HasIndex(&outbox.Message{}, "outbox_events_ready"), "the older claim index is dropped")
	assert.True(t, m.HasIndex(&outbox.Message{}, "outbox_events_dedup"), "outbox_events_dedup index")
}

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		require.NoError(t, outbox.Migrate(ctx, db))
		requireMigrated(t, db)

		// A row written before the second run survives it.
		st := testenv.NewClock(epoch)
		store, err := outbox.NewStore(db, &outbox.Config{Clock: st})
		require.NoError(t, err)
		tx := begin(t, db)
		_, err = store.Add(ctx, tx, "order.paid", orderPaid{OrderID: "o-1"}, nil)
		require.NoError(t, err)
		require.NoError(t, tx.Commit().Error)

		require.NoError(t, outbox.Migrate(ctx, db))
		requireMigrated(t, db)
		assert.Equal(t, int64(1), countRows(t, db, ""))
	})
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		const n = 4
		ctx := context.Background()
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				errs[i] = outbox.Migrate(ctx, db)
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			require.NoErrorf(t, err, "Migrate #%d", i)
		}
		requireMigrated(t, db)
	})
}

func TestMigrateUnsupportedDatabase(t *testing.T) {
	t.Parallel()
	err := outbox.Migrate(context.Background(), otherDB())
	require.ErrorIs(t, err, dialect.ErrUnsupported)
	err = outbox.Migrate(context.Background(), nil)
	require.ErrorIs(t, err, dialect.ErrUnsupported)
}

// TestNewStoreNeedsMigrate: NewStore on a database without the outbox
// table fails with ErrNotMigrated, and succeeds once Migrate ran (on the
// partitioned backend the table exists, partitioned, from the start).
func TestNewStoreNeedsMigrate(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		if !b.Partitioned {
			_, err := outbox.NewStore(db, nil)
			require.ErrorIs(t, err, outbox.ErrNotMigrated)
			require.NoError(t, outbox.Migrate(context.Background(), db))
		}
		st, err := outbox.NewStore(db, nil)
		require.NoError(t, err)
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			_, err := st.Add(context.Background(), tx, "order.paid", orderPaid{}, nil)
			return err
		}), "the store works once the table exists")
	})
}

func TestMigrations(t *testing.T) {
	t.Parallel()
	fsys := outbox.Migrations()
	for _, name := range []string{"postgres/001_outbox_events.sql", "sqlite/001_outbox_events.sql"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, err := fs.ReadFile(fsys, name)
			require.NoError(t, err)
			assert.Contains(t, string(b), "CREATE TABLE IF NOT EXISTS outbox_events")
			assert.Contains(t, string(b), "outbox_events_ready")
		})
	}
	for dir, want := range map[string][]string{
		"postgres": {"001_outbox_events.sql", "002_relay_indexes.sql", "003_failed_at.sql", "004_idle_relays.sql",
			"005_head_of_line.sql", "006_unique_aggregate_versions.sql", "007_unsent_index.sql", "008_aggregate_probes.sql",
			"009_scheduled.sql"},
		"sqlite": {"001_outbox_events.sql", "002_relay_indexes.sql", "003_failed_at.sql",
			"005_head_of_line.sql", "006_unique_aggregate_versions.sql", "007_unsent_index.sql", "008_aggregate_probes.sql",
			"009_scheduled.sql"},
	} {
		entries, err := fs.ReadDir(fsys, dir)
		require.NoError(t, err)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		assert.Equal(t, want, names, dir)
	}
}

// otherDialect is a GORM dialector for a database bento does not support.
type otherDialect struct{ gorm.Dialector }

func (otherDialect) Name() string { return "mysql" }

// otherDB returns a handle whose dialect is neither postgres nor sqlite. It
// never reaches a database.
func otherDB() *gorm.DB {
	return &gorm.DB{Config: &gorm.Config{Dialector: otherDialect{}}}
}
