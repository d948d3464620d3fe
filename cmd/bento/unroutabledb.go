package main

import (
	"context"
	"fmt"
	"time"

	"github.com/bentoevents/bento/dbbus"
)

// unroutablePurge runs "bento unroutable purge": it deletes the messages
// the database bus in DATABASE_URL keeps in its unroutable group
// (dbbus.PurgeUnroutable), those published more than --older-than ago, or
// all of them with --all. On RabbitMQ the unroutable queue is a queue of
// the broker, purged with the broker's own tools.
func (c *cli) unroutablePurge(ctx context.Context, args []string) error {
	fs := c.newFlags("unroutable purge", "(--older-than AGE|--all) [--bus database] [--dry-run] [--yes]")
	var olderThan ageFlag
	fs.Var(&olderThan, "older-than", "delete the unroutable events published longer ago than `AGE` (e.g. 7d, 36h)")
	all := fs.Bool("all", false, "delete every unroutable event")
	bus := addBusFlag(fs)
	dry := fs.Bool("dry-run", false, "say how many the bus holds and delete nothing")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if olderThan.set == *all {
		return usagef("say what to purge: --older-than D or --all")
	}
	resolved, err := c.resolveBus(*bus)
	if err != nil {
		return err
	}
	if resolved != busDatabase {
		return usagef("unroutable purge is for the database bus (--bus database): purge RabbitMQ's unroutable queue with the broker's tools")
	}
	db, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeAll(db)
	if _, err := databaseDeadLetters(db); err != nil {
		return err
	}
	n, err := dbbus.Depth(ctx, db, dbbus.UnroutableGroup)
	if err != nil {
		return err
	}
	what := "every unroutable event"
	if !*all {
		what = fmt.Sprintf("the unroutable events older than %v", olderThan.d)
	}
	if *dry {
		fmt.Fprintf(c.stdout, "the database bus holds %d unroutable event(s); would delete %s (dry run: nothing changed)\n", n, what)
		return nil
	}
	if n == 0 {
		fmt.Fprintln(c.stdout, "no unroutable event to delete")
		return nil
	}
	if err := c.confirm(*yes, fmt.Sprintf("delete %s (of %d)? They are gone for good.", what, n)); err != nil {
		return err
	}
	age := time.Duration(0)
	if !*all {
		age = olderThan.d
	}
	deleted, err := dbbus.PurgeUnroutable(ctx, db, age)
	if err != nil {
		return fmt.Errorf("purge: %w (deleted before the error: %d)", err, deleted)
	}
	fmt.Fprintf(c.stdout, "deleted %d unroutable event(s)\n", deleted)
	return nil
}
