package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/internal/fakeclock"
	"github.com/bentoevents/bento/outbox"
)

// purgeFlags are the flags every purge takes.
type purgeFlags struct {
	dry, yes *bool
	batch    *int
}

func (c *cli) purgeFlags(fs *flag.FlagSet) purgeFlags {
	return purgeFlags{
		dry:   fs.Bool("dry-run", false, "count what would be deleted and delete nothing"),
		yes:   fs.Bool("yes", false, "do not ask for confirmation"),
		batch: fs.Int("batch", 1000, "rows per DELETE statement"),
	}
}

// purgeRun counts with count, and unless it is a dry run or nothing
// matches, asks for confirmation and deletes with purge.
func (c *cli) purgeRun(p purgeFlags, what things, count func() (int64, error), purge func() (int64, error)) error {
	if *p.batch < 1 {
		return usagef("--batch must be at least 1")
	}
	n, err := count()
	if err != nil {
		return err
	}
	if n == 0 {
		fmt.Fprintf(c.stdout, "%s: nothing to delete\n", what.n(0))
		return nil
	}
	if *p.dry {
		fmt.Fprintf(c.stdout, "would delete %s (dry run: nothing changed)\n", what.n(n))
		return nil
	}
	if err := c.confirm(*p.yes, fmt.Sprintf("delete %s?", what.n(n))); err != nil {
		return err
	}
	deleted, err := purge()
	if err != nil {
		return fmt.Errorf("deleted %s, then: %w", what.n(deleted), err)
	}
	fmt.Fprintf(c.stdout, "deleted %s\n", what.n(deleted))
	return nil
}

func (c *cli) purge(ctx context.Context, args []string) error {
	fs := c.newFlags("purge", "--sent-older-than AGE [--tenant T] [--batch N] [--dry-run] [--yes]")
	var age ageFlag
	fs.Var(&age, "sent-older-than", "delete sent rows published longer ago than `AGE` (e.g. 7d, 36h)")
	tenant := fs.String("tenant", "", "only this tenant")
	p := c.purgeFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if !age.set {
		return usagef("--sent-older-than is required (e.g. --sent-older-than 7d)")
	}
	st, done, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer done()
	opts := &outbox.PurgeOpts{Tenant: *tenant, BatchSize: *p.batch}
	what := things{noun: "sent outbox row", qualifier: olderThan("published", age.d)}
	return c.purgeRun(p, what,
		func() (int64, error) { return st.CountSent(ctx, age.d, opts) },
		func() (int64, error) { return st.PurgeSent(ctx, age.d, opts) })
}

func (c *cli) inboxPurge(ctx context.Context, args []string) error {
	fs := c.newFlags("inbox purge", "--older-than AGE [--consumer C] [--batch N] [--dry-run] [--yes]")
	var age ageFlag
	fs.Var(&age, "older-than", "delete records received longer ago than `AGE` (e.g. 30d); this is the dedup window")
	consumer := fs.String("consumer", "", "only this consumer's records")
	p := c.purgeFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if !age.set {
		return usagef("--older-than is required (e.g. --older-than 30d)")
	}
	db, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeAll(db)
	opts := &inbox.PurgeOpts{Consumer: *consumer, BatchSize: *p.batch}
	what := things{noun: "inbox record", qualifier: olderThan("received", age.d)}
	return c.purgeRun(p, what,
		func() (int64, error) { return inbox.CountPurgeable(ctx, db, age.d, opts) },
		func() (int64, error) { return inbox.Purge(ctx, db, age.d, opts) })
}

func (c *cli) idempotencyPurge(ctx context.Context, args []string) error {
	fs := c.newFlags("idempotency purge", "[--batch N] [--dry-run] [--yes]")
	p := c.purgeFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	db, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeAll(db)
	// One instant for the count and the purge, so they agree.
	opts := &idempotency.PurgeOpts{BatchSize: *p.batch, Clock: fakeclock.New(time.Now())}
	return c.purgeRun(p, things{noun: "expired idempotency key"},
		func() (int64, error) { return idempotency.CountExpired(ctx, db, 0, opts) },
		func() (int64, error) { return idempotency.Purge(ctx, db, 0, opts) })
}
