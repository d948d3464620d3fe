package main

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/rabbitmq"
)

// amqpConfig returns the broker of AMQP_URL with exchange, the value of
// fs's flag "exchange", or BENTO_EXCHANGE when that flag was not given.
func (c *cli) amqpConfig(fs *flag.FlagSet, exchange string) (*rabbitmq.Config, error) {
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "exchange" })
	url := strings.TrimSpace(c.getenv("AMQP_URL"))
	if url == "" {
		return nil, usagef("AMQP_URL is not set: set it to the RabbitMQ broker, amqp://user:pass@host:5672/")
	}
	if e := c.getenv("BENTO_EXCHANGE"); e != "" && !explicit {
		exchange = e
	}
	return &rabbitmq.Config{URL: url, Exchange: exchange}, nil
}

// unroutable runs "bento unroutable list|replay": the events parked in
// the exchange's unroutable queue because no queue was bound for them, or
// on the database bus (--bus) the messages it keeps in its unroutable
// group because no group was bound to their topic.
func (c *cli) unroutable(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("want list or replay (see -h)")
	}
	verb := args[0]
	switch verb {
	case "-h", "-help", "--help":
		fmt.Fprintln(c.stdout, "usage: bento unroutable list|replay [--event-type T]... (bento unroutable <command> -h for its flags)")
		return errHelp
	case "list", "replay":
	default:
		return usagef("unknown unroutable command %q: want list or replay", verb)
	}
	fs := c.newFlags("unroutable "+verb, "[--event-type T]... [--bus B] [--exchange E] [--limit N] [--dry-run] [--yes]")
	bus := addBusFlag(fs)
	exchange := fs.String("exchange", rabbitmq.DefaultExchange, "the event exchange (or BENTO_EXCHANGE), on RabbitMQ")
	var types stringsFlag
	fs.Var(&types, "event-type", "only this event type (repeatable)")
	limit := fs.Int("limit", 100, "list: at most this many events")
	dry := fs.Bool("dry-run", false, "replay: say what would be replayed and change nothing")
	yes := fs.Bool("yes", false, "replay: do not ask for confirmation")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	which, err := c.resolveBus(*bus)
	if err != nil {
		return err
	}
	if which == busDatabase {
		return c.unroutableDatabase(ctx, verb, types, *limit, *dry, *yes)
	}
	cfg, err := c.amqpConfig(fs, *exchange)
	if err != nil {
		return err
	}
	parked, err := rabbitmq.ListUnroutable(ctx, cfg, rabbitmq.UnroutableFilter{EventTypes: types}, 100_000)
	if err != nil {
		return err
	}
	byType := map[string]int{}
	for _, m := range parked {
		byType[m.Metadata.Get(messaging.MetaEventType)]++
	}
	what := things{noun: "event", qualifier: " parked in " + rabbitmq.UnroutableQueue(cfg.ExchangeName())}
	if len(types) > 0 {
		what.qualifier += " of type " + strings.Join(types, ", ")
	}
	if verb == "list" {
		if len(parked) == 0 {
			fmt.Fprintln(c.stdout, what.n(0))
			return nil
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "EVENT TYPE\tPARKED")
		names := make([]string, 0, len(byType))
		for t := range byType {
			names = append(names, t)
		}
		sort.Strings(names)
		for _, t := range names {
			fmt.Fprintf(tw, "%s\t%d\n", orDash(t), byType[t])
		}
		fmt.Fprintln(tw, "\nID\tEVENT TYPE\tAGGREGATE\tOCCURRED AT")
		for i, m := range parked {
			if i == *limit {
				break
			}
			md := m.Metadata
			agg := "-"
			if md.Get(messaging.MetaAggregateID) != "" {
				agg = md.Get(messaging.MetaAggregateType) + "/" + md.Get(messaging.MetaAggregateID)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.UUID, orDash(md.Get(messaging.MetaEventType)), agg, orDash(md.Get(messaging.MetaOccurredAt)))
		}
		return tw.Flush()
	}
	if len(parked) == 0 {
		fmt.Fprintf(c.stdout, "%s: nothing to replay\n", what.n(0))
		return nil
	}
	if *dry {
		fmt.Fprintf(c.stdout, "would replay %s (dry run: nothing changed)\n", what.n(int64(len(parked))))
		return nil
	}
	if err := c.confirm(*yes, fmt.Sprintf("replay %s? Declare the queue of the group that missed them first; the inbox skips what a group applied already.", what.n(int64(len(parked))))); err != nil {
		return err
	}
	replayed, back, err := rabbitmq.ReplayUnroutable(ctx, cfg, rabbitmq.UnroutableFilter{EventTypes: types})
	if err != nil {
		return fmt.Errorf("replay: %w (%d replayed before the error)", err, len(replayed))
	}
	fmt.Fprintf(c.stdout, "replayed %s\n", what.n(int64(len(replayed))))
	if back > 0 {
		fmt.Fprintf(c.stdout, "%d came back: no queue is bound for their event type yet (bento consumer declare)\n", back)
	}
	return nil
}

// consumerDeclare runs "bento consumer declare": a group's queues and its
// dead-letter queue (consumer.Declare), ahead of its first deployment, so
// the events relayed before it starts wait for it.
func (c *cli) consumerDeclare(ctx context.Context, args []string) error {
	fs := c.newFlags("consumer declare", "--group G --event-type T... [--partitions N] [--classic] [--exchange E]")
	group := fs.String("group", "", "the consumer group (required)")
	var types stringsFlag
	fs.Var(&types, "event-type", "an event type (or pattern, order.*) the group consumes (repeatable, required)")
	partitions := fs.Int("partitions", consumer.DefaultPartitions, "the group's partition count (0: one unpartitioned queue); every instance must use it")
	classic := fs.Bool("classic", false, "classic partition queues instead of quorum ones")
	exchange := fs.String("exchange", rabbitmq.DefaultExchange, "the event exchange (or BENTO_EXCHANGE)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *group == "" || len(types) == 0 {
		return usagef("--group and at least one --event-type are required")
	}
	cfg, err := c.amqpConfig(fs, *exchange)
	if err != nil {
		return err
	}
	ccfg := &consumer.Config{Group: *group, Partitions: *partitions}
	if *partitions == 0 {
		ccfg.Partitions = -1 // the flag's 0: one unpartitioned queue
	}
	if *classic {
		ccfg.QueueType = rabbitmq.Classic
	}
	if err := consumer.Declare(ctx, cfg, ccfg, types...); err != nil {
		return err
	}
	if *partitions == 0 {
		fmt.Fprintf(c.stdout, "declared queue %s on %s for %s\n", *group, cfg.Exchange, strings.Join(types, ", "))
		return nil
	}
	fmt.Fprintf(c.stdout, "declared %d partition queues of %s on %s for %s\n", *partitions, *group, cfg.Exchange, strings.Join(types, ", "))
	return nil
}
