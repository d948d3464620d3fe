package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/rabbitmq"
)

// consumerDelete runs "bento consumer delete", the counterpart of
// "bento consumer declare" for tests and tutorials: it deletes a group's
// queues (its queue, its partition queues with their hash exchange, its
// dead-letter queue) with their messages and, with --topology, the
// exchange's own topology.
func (c *cli) consumerDelete(ctx context.Context, args []string) error {
	fs := c.newFlags("consumer delete", "(--group G|--topology) [--group G] [--topology] [--exchange E] [--dry-run] [--yes]")
	group := fs.String("group", "", "the consumer group whose queues to delete")
	topology := fs.Bool("topology", false, "also the exchange, its alternate and dead-letter exchanges and their unroutable queues (once no group uses them)")
	exchange := fs.String("exchange", rabbitmq.DefaultExchange, "the event exchange (or BENTO_EXCHANGE)")
	dry := fs.Bool("dry-run", false, "say what would be deleted and delete nothing")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *group == "" && !*topology {
		return usagef("say what to delete: --group G, --topology, or both")
	}
	cfg, err := c.amqpConfig(fs, *exchange)
	if err != nil {
		return err
	}
	found, err := deleteTopology(ctx, cfg, *group, *topology, &rabbitmq.DeleteOpts{DryRun: true})
	if err != nil {
		return err
	}
	if len(found.Queues)+len(found.Exchanges) == 0 {
		fmt.Fprintf(c.stdout, "nothing to delete on %s\n", cfg.Exchange)
		return nil
	}
	if *dry {
		fmt.Fprintf(c.stdout, "would delete %s (dry run: nothing changed)\n", describeDeleted(found))
		return nil
	}
	question := fmt.Sprintf("delete %s? They are gone for good, and a running consumer of them stops receiving.", describeDeleted(found))
	if err := c.confirm(*yes, question); err != nil {
		return err
	}
	done, err := deleteTopology(ctx, cfg, *group, *topology, nil)
	if err != nil {
		return fmt.Errorf("delete: %w (deleted before the error: %s)", err, describeDeleted(done))
	}
	fmt.Fprintf(c.stdout, "deleted %s\n", describeDeleted(done))
	return nil
}

// deleteTopology deletes what bento declares for group on cfg's exchange
// (none for an empty group) and, with topology, the exchange's topology and
// that of its dead letters. It returns what it deleted, up to an error.
func deleteTopology(ctx context.Context, cfg *rabbitmq.Config, group string, topology bool, opts *rabbitmq.DeleteOpts) (rabbitmq.Deleted, error) {
	var steps []func() (rabbitmq.Deleted, error)
	if group != "" {
		steps = append(steps,
			func() (rabbitmq.Deleted, error) { return rabbitmq.DeletePartitions(ctx, cfg, group, opts) },
			func() (rabbitmq.Deleted, error) {
				return rabbitmq.DeleteQueues(ctx, cfg, []string{group, consumer.DeadLetterQueue(group), consumer.DeadLetterTap(group)}, opts)
			})
	}
	if topology {
		dead := *cfg
		dead.Exchange = consumer.DeadLetterExchange(cfg.Exchange) // where consumer.NewAMQP sends dead letters
		steps = append(steps,
			func() (rabbitmq.Deleted, error) { return rabbitmq.DeleteTopology(ctx, cfg, opts) },
			func() (rabbitmq.Deleted, error) { return rabbitmq.DeleteTopology(ctx, &dead, opts) })
	}
	var all rabbitmq.Deleted
	for _, step := range steps {
		d, err := step()
		all.Queues = append(all.Queues, d.Queues...)
		all.Messages += d.Messages
		all.Exchanges = append(all.Exchanges, d.Exchanges...)
		if err != nil {
			return all, err
		}
	}
	return all, nil
}

// describeDeleted says in words what d holds.
func describeDeleted(d rabbitmq.Deleted) string {
	var parts []string
	if len(d.Queues) > 0 {
		parts = append(parts, fmt.Sprintf("%d queue(s) with %d message(s): %s", len(d.Queues), d.Messages, strings.Join(d.Queues, ", ")))
	}
	if len(d.Exchanges) > 0 {
		parts = append(parts, fmt.Sprintf("%d exchange(s): %s", len(d.Exchanges), strings.Join(d.Exchanges, ", ")))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, "; ")
}
