package main

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"text/tabwriter"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/dialect"
	"github.com/bentoevents/bento/internal/migrate"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/partition"
)

// component is one bento component with its own migrations.
type component struct {
	name    string
	files   func() fs.FS
	migrate func(context.Context, *gorm.DB) error
	// partitioned, when set, creates the component's table partitioned.
	partitioned func(context.Context, *gorm.DB, *partition.MigrateOpts) error
}

// components lists them in the order they are applied.
var components = []component{
	{"outbox", outbox.Migrations, outbox.Migrate, outbox.MigrateWith},
	{"inbox", inbox.Migrations, inbox.Migrate, inbox.MigrateWith},
	{"idempotency", idempotency.Migrations, idempotency.Migrate, nil},
}

// selectComponents returns the components named in a comma-separated list,
// or all of them for "".
func selectComponents(list string) ([]component, error) {
	if list == "" {
		return components, nil
	}
	var out []component
	for _, name := range strings.Split(list, ",") {
		found := false
		for _, c := range components {
			if c.name == strings.TrimSpace(name) {
				out, found = append(out, c), true
			}
		}
		if !found {
			return nil, usagef("unknown component %q: want outbox, inbox or idempotency", name)
		}
	}
	return out, nil
}

func (c *cli) migrate(ctx context.Context, args []string) error {
	fs := c.newFlags("migrate", "up|status|sql [--component outbox,inbox,idempotency] [--partition daily|monthly] [--dialect postgres|sqlite]")
	only := fs.String("component", "", "comma-separated components (default: all)")
	dialectName := fs.String("dialect", "postgres", "the dialect of the SQL migrate sql prints: postgres or sqlite")
	partitioning := fs.String("partition", "", "up: create outbox_events and inbox_messages partitioned, daily or monthly (PostgreSQL)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want one of up, status or sql (see -h)")
	}
	comps, err := selectComponents(*only)
	if err != nil {
		return err
	}
	switch pos[0] {
	case "sql":
		var d dialect.Dialect
		switch *dialectName {
		case "postgres":
			d = dialect.Postgres
		case "sqlite":
			d = dialect.SQLite
		default:
			return usagef("unknown dialect %q: want postgres or sqlite", *dialectName)
		}
		return c.migrateSQL(comps, d)
	case "up", "status":
		if *partitioning != "" && pos[0] != "up" {
			return usagef("--partition goes with migrate up")
		}
	default:
		return usagef("unknown migrate command %q: want up, status or sql", pos[0])
	}
	var opts partition.MigrateOpts
	if *partitioning != "" {
		if opts.Partitioning, err = partition.ParseInterval(*partitioning); err != nil {
			return usagef("unknown --partition %q: want daily or monthly", *partitioning)
		}
	}
	db, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeAll(db)
	if pos[0] == "up" {
		for _, comp := range comps {
			before, err := migrate.List(ctx, db, comp.name, comp.files())
			if err != nil {
				return fmt.Errorf("%s: %w", comp.name, err)
			}
			migrateUp := comp.migrate
			if *partitioning != "" && comp.partitioned != nil {
				migrateUp = func(ctx context.Context, db *gorm.DB) error { return comp.partitioned(ctx, db, &opts) }
			}
			if err := migrateUp(ctx, db); err != nil {
				return err
			}
			n := 0
			for _, m := range before {
				if m.AppliedAt == nil {
					n++
				}
			}
			fmt.Fprintf(c.stdout, "%s: applied %d migration(s), %d in all, up to date\n", comp.name, n, len(before))
		}
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "COMPONENT\tVERSION\tNAME\tAPPLIED")
	pending := 0
	for _, comp := range comps {
		list, err := migrate.List(ctx, db, comp.name, comp.files())
		if err != nil {
			return fmt.Errorf("%s: %w", comp.name, err)
		}
		for _, m := range list {
			applied := "pending"
			if m.AppliedAt != nil {
				applied = m.AppliedAt.UTC().Format(time.RFC3339)
			} else {
				pending++
			}
			fmt.Fprintf(tw, "%s\t%03d\t%s\t%s\n", comp.name, m.Version, m.Name, applied)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if pending > 0 {
		fmt.Fprintf(c.stdout, "%d migration(s) pending: run bento migrate up\n", pending)
	}
	return nil
}

// migrateSQL prints the migrations of comps for d, in the order migrate up
// applies them, for teams that run their own migration tool.
func (c *cli) migrateSQL(comps []component, d dialect.Dialect) error {
	fmt.Fprintf(c.stdout, "-- bento migrations for %s. bento migrate up also records each file in\n", d)
	fmt.Fprintln(c.stdout, "-- the bento_migrations table; your own tool keeps its own record instead.")
	for _, comp := range comps {
		ms, err := migrate.Load(comp.files(), d)
		if err != nil {
			return fmt.Errorf("%s: %w", comp.name, err)
		}
		for _, m := range ms {
			fmt.Fprintf(c.stdout, "\n-- %s %03d_%s.sql\n%s", comp.name, m.Version, m.Name, m.SQL)
			if !strings.HasSuffix(m.SQL, "\n") {
				fmt.Fprintln(c.stdout)
			}
		}
	}
	return nil
}
