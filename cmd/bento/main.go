// Command bento operates bento's tables: it applies or prints the
// migrations, shows the outbox backlog, inspects, requeues and discards dead
// letters, lists and cancels scheduled messages, lists and abandons
// process managers' processes, purges what retention allows, and serves
// the web console.
//
// It reads the database from DATABASE_URL: postgres://... (or a libpq
// keyword/value string) for PostgreSQL, sqlite:PATH for an embedded SQLite
// file. The consumer and unroutable commands read the RabbitMQ broker from
// AMQP_URL and use the exchange of --exchange (or BENTO_EXCHANGE; default
// bento.events). The consumer dead and unroutable list|replay commands,
// and the console's consumer and unroutable pages, use the database bus in
// DATABASE_URL instead when AMQP_URL is not set, or with --bus database.
//
// The commands (bento -h lists them; bento COMMAND -h gives each one's
// flags; docs/cli.md describes them with sample output):
//
//	bento migrate up|status|sql
//	bento stats
//	bento dead list|show|requeue|discard
//	bento scheduled list|cancel
//	bento process list|abandon|purge --table T
//	bento purge --sent-older-than AGE
//	bento inbox purge --older-than AGE
//	bento idempotency purge
//	bento maintain
//	bento console
//	bento consumer dead list|show|replay|discard --group G
//	bento consumer declare|delete
//	bento unroutable list|replay
//
// Every command that deletes or changes rows or queues says what it would
// do with --dry-run and changes nothing; without --yes it asks for
// confirmation on standard input first.
//
// Exit codes: 0 success, or the usage asked for with -h; 1 the operation
// failed, or was declined at the confirmation prompt; 2 the command could
// not start: bad arguments, or DATABASE_URL missing, malformed or
// unreachable.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// usageError is a mistake in how bento was called (exit 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// usagef returns a usageError.
func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errDeclined is returned when the operator does not confirm (exit 1).
var errDeclined = errors.New("not confirmed: nothing changed")

// errHelp is returned after printing help that was asked for (exit 0).
var errHelp = errors.New("help")

