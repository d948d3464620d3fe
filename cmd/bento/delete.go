package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/rabbitmq"
)

// consumerDelete runs "bento consumer delete", the counterpart of
// "bento consumer declare" for tests and tutorials: it deletes a group's
// queues (its queue, its partition queues with their hash exchange, its
// dead-letter queue) with their messages and, with --topology, the
// exchange's own topology (consumer.Delete). It refuses while the group
// has dead letters, unless --force. On the database bus (--bus) it deletes
// the group's queues there instead (consumer.DeleteDatabase).
func (c *cli) consumerDelete(ctx context.Context, args []string) error {
	fs := c.newFlags("consumer delete", "(--group G|--topology) [--group G] [--topology] [--bus B] [--exchange E] [--dry-run] [--force] [--yes]")
	group := fs.String("group", "", "the consumer group whose queues to delete")
	topology := fs.Bool("topology", false, "also the exchange, its alternate and dead-letter exchanges and their unroutable queues (once no group uses them)")
	exchange := fs.String("exchange", rabbitmq.DefaultExchange, "the event exchange (or BENTO_EXCHANGE)")
	bus := addBusFlag(fs)
	dry := fs.Bool("dry-run", false, "say what would be deleted and delete nothing")
	force := fs.Bool("force", false, "also when the group's dead-letter queue holds dead letters (they are lost)")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *group == "" && !*topology {
		return usagef("say what to delete: --group G, --topology, or both")
	}
	resolved, err := c.resolveBus(*bus)
	if err != nil {
		return err
	}
	if resolved == busDatabase {
		if *topology {
			return usagef("--topology is RabbitMQ's: the database bus has no exchange (purge its unroutable messages with bento unroutable purge --bus database)")
		}
		return c.consumerDeleteDatabase(ctx, *group, &consumer.DeleteOpts{Force: *force}, *dry, *yes)
	}
	cfg, err := c.amqpConfig(fs, *exchange)
	if err != nil {
		return err
	}
	opts := &consumer.DeleteOpts{DryRun: true, Force: *force, Topology: *topology}
	found, err := consumer.Delete(ctx, cfg, *group, opts)
	if errors.Is(err, consumer.ErrDeadLettersLeft) {
		return fmt.Errorf("%w; see them with bento consumer dead list --group %s, or delete them too with --force", err, *group)
	}
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
	opts.DryRun = false
	done, err := consumer.Delete(ctx, cfg, *group, opts)
	if err != nil {
		return fmt.Errorf("delete: %w (deleted before the error: %s)", err, describeDeleted(done))
	}
	fmt.Fprintf(c.stdout, "deleted %s\n", describeDeleted(done))
	return nil
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
