package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/tenant"
)

// scheduledList runs "bento scheduled list": the scheduled messages still
// waiting in outbox_scheduled, first due first, under a line that counts
// them (outbox.Store.ScheduledBacklog).
func (c *cli) scheduledList(ctx context.Context, args []string) error {
	fs := c.newFlags("scheduled list", "[--tenant T] [--key K] [--limit N]")
	tenantID := fs.String("tenant", "", "only this tenant")
	key := fs.String("key", "", "only the messages scheduled under this key")
	readLimit := addLimit(fs, "at most this many messages")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	limit, err := readLimit()
	if err != nil {
		return err
	}
	st, done, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer done()
	backlog, err := st.ScheduledBacklog(ctx, *tenantID)
	if err != nil {
		return err
	}
	rows, err := st.ListScheduled(ctx, outbox.ScheduledFilter{Tenant: *tenantID, Key: *key, Limit: limit})
	if err != nil {
		return err
	}
	what := things{noun: "scheduled message", qualifier: " waiting"}
	if *tenantID != "" {
		what.qualifier += " for tenant " + *tenantID
	}
	fmt.Fprint(c.stdout, what.n(backlog.Waiting))
	if backlog.Waiting > 0 {
		fmt.Fprintf(c.stdout, ", first due at %s", timeOrDashValue(backlog.FirstDue))
		if backlog.Overdue > 0 {
			fmt.Fprintf(c.stdout, " (overdue by %s: is a projector running?)", humanAge(backlog.Overdue))
		}
	}
	fmt.Fprintln(c.stdout)
	if len(rows) == 0 {
		if *key != "" && backlog.Waiting > 0 {
			fmt.Fprintf(c.stdout, "none with key %s\n", *key)
		}
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTENANT\tTOPIC\tKEY\tDUE AT\tCREATED AT")
	for _, m := range rows {
		k := m.Key
		if k == "" {
			k = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, m.TenantID, m.Topic, k,
			timeOrDashValue(m.DueAt), timeOrDashValue(m.CreatedAt))
	}
	return c.flushListing(tw, len(rows), limit)
}

// scheduledCancel runs "bento scheduled cancel": it cancels the messages
// scheduled under a key that still wait (outbox.Store.Cancel), in a
// transaction of its own, after a dry run that counts them (the same
// cancel, rolled back) and a confirmation.
func (c *cli) scheduledCancel(ctx context.Context, args []string) error {
	fs := c.newFlags("scheduled cancel", "--key K [--tenant T] [--dry-run] [--yes]")
	key := fs.String("key", "", "cancel the messages scheduled under this key")
	tenantID := fs.String("tenant", tenant.Default, "the tenant the key belongs to")
	dry := fs.Bool("dry-run", false, "say what would be cancelled and cancel nothing")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *key == "" {
		return usagef("say which scheduled messages to cancel: --key K")
	}
	if err := tenant.Validate(*tenantID); err != nil {
		return usagef("bad --tenant: %v", err)
	}
	st, done, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer done()
	what := things{noun: "scheduled message", qualifier: fmt.Sprintf(" with key %s of tenant %s", *key, *tenantID)}
	n, err := cancelScheduled(ctx, st, *key, *tenantID, false)
	if err != nil {
		return cancelFailure(err, what)
	}
	if *dry {
		fmt.Fprintf(c.stdout, "would cancel %s (dry run: nothing changed)\n", what.n(n))
		return nil
	}
	if err := c.confirm(*yes, fmt.Sprintf("cancel %s? They are never delivered.", what.n(n))); err != nil {
		return err
	}
	n, err = cancelScheduled(ctx, st, *key, *tenantID, true)
	if err != nil {
		return cancelFailure(err, what)
	}
	fmt.Fprintf(c.stdout, "cancelled %s\n", what.n(n))
	return nil
}

// errRolledBack ends the transaction of a dry-run cancel.
var errRolledBack = errors.New("dry run: rolled back")

// cancelScheduled cancels what waits under key in tenantID in a
// transaction of its own, which commits only when commit is set, and
// returns how many messages the cancel took.
func cancelScheduled(ctx context.Context, st *outbox.Store, key, tenantID string, commit bool) (int64, error) {
	var n int64
	err := st.DB().WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		n, err = st.Cancel(ctx, tx, key, &outbox.CancelOpts{Tenant: tenantID})
		if err == nil && !commit {
			err = errRolledBack
		}
		return err
	})
	if errors.Is(err, errRolledBack) {
		err = nil
	}
	return n, err
}

// cancelFailure says in words why a cancel of what changed nothing.
func cancelFailure(err error, what things) error {
	switch {
	case errors.Is(err, outbox.ErrCancelTooLate):
		return fmt.Errorf("too late to cancel: every %s%s was already released for delivery, and is or will be delivered (%w)",
			what.noun, what.qualifier, outbox.ErrCancelTooLate)
	case errors.Is(err, outbox.ErrNotScheduled):
		return fmt.Errorf("nothing to cancel: %s wait (none was scheduled under the key, or it was cancelled already) (%w)",
			what.n(0), outbox.ErrNotScheduled)
	}
	return err
}