// cli holds the process's streams and environment, so tests can run
// commands in-process as well as through the built binary.
type cli struct {
	stdin  *bufio.Reader
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// command is one thing bento does.
type command struct {
	// name is the command's words after "bento": "stats", "dead list".
	name string
	// summary says what it does, for the usage.
	summary string
	// run runs it with the arguments after its words.
	run func(c *cli, ctx context.Context, args []string) error
}

// commands lists every command, in the order the usage shows them. It is
// the one list of what bento runs: run dispatches from it, the usage of
// bento and of each group of commands ("bento dead -h") is made from it,
// and the golden tests check that docs/cli.md has each one's usage.
var commands = []command{
	{"migrate", "apply (up), list (status) or print (sql) the migrations", (*cli).migrate},
	{"stats", "outbox backlog per tenant and status", (*cli).stats},
	{"dead list", "list dead events", (*cli).deadList},
	{"dead show", "show one dead event with its payload", (*cli).deadShow},
	{"dead requeue", "send dead events again", deadAct("requeue")},
	{"dead discard", "delete dead events for good", deadAct("discard")},
	{"scheduled list", "list the scheduled messages still waiting, first due first", (*cli).scheduledList},
	{"scheduled cancel", "cancel the scheduled messages of a key before they are due", (*cli).scheduledCancel},
	{"process list", "list the processes of a process manager's state table", (*cli).processList},
	{"process abandon", "complete a stuck process without a step, cancelling its timeouts", (*cli).processAbandon},
	{"process purge", "delete the processes of a state table that completed long ago", (*cli).processPurge},
	{"purge", "delete sent outbox rows past retention", (*cli).purge},
	{"inbox purge", "delete inbox records past the dedup window", (*cli).inboxPurge},
	{"idempotency purge", "delete expired idempotency keys", (*cli).idempotencyPurge},
	{"maintain", "create, seal and drop partitions of partitioned tables", (*cli).maintain},
	{"console", "serve the web console", (*cli).console},
	{"consumer dead list", "list a consumer group's dead letters", (*cli).consumerDeadList},
	{"consumer dead show", "show one of a group's dead letters", (*cli).consumerDeadShow},
	{"consumer dead replay", "send a group's dead letters back to it", consumerDeadAct("replay")},
	{"consumer dead discard", "delete a group's dead letters for good", consumerDeadAct("discard")},
	{"consumer parked list", "list the events a group parked behind a dead letter or a gap", (*cli).consumerParkedList},
	{"consumer parked show", "show one aggregate's parked events and its hold", (*cli).consumerParkedShow},
	{"consumer parked release", "give up what holds an aggregate back, so its parked events flow", (*cli).consumerParkedRelease},
	{"consumer members", "a group's live instances and the partitions each owns", (*cli).consumerMembers},
	{"consumer declare", "declare a group's queues before it is deployed", (*cli).consumerDeclare},
	{"consumer delete", "delete a group's queues (and the exchange's, --topology)", (*cli).consumerDelete},
	{"unroutable list", "list the events no queue was bound for", unroutableVerb("list")},
	{"unroutable replay", "publish the unroutable events again, once their queues exist", unroutableVerb("replay")},
	{"unroutable purge", "delete the database bus's unroutable events, older than an age or all", (*cli).unroutablePurge},
}

// deadAct, consumerDeadAct and unroutableVerb bind the verb of the
// commands that share one implementation.
func deadAct(verb string) func(c *cli, ctx context.Context, args []string) error {
	return func(c *cli, ctx context.Context, args []string) error { return c.deadAct(ctx, verb, args) }
}

func consumerDeadAct(verb string) func(c *cli, ctx context.Context, args []string) error {
	return func(c *cli, ctx context.Context, args []string) error { return c.consumerDeadAct(ctx, verb, args) }
}

func unroutableVerb(verb string) func(c *cli, ctx context.Context, args []string) error {
	return func(c *cli, ctx context.Context, args []string) error {
		return c.unroutable(ctx, append([]string{verb}, args...))
	}
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// lookup finds the command named by the leading words of args and returns
// it with the arguments after its words. With none, it returns the words
// that name a group of commands ("dead", "consumer dead"; none for the top
// level) and the rest of args.
func lookup(args []string) (cmd *command, group, rest []string) {
	for i := range commands {
		words := strings.Fields(commands[i].name)
		if len(args) >= len(words) && slices.Equal(args[:len(words)], words) {
			return &commands[i], nil, args[len(words):]
		}
	}
	for n := len(args); n > 0; n-- {
		if len(subcommands(args[:n])) > 0 {
			return nil, args[:n], args[n:]
		}
	}
	return nil, nil, args
}

// subcommands returns the commands under the group of words.
func subcommands(group []string) []command {
	var out []command
	for _, c := range commands {
		words := strings.Fields(c.name)
		if len(words) > len(group) && slices.Equal(words[:len(group)], group) {
			out = append(out, c)
		}
	}
	return out
}

// usage returns the usage of the group of words: the commands under it.
func usage(group []string) string {
	var b strings.Builder
	name := strings.Join(append([]string{"bento"}, group...), " ")
	fmt.Fprintf(&b, "usage: %s <command> [arguments]\n\nCommands:\n", name)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, c := range subcommands(group) {
		fmt.Fprintf(tw, "  %s\t%s\n", strings.Join(strings.Fields(c.name)[len(group):], " "), c.summary)
	}
	_ = tw.Flush()
	if len(group) == 0 {
		b.WriteString(`
DATABASE_URL selects the database: postgres://... or sqlite:PATH.
The consumer and unroutable commands read the broker from AMQP_URL;
consumer dead and unroutable use the database bus without it (--bus).
Run 'bento <command> -h' for a command's flags.
Exit codes: 0 ok (-h too), 1 failed or not confirmed, 2 bad arguments or DATABASE_URL.
`)
	} else {
		fmt.Fprintf(&b, "\nRun '%s <command> -h' for a command's flags.\n", name)
	}
	return b.String()
}

// run runs one command and returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	c := &cli{stdin: bufio.NewReader(stdin), stdout: stdout, stderr: stderr, getenv: getenv}
	cmd, group, rest := lookup(args)
	if cmd == nil {
		switch {
		case len(rest) > 0 && isHelp(rest[0]):
			fmt.Fprint(stdout, usage(group))
			return exitOK
		case len(rest) == 0:
			fmt.Fprint(stderr, usage(group))
			return exitUsage
		default:
			fmt.Fprintf(stderr, "%s: unknown command %q\n\n%s", strings.Join(append([]string{"bento"}, group...), " "),
				rest[0], usage(group))
			return exitUsage
		}
	}
	err := cmd.run(c, ctx, rest)
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "bento %s: %s\n", cmd.name, ue.msg)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "bento %s: %v\n", cmd.name, err)
		return exitFailure
	}
}

// confirm asks question on stderr and reads the answer from stdin; only "y"
// or "yes" confirms. yes skips the question.
func (c *cli) confirm(yes bool, question string) error {
	if yes {
		return nil
	}
	fmt.Fprintf(c.stderr, "%s [y/N] ", question)
	line, err := c.stdin.ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read confirmation: %w", err)
	}
	switch trimLower(line) {
	case "y", "yes":
		return nil
	}
	if errors.Is(err, io.EOF) && line == "" {
		fmt.Fprintln(c.stderr)
		return fmt.Errorf("%w (no answer on standard input; pass --yes to skip the question)", errDeclined)
	}
	return errDeclined
}

// flushListing writes out a listing of shown rows and, when a --limit of
// limit cut it, says so.
func (c *cli) flushListing(tw *tabwriter.Writer, shown, limit int) error {
	if err := tw.Flush(); err != nil {
		return err
	}
	if shown == limit {
		fmt.Fprintf(c.stdout, "(first %d; raise --limit or narrow the filter for more)\n", limit)
	}
	return nil
}
