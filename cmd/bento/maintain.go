package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/partition"
)

// maintainer runs one partitioned table's maintenance with its options.
type maintainer struct {
	name  string
	table string
	run   func(context.Context, *gorm.DB, *partition.MaintainOpts) (*partition.MaintainResult, error)
	opts  partition.MaintainOpts
}

func (c *cli) maintain(ctx context.Context, args []string) error {
	fs := c.newFlags("maintain", "[--component outbox,inbox] [--outbox-retention 7d] [--inbox-retention 30d] [--seal-after 1h] [--ahead N] [--dry-run] [--yes]")
	only := fs.String("component", "outbox,inbox", "partitioned tables to maintain")
	outboxRet := ageFlag{d: outbox.DefaultRetention}
	fs.Var(&outboxRet, "outbox-retention", "drop outbox partitions whose range ended `AGE` ago or earlier, if all their rows are sent")
	inboxRet := ageFlag{d: inbox.DefaultRetention}
	fs.Var(&inboxRet, "inbox-retention", "drop inbox partitions whose range ended `AGE` ago or earlier (the dedup window)")
	sealAfter := ageFlag{d: partition.DefaultSealAfter}
	fs.Var(&sealAfter, "seal-after", "seal all-sent outbox partitions whose range ended `AGE` ago or earlier")
	ahead := fs.Int("ahead", 0, "partitions to keep created after the current one (default 7 daily, 2 monthly)")
	dry := fs.Bool("dry-run", false, "list what would be created, sealed and dropped, and change nothing")
	yes := fs.Bool("yes", false, "do not ask before dropping partitions")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *ahead < 0 {
		return usagef("--ahead must not be negative")
	}
	all := map[string]maintainer{
		"outbox": {"outbox", "outbox_events", outbox.Maintain,
			partition.MaintainOpts{Ahead: *ahead, Retention: outboxRet.d, SealAfter: sealAfter.d}},
		"inbox": {"inbox", "inbox_messages", inbox.Maintain,
			partition.MaintainOpts{Ahead: *ahead, Retention: inboxRet.d}},
	}
	var chosen []maintainer
	for _, name := range strings.Split(*only, ",") {
		m, ok := all[strings.TrimSpace(name)]
		if !ok {
			return usagef("unknown component %q: want outbox or inbox", name)
		}
		chosen = append(chosen, m)
	}
	db, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeAll(db)

	// Plan first: what would change, and whether anything is dropped.
	plans := map[string]*partition.MaintainResult{}
	var active []maintainer
	drops := 0
	for _, m := range chosen {
		o := m.opts
		o.DryRun = true
		plan, err := m.run(ctx, db, &o)
		if errors.Is(err, partition.ErrNotPartitioned) || errors.Is(err, partition.ErrUnsupported) {
			fmt.Fprintf(c.stdout, "%s: %s is not partitioned; nothing to maintain (bento purge deletes by age)\n", m.name, m.table)
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		plans[m.name] = plan
		active = append(active, m)
		drops += len(plan.Dropped)
	}
	if len(active) == 0 {
		return errors.New("no partitioned table to maintain (create them with bento migrate up --partition daily|monthly)")
	}
	if *dry {
		fmt.Fprintln(c.stdout, "dry run: nothing changed; a run now would")
		return c.printMaintenance(active, plans)
	}
	if drops > 0 {
		if err := c.confirm(*yes, fmt.Sprintf("drop %d partition(s) past retention, with their rows?", drops)); err != nil {
			return err
		}
	}
	done := map[string]*partition.MaintainResult{}
	var errs []error
	for _, m := range active {
		res, err := m.run(ctx, db, &m.opts)
		done[m.name] = res
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.name, err))
		}
	}
	if err := c.printMaintenance(active, done); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// printMaintenance prints one line per partition that was (or would be)
// created, sealed, dropped, kept or blocked.
func (c *cli) printMaintenance(ms []maintainer, results map[string]*partition.MaintainResult) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "COMPONENT\tACTION\tPARTITION")
	lines := 0
	for _, m := range ms {
		r := results[m.name]
		if r == nil {
			continue
		}
		for _, a := range []struct {
			action string
			names  []string
		}{
			{"create", r.Created}, {"seal", r.Sealed}, {"drop", r.Dropped},
			{"keep (holds rows not sent)", r.Kept}, {"blocked (rows in the default partition)", r.Blocked},
		} {
			for _, n := range a.names {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", m.name, a.action, n)
				lines++
			}
		}
	}
	if lines == 0 {
		fmt.Fprintln(c.stdout, "nothing to do: every partition is in place")
		return nil
	}
	return tw.Flush()
}
