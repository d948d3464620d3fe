package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/bentoevents/bento/process"
	"github.com/bentoevents/bento/tenant"
)

// processList runs "bento process list": the processes whose state is in
// the table of --table, started first first (process.List).
func (c *cli) processList(ctx context.Context, args []string) error {
	fs := c.newFlags("process list", "--table T [--tenant T] [--key K] [--all] [--limit N]")
	table := fs.String("table", "", "the processes' state table")
	tenantID := fs.String("tenant", "", "only this tenant")
	key := fs.String("key", "", "only the process of this correlation key")
	all := fs.Bool("all", false, "completed processes too, not only running ones")
	readLimit := addLimit(fs, "at most this many processes")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	limit, err := readLimit()
	if err != nil {
		return err
	}
	if *table == "" {
		return usagef("say which processes to list: --table T, their state model's table")
	}
	st, done, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer done()
	rows, err := process.List(ctx, st.DB(), *table, process.Filter{Tenant: *tenantID, Key: *key, Completed: *all, Limit: limit})
	if err != nil {
		return processFailure(err)
	}
	if len(rows) == 0 {
		none := "no running processes in " + *table
		if *all {
			none = "no processes in " + *table
		}
		if *tenantID != "" {
			none += " of tenant " + *tenantID
		}
		if *key != "" {
			none += " with key " + *key
		}
		fmt.Fprintln(c.stdout, none)
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROCESS\tTENANT\tKEY\tVERSION\tSTATUS\tSTARTED AT\tUPDATED AT\tTIMEOUTS")
	for _, p := range rows {
		status := "running"
		if p.Completed {
			status = "completed"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", orDash(p.Process), p.TenantID, p.Key, p.Version, status,
			timeOrDashValue(p.StartedAt), timeOrDashValue(p.UpdatedAt), timeoutNames(p.Timeouts))
	}
	return c.flushListing(tw, len(rows), limit)
}

// processAbandon runs "bento process abandon": it completes one running
// process without a step, cancelling its live timeouts (process.Abandon),
// after a dry run that shows the process and a confirmation.
func (c *cli) processAbandon(ctx context.Context, args []string) error {
	fs := c.newFlags("process abandon", "--table T --key K [--tenant T] [--dry-run] [--yes]")
	table := fs.String("table", "", "the process's state table")
	key := fs.String("key", "", "the process's correlation key")
	tenantID := fs.String("tenant", tenant.Default, "the tenant the process belongs to")
	dry := fs.Bool("dry-run", false, "say what would be abandoned and change nothing")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *table == "" || *key == "" {
		return usagef("say which process to abandon: --table T --key K")
	}
	if err := tenant.Validate(*tenantID); err != nil {
		return usagef("bad --tenant: %v", err)
	}
	st, done, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer done()
	rows, err := process.List(ctx, st.DB(), *table, process.Filter{Tenant: *tenantID, Key: *key, Completed: true, Limit: 1})
	if err != nil {
		return processFailure(err)
	}
	switch {
	case len(rows) == 0:
		return processFailure(fmt.Errorf("%w: %s of tenant %s in %s", process.ErrNotFound, *key, *tenantID, *table))
	case rows[0].Completed:
		return processFailure(fmt.Errorf("%w: %s of tenant %s in %s", process.ErrCompleted, *key, *tenantID, *table))
	}
	p := rows[0]
	what := fmt.Sprintf("process with key %s of tenant %s in %s", *key, *tenantID, *table)
	if p.Process != "" {
		what = p.Process + " " + what
	}
	// What happens to its timeouts, in the dry run's words and the
	// question's.
	wouldCancel, cancelled := ", which has no live timeouts", ""
	if n := len(p.Timeouts); n > 0 {
		timeouts := fmt.Sprintf("%s (%s)", things{noun: "live timeout"}.n(int64(n)), timeoutNames(p.Timeouts))
		wouldCancel, cancelled = ", and cancel its "+timeouts, " and its "+timeouts+" cancelled"
	}
	if *dry {
		fmt.Fprintf(c.stdout, "would abandon the %s, at version %d%s (dry run: nothing changed)\n", what, p.Version, wouldCancel)
		return nil
	}
	if err := c.confirm(*yes, fmt.Sprintf("abandon the %s? It is completed without a step%s; later messages for it are dropped.",
		what, cancelled)); err != nil {
		return err
	}
	if err := process.Abandon(ctx, st.DB(), st, *table, *tenantID, *key); err != nil {
		return processFailure(err)
	}
	fmt.Fprintf(c.stdout, "abandoned the %s\n", what)
	return nil
}

// processPurge runs "bento process purge": it deletes the processes of a
// state table that completed more than --completed-before ago
// (process.Purge), after a dry run that counts them and a confirmation.
func (c *cli) processPurge(ctx context.Context, args []string) error {
	fs := c.newFlags("process purge", "--table T --completed-before AGE [--tenant T] [--dry-run] [--yes]")
	table := fs.String("table", "", "the process manager's state table")
	age := &ageFlag{}
	fs.Var(age, "completed-before", "delete processes completed `AGE` ago or earlier (30d, 720h); keep it past the inbox's retention")
	tenantID := fs.String("tenant", "", "only this tenant's processes")
	dry := fs.Bool("dry-run", false, "count what would be deleted and delete nothing")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *table == "" || !age.set || age.d <= 0 {
		return usagef("say which processes to purge: --table T --completed-before AGE")
	}
	if *tenantID != "" {
		if err := tenant.Validate(*tenantID); err != nil {
			return usagef("bad --tenant: %v", err)
		}
	}
	st, done, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer done()
	qualifier := fmt.Sprintf(" in %s completed more than %s ago", *table, humanAge(age.d))
	if *tenantID != "" {
		qualifier += " of tenant " + *tenantID
	}
	what := things{noun: "process", plural: "processes", qualifier: qualifier}
	opts := &process.PurgeOpts{Tenant: *tenantID, DryRun: true}
	n, err := process.Purge(ctx, st.DB(), *table, age.d, opts)
	if err != nil {
		return processFailure(err)
	}
	switch {
	case *dry:
		fmt.Fprintf(c.stdout, "would delete %s (dry run: nothing changed)\n", what.n(n))
		return nil
	case n == 0:
		fmt.Fprintf(c.stdout, "nothing to delete: %s\n", what.n(0))
		return nil
	}
	if err := c.confirm(*yes, fmt.Sprintf("delete %s? A late message for one of them then meets its Missing policy, or starts it again.",
		what.n(n))); err != nil {
		return err
	}
	opts.DryRun = false
	n, err = process.Purge(ctx, st.DB(), *table, age.d, opts)
	if err != nil {
		return processFailure(err)
	}
	fmt.Fprintf(c.stdout, "deleted %s\n", what.n(n))
	return nil
}

// processFailure says in words why a process command could not go on: a
// bad table name is a usage error (exit 2), a process not found or
// already completed a failure (exit 1).
func processFailure(err error) error {
	switch {
	case errors.Is(err, process.ErrInvalidTable):
		return usagef("bad --table: %v", err)
	case errors.Is(err, process.ErrNotFound):
		return fmt.Errorf("nothing to abandon: no such process (%w)", err)
	case errors.Is(err, process.ErrCompleted):
		return fmt.Errorf("nothing to abandon: the process completed already (%w)", err)
	}
	return err
}

// timeoutNames lists the names of a process's live timeouts, sorted, or
// "-" for none.
func timeoutNames(t process.Timeouts) string {
	if len(t) == 0 {
		return "-"
	}
	return strings.Join(t.Names(), ",")
}
