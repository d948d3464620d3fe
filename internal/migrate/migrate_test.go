package migrate_test

import (
	"context"
	"errors"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/migrate"
	"github.com/bentoevents/bento/internal/testenv"
)

func TestLoadChecksNamesAndOrders(t *testing.T) {
	t.Parallel()
	ms, err := migrate.Load(fstest.MapFS{
		"sqlite/010_later.sql": {Data: []byte("SELECT 10")},
		"sqlite/002_first.sql": {Data: []byte("SELECT 2")},
	}, dialect.SQLite)
	require.NoError(t, err)
	require.Len(t, ms, 2)
	assert.Equal(t, 2, ms[0].Version)
	assert.Equal(t, "first", ms[0].Name)
	assert.Equal(t, 10, ms[1].Version)

	for name, fsys := range map[string]fstest.MapFS{
		"bad name":       {"sqlite/first.sql": {Data: []byte("x")}},
		"zero version":   {"sqlite/000_zero.sql": {Data: []byte("x")}},
		"duplicate":      {"sqlite/001_a.sql": {Data: []byte("x")}, "sqlite/1_b.sql": {Data: []byte("x")}},
		"missing folder": {"postgres/001_a.sql": {Data: []byte("x")}},
	} {
		_, err := migrate.Load(fsys, dialect.SQLite)
		assert.Error(t, err, name)
	}
}

func TestUpAppliesOnceAndRecords(t *testing.T) {
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		ctx := context.Background()
		fsys := fstest.MapFS{
			b.Name + "/001_create.sql": {Data: []byte("CREATE TABLE widgets (id INTEGER PRIMARY KEY)")},
			b.Name + "/002_seed.sql":   {Data: []byte("INSERT INTO widgets (id) VALUES (1); INSERT INTO widgets (id) VALUES (2)")},
		}
		st, err := migrate.List(ctx, db, "widgets", fsys)
		require.NoError(t, err)
		require.Len(t, st, 2)
		assert.Nil(t, st[0].AppliedAt)

		require.NoError(t, migrate.Up(ctx, db, "widgets", fsys))
		require.NoError(t, migrate.Up(ctx, db, "widgets", fsys)) // no second insert
		var n int64
		require.NoError(t, db.Table("widgets").Count(&n).Error)
		assert.Equal(t, int64(2), n, "a multi-statement file ran once")

		st, err = migrate.List(ctx, db, "widgets", fsys)
		require.NoError(t, err)
		for _, s := range st {
			assert.NotNil(t, s.AppliedAt, "migration %d recorded", s.Version)
		}

		// A failing migration is rolled back and not recorded.
		fsys[b.Name+"/003_broken.sql"] = &fstest.MapFile{Data: []byte("INSERT INTO widgets (id) VALUES (3); SELECT * FROM no_such_table")}
		require.Error(t, migrate.Up(ctx, db, "widgets", fsys))
		require.NoError(t, db.Table("widgets").Count(&n).Error)
		assert.Equal(t, int64(2), n, "the broken migration's insert was rolled back")
		st, err = migrate.List(ctx, db, "widgets", fsys)
		require.NoError(t, err)
		assert.Nil(t, st[2].AppliedAt)
	})
}

func TestLoadVariantReplacesByName(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"postgres/001_create.sql":             {Data: []byte("CREATE TABLE plain")},
		"postgres/002_index.sql":              {Data: []byte("CREATE INDEX")},
		"postgres_partitioned/001_create.sql": {Data: []byte("CREATE TABLE partitioned")},
	}
	ms, err := migrate.LoadVariant(fsys, dialect.Postgres, "partitioned")
	require.NoError(t, err)
	require.Len(t, ms, 2)
	assert.Equal(t, migrate.Migration{Version: 1, Name: "create", SQL: "CREATE TABLE partitioned"}, ms[0])
	assert.Equal(t, "CREATE INDEX", ms[1].SQL, "later files are shared")

	plain, err := migrate.LoadVariant(fsys, dialect.Postgres, "")
	require.NoError(t, err)
	assert.Equal(t, "CREATE TABLE plain", plain[0].SQL)

	fsys["postgres_partitioned/003_extra.sql"] = &fstest.MapFile{Data: []byte("x")}
	_, err = migrate.LoadVariant(fsys, dialect.Postgres, "partitioned")
	assert.Error(t, err, "a variant file must replace a file of the dialect")
	_, err = migrate.LoadVariant(fsys, dialect.Postgres, "missing")
	assert.Error(t, err)
}

// TestRequireNamesMissingTables: Require wraps the sentinel it is given and
// names the tables missing, returns nil once they all exist, and leaves a
// transaction it runs in usable (on PostgreSQL a failed statement would
// abort it).
func TestRequireNamesMissingTables(t *testing.T) {
	errMissing := errors.New("widgets: call Migrate first")
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend, db *gorm.DB) {
		require.NoError(t, db.Exec("CREATE TABLE gadgets (id INTEGER PRIMARY KEY)").Error)
		err := migrate.Require(db, "widgets", errMissing, "gadgets", "widgets")
		require.ErrorIs(t, err, errMissing)
		assert.Contains(t, err.Error(), "missing: widgets", "it names the missing table, and only it")
		assert.NotContains(t, err.Error(), "gadgets")

		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			require.ErrorIs(t, migrate.Require(tx, "widgets", errMissing, "widgets"), errMissing)
			return tx.Exec("CREATE TABLE widgets (id INTEGER PRIMARY KEY)").Error
		}), "the transaction goes on after the check")
		require.NoError(t, migrate.Require(db, "widgets", errMissing, "gadgets", "widgets"))
	})
}
