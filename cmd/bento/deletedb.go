package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/dbbus"
)

// consumerDeleteDatabase is "bento consumer delete" on the database bus in
// DATABASE_URL: it retires the group and its dead-letter queue there
// (consumer.DeleteDatabase), after a dry run that finds what would go and
// a confirmation.
func (c *cli) consumerDeleteDatabase(ctx context.Context, group string, opts *consumer.DeleteOpts, dry, yes bool) error {
	db, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeAll(db)
	if _, err := databaseDeadLetters(db); err != nil {
		return err
	}
	opts.DryRun = true
	found, err := consumer.DeleteDatabase(ctx, db, group, opts)
	if errors.Is(err, consumer.ErrDeadLettersLeft) {
		return fmt.Errorf("%w; see them with bento consumer dead list --group %s, or delete them too with --force", err, group)
	}
	if err != nil {
		return err
	}
	if len(found.Queues) == 0 {
		fmt.Fprintf(c.stdout, "nothing to delete on the database bus\n")
		return nil
	}
	if dry {
		fmt.Fprintf(c.stdout, "would delete %s (dry run: nothing changed)\n", describeDBDeleted(found))
		return nil
	}
	question := fmt.Sprintf("delete %s? They are gone for good, and a running consumer of them stops receiving.", describeDBDeleted(found))
	if err := c.confirm(yes, question); err != nil {
		return err
	}
	opts.DryRun = false
	done, err := consumer.DeleteDatabase(ctx, db, group, opts)
	if err != nil {
		return fmt.Errorf("delete: %w (deleted before the error: %s)", err, describeDBDeleted(done))
	}
	fmt.Fprintf(c.stdout, "deleted %s\n", describeDBDeleted(done))
	return nil
}

// describeDBDeleted says in words what d holds.
func describeDBDeleted(d dbbus.Deleted) string {
	return fmt.Sprintf("%d queue(s) with %d message(s) from the database bus: %s", len(d.Queues), d.Messages, strings.Join(d.Queues, ", "))
}
