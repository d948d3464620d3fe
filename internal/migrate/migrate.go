// Package migrate applies a component's embedded, numbered SQL migrations and
// records them in the bento_migrations table.
//
// Migration files are named NNN_name.sql (NNN a positive number) in a folder
// per dialect. Each file runs in its own transaction together with its
// bento_migrations row; on PostgreSQL a transaction-scoped advisory lock makes
// concurrent Migrate calls from several processes safe.
package migrate

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
)

// Migration is one numbered SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Status is a migration and whether it has been applied.
type Status struct {
	Migration
	AppliedAt *time.Time
}

var fileRE = regexp.MustCompile(`^(\d+)_([a-z0-9_]+)\.sql$`)

// Load reads the migrations for d from fsys (folder d.String()), sorted by
// version.
func Load(fsys fs.FS, d dialect.Dialect) ([]Migration, error) {
	return LoadVariant(fsys, d, "")
}

// LoadVariant is Load with the files of folder <dialect>_<variant> laid
// over those of folder <dialect>: a variant file replaces the dialect file
// of the same name, so both variants share every later migration and record
// the same versions and names. An empty variant is the dialect folder alone.
func LoadVariant(fsys fs.FS, d dialect.Dialect, variant string) ([]Migration, error) {
	ms, err := loadDir(fsys, d.String())
	if err != nil || variant == "" {
		return ms, err
	}
	over, err := loadDir(fsys, d.String()+"_"+variant)
	if err != nil {
		return nil, err
	}
	byVersion := map[int]int{}
	for i, m := range ms {
		byVersion[m.Version] = i
	}
	for _, o := range over {
		i, ok := byVersion[o.Version]
		if !ok || ms[i].Name != o.Name {
			return nil, fmt.Errorf("migration variant %s/%03d_%s.sql replaces no file of %s", variant, o.Version, o.Name, d)
		}
		ms[i] = o
	}
	return ms, nil
}

func loadDir(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %q: name must be NNN_name.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		if v < 1 {
			return nil, fmt.Errorf("migration file %q: version must be positive", e.Name())
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migration version %d used twice: %q and %q", v, prev, e.Name())
		}
		seen[v] = e.Name()
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: m[2], SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

const createTable = `CREATE TABLE IF NOT EXISTS bento_migrations (
	component  VARCHAR(64) NOT NULL,
	version    INTEGER     NOT NULL,
	name       VARCHAR(128) NOT NULL,
	applied_at TIMESTAMP   NOT NULL,
	PRIMARY KEY (component, version)
)`

// lockKey is the PostgreSQL advisory lock key that serialises migrations
// ("bento" in ASCII).
const lockKey = 0x62656e746f

// Up applies every migration of component in fsys that is not yet recorded.
func Up(ctx context.Context, db *gorm.DB, component string, fsys fs.FS) error {
	return UpVariant(ctx, db, component, fsys, "")
}

// UpVariant is Up with the migrations of LoadVariant. Versions are recorded
// under component whatever the variant, so a database keeps the variant its
// first migration chose: later runs, with or without the variant, apply the
// shared later files only.
func UpVariant(ctx context.Context, db *gorm.DB, component string, fsys fs.FS, variant string) error {
	d, err := dialect.Of(db)
	if err != nil {
		return err
	}
	ms, err := LoadVariant(fsys, d, variant)
	if err != nil {
		return err
	}
	for _, m := range ms {
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if d == dialect.Postgres {
				if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", lockKey).Error; err != nil {
					return fmt.Errorf("lock: %w", err)
				}
			}
			if err := tx.Exec(createTable).Error; err != nil {
				return fmt.Errorf("create bento_migrations: %w", err)
			}
			var n int64
			if err := tx.Raw("SELECT count(*) FROM bento_migrations WHERE component = ? AND version = ?",
				component, m.Version).Scan(&n).Error; err != nil {
				return fmt.Errorf("read bento_migrations: %w", err)
			}
			if n > 0 {
				return nil
			}
			if err := tx.Exec(m.SQL).Error; err != nil {
				return fmt.Errorf("apply: %w", err)
			}
			return tx.Exec("INSERT INTO bento_migrations (component, version, name, applied_at) VALUES (?, ?, ?, ?)",
				component, m.Version, m.Name, time.Now().UTC()).Error
		})
		if err != nil {
			return fmt.Errorf("migrate %s %03d_%s: %w", component, m.Version, m.Name, err)
		}
	}
	return nil
}

// List returns the migrations of component with the time each was applied
// (nil when it has not been).
func List(ctx context.Context, db *gorm.DB, component string, fsys fs.FS) ([]Status, error) {
	d, err := dialect.Of(db)
	if err != nil {
		return nil, err
	}
	ms, err := Load(fsys, d)
	if err != nil {
		return nil, err
	}
	type row struct {
		Version   int
		AppliedAt time.Time
	}
	var rows []row
	if db.Migrator().HasTable("bento_migrations") {
		if err := db.WithContext(ctx).Raw("SELECT version, applied_at FROM bento_migrations WHERE component = ?",
			component).Scan(&rows).Error; err != nil {
			return nil, fmt.Errorf("read bento_migrations: %w", err)
		}
	}
	applied := map[int]time.Time{}
	for _, r := range rows {
		applied[r.Version] = r.AppliedAt
	}
	out := make([]Status, len(ms))
	for i, m := range ms {
		out[i].Migration = m
		if at, ok := applied[m.Version]; ok {
			at := at
			out[i].AppliedAt = &at
		}
	}
	return out, nil
}

// Folder returns the "migrations" folder of a package's embedded files, the
// layout every bento component uses (migrations/<dialect>/NNN_name.sql).
func Folder(embedded fs.FS) fs.FS {
	sub, err := fs.Sub(embedded, "migrations")
	if err != nil {
		panic(err) // the folder is embedded at build time
	}
	return sub
}
