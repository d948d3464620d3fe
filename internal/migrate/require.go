package migrate

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
)

// Require returns an error wrapping notMigrated, and naming the tables
// missing, when any of tables does not exist in db; a failed lookup is
// returned prefixed with component. A component's
// constructor calls it once, so that a forgotten Migrate is reported there
// rather than by the first query. A table is looked up as the component's
// queries find it: on PostgreSQL through the search_path (a partitioned
// table counts), on SQLite in the main schema. It costs one query and never
// fails a transaction db may be in. The query runs under db's context.
func Require(db *gorm.DB, component string, notMigrated error, tables ...string) error {
	d, err := dialect.Of(db)
	if err != nil {
		return fmt.Errorf("%s: %w", component, err)
	}
	ctx := db.Statement.Context
	if ctx == nil {
		ctx = context.Background()
	}
	var missing []string
	switch d {
	case dialect.Postgres:
		rows := strings.TrimSuffix(strings.Repeat("(?), ", len(tables)), ", ")
		args := make([]any, len(tables))
		for i, t := range tables {
			args[i] = t
		}
		err = db.WithContext(ctx).Raw("SELECT name FROM (VALUES "+rows+") AS t(name) WHERE to_regclass(name) IS NULL",
			args...).Scan(&missing).Error
	default:
		var found []string
		err = db.WithContext(ctx).Raw("SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ?", tables).
			Scan(&found).Error
		for _, t := range tables {
			if !slices.Contains(found, t) {
				missing = append(missing, t)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("%s: check tables %s: %w", component, strings.Join(tables, ", "), err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w (missing: %s)", notMigrated, strings.Join(missing, ", "))
	}
	return nil
}
