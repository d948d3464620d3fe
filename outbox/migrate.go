package outbox

import (
	"context"
	"embed"
	"io/fs"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/migrate"
)

//go:embed migrations
var migrationFiles embed.FS

// component is the outbox's name in the bento_migrations table.
const component = "outbox"

// Migrations returns the embedded SQL migrations, one folder per dialect
// ("postgres", "sqlite"), each file named NNN_name.sql. Use it to feed your own
// migration tool; [Migrate] applies the same files.
func Migrations() fs.FS {
	return migrate.Folder(migrationFiles)
}

// Migrate creates or upgrades the outbox tables in db (PostgreSQL or SQLite)
// and records what it applied in bento_migrations. It is idempotent and safe
// to run from several processes at once.
func Migrate(ctx context.Context, db *gorm.DB) error {
	if err := migrate.Up(ctx, db, component, Migrations()); err != nil {
		return wrapDB("outbox", err)
	}
	return nil
}
