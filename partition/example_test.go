package partition_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/bentoevents/bento/embedded"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/partition"
)

// A table is created partitioned by handing MigrateOpts to its MigrateWith,
// and kept in shape by its Maintain. Partitioning needs PostgreSQL: on
// SQLite both return ErrUnsupported and change nothing, so an application
// that runs on either can fall back to an unpartitioned table, which its
// purge keeps small.
func Example() {
	dir, _ := os.MkdirTemp("", "partition")
	defer os.RemoveAll(dir)
	db, err := embedded.OpenSQLite(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()

	err = outbox.MigrateWith(ctx, db, &partition.MigrateOpts{Partitioning: partition.Daily})
	fmt.Println("partitioned on SQLite:", !errors.Is(err, partition.ErrUnsupported))
	if errors.Is(err, partition.ErrUnsupported) {
		err = outbox.Migrate(ctx, db)
	}
	fmt.Println("unpartitioned table:", err)

	_, err = outbox.Maintain(ctx, db, &partition.MaintainOpts{DryRun: true})
	fmt.Println("maintenance unsupported:", errors.Is(err, partition.ErrUnsupported))
	// Output:
	// partitioned on SQLite: false
	// unpartitioned table: <nil>
	// maintenance unsupported: true
}

// ParseInterval reads the names String writes, as the bento command's
// --partition flag takes them.
func ExampleParseInterval() {
	for _, name := range []string{"daily", "monthly", "weekly"} {
		i, err := partition.ParseInterval(name)
		if err != nil {
			fmt.Println(name, "-> unknown interval:", errors.Is(err, partition.ErrUnknownInterval))
			continue
		}
		fmt.Println(name, "->", i, "keeping", i.DefaultAhead(), "partitions ahead")
	}
	// Output:
	// daily -> daily keeping 7 partitions ahead
	// monthly -> monthly keeping 2 partitions ahead
	// weekly -> unknown interval: true
}
