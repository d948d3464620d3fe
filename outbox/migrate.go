package outbox

import (
	"context"
	"embed"
	"io/fs"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/migrate"
	"github.com/bentoevents/bento/partition"
)

//go:embed migrations
var migrationFiles embed.FS

// component is the outbox's name in the bento_migrations table.
const component = "outbox"

// Migrations returns the embedded SQL migrations, one folder per dialect
// ("postgres", "sqlite"), each file named NNN_name.sql. Use it to feed your own
// migration tool; [Migrate] applies the same files. The folder
// "postgres_partitioned" holds the files that replace those of "postgres"
// for a partitioned table (001, which creates it); partitions themselves
// are created by [Migrate] and [Maintain], not by SQL files.
func Migrations() fs.FS {
	return migrate.Folder(migrationFiles)
}

// Migrate creates or upgrades the outbox tables in db (PostgreSQL or SQLite)
// and records what it applied in bento_migrations. It is idempotent and safe
// to run from several processes at once. It is MigrateWith with nil opts: an
// unpartitioned table, or the upgrade of the table as it was created.
func Migrate(ctx context.Context, db *gorm.DB) error {
	return MigrateWith(ctx, db, nil)
}

// MigrateWith is [Migrate] with options; nil opts means none. With
// opts.Partitioning it creates outbox_events on PostgreSQL partitioned by
// created_at, in ranges of that interval (see [partition.MigrateOpts]), to
// be kept in shape by [Maintain]. A table keeps the layout it was created
// with, so later calls of Migrate upgrade a partitioned table too.
//
// Errors: dialect errors for an unsupported database;
// partition.ErrUnsupported, partition.ErrUnknownInterval,
// partition.ErrNotPartitioned, partition.ErrIntervalMismatch or a
// *partition.StepError when partitioning is asked; ErrClosed; or the
// database error.
func MigrateWith(ctx context.Context, db *gorm.DB, opts *partition.MigrateOpts) error {
	if opts != nil && opts.Partitioning != partition.None {
		return migratePartitioned(ctx, db, opts)
	}
	return migrateUp(ctx, db, "")
}

// migrateUp applies the migrations of variant ("" or "partitioned", the
// folder postgres_partitioned laid over postgres).
func migrateUp(ctx context.Context, db *gorm.DB, variant string) error {
	if err := migrate.UpVariant(ctx, db, component, Migrations(), variant); err != nil {
		return wrapDB("outbox", err)
	}
	return nil
}
