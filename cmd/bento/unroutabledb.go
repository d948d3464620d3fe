package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/messaging"
)

// unroutableDatabase runs "bento unroutable list|replay" on the database
// bus in DATABASE_URL: the messages it keeps in dbbus.UnroutableGroup
// because no group was bound to their topic (dbbus.ListUnroutable,
// dbbus.ReplayUnroutable).
func (c *cli) unroutableDatabase(ctx context.Context, verb string, types []string, limit int, dry, yes bool) error {
	db, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeAll(db)
	if _, err := databaseDeadLetters(db); err != nil {
		return err
	}
	f := dbbus.UnroutableFilter{EventTypes: types}
	kept, err := dbbus.ListUnroutable(ctx, db, f, 100_000)
	if err != nil {
		return err
	}
	what := things{noun: "event", qualifier: " kept in " + dbbus.UnroutableGroup}
	if len(types) > 0 {
		what.qualifier += " of type " + strings.Join(types, ", ")
	}
	if verb == "list" {
		if len(kept) == 0 {
			fmt.Fprintln(c.stdout, what.n(0))
			return nil
		}
		count := map[string]int{}
		oldest := map[string]time.Duration{}
		for _, k := range kept {
			t := k.Message.Metadata.Get(messaging.MetaEventType)
			count[t]++
			oldest[t] = max(oldest[t], k.Age)
		}
		names := make([]string, 0, len(count))
		for t := range count {
			names = append(names, t)
		}
		sort.Strings(names)
		tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "EVENT TYPE\tKEPT\tOLDEST")
		for _, t := range names {
			fmt.Fprintf(tw, "%s\t%d\t%s\n", orDash(t), count[t], humanAge(oldest[t]))
		}
		fmt.Fprintln(tw, "\nID\tEVENT TYPE\tTOPIC\tAGGREGATE\tAGE")
		for i, k := range kept {
			if i == limit {
				break
			}
			md := k.Message.Metadata
			agg := "-"
			if md.Get(messaging.MetaAggregateID) != "" {
				agg = md.Get(messaging.MetaAggregateType) + "/" + md.Get(messaging.MetaAggregateID)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.Message.UUID, orDash(md.Get(messaging.MetaEventType)), k.Topic, agg, humanAge(k.Age))
		}
		return tw.Flush()
	}
	if len(kept) == 0 {
		fmt.Fprintf(c.stdout, "%s: nothing to replay\n", what.n(0))
		return nil
	}
	if dry {
		fmt.Fprintf(c.stdout, "would replay %s (dry run: nothing changed)\n", what.n(int64(len(kept))))
		return nil
	}
	if err := c.confirm(yes, fmt.Sprintf("replay %s? Each goes to every group bound to its topic now: declare the group that missed them first; the inbox skips what a group applied already.", what.n(int64(len(kept))))); err != nil {
		return err
	}
	r, err := dbbus.ReplayUnroutable(ctx, db, f)
	if err != nil {
		return fmt.Errorf("replay: %w (%d delivered before the error)", err, len(r.Delivered))
	}
	deliveries := 0
	for _, d := range r.Delivered {
		deliveries += len(d.Queues)
	}
	fmt.Fprintf(c.stdout, "replayed %s: %d deliveries\n", what.n(int64(len(r.Delivered))), deliveries)
	if len(r.Kept) > 0 {
		fmt.Fprintf(c.stdout, "kept still: %d (no group is bound to their topic yet)\n", len(r.Kept))
	}
	return nil
}

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
