// Command bento operates bento's tables: it applies or prints the
// migrations, shows the outbox backlog, inspects, requeues and discards dead
// letters, purges what retention allows, and serves the web console.
//
// It reads the database from DATABASE_URL: postgres://... (or a libpq
// keyword/value string) for PostgreSQL, sqlite:PATH for an embedded SQLite
// file.
//
//	bento migrate up [--partition daily|monthly] | status | sql
//	bento stats [--tenant T] [--json]
//	bento dead list [--tenant T] [--topic T] [--aggregate TYPE[/ID]] [--limit N] [--json]
//	bento dead show ID [--json]
//	bento dead requeue (ID...|--topic T|--aggregate TYPE[/ID]|--all) [--tenant T] [--dry-run] [--yes]
//	bento dead discard (ID...|--topic T|--aggregate TYPE[/ID]|--all) [--tenant T] [--dry-run] [--yes]
//	bento purge --sent-older-than 7d [--tenant T] [--dry-run] [--yes]
//	bento inbox purge --older-than 30d [--consumer C] [--dry-run] [--yes]
//	bento idempotency purge [--dry-run] [--yes]
//	bento maintain [--outbox-retention 7d] [--inbox-retention 30d] [--dry-run] [--yes]
//	bento console [--addr 127.0.0.1:8081] [--host NAME]... [--read-only] [--show-payloads]
//	bento consumer dead list --group G [--event-type T] [--aggregate TYPE[/ID]] [--cause C] [--older-than D] [--json]
//	bento consumer dead show ID --group G [--show-payload] [--json]
//	bento consumer dead replay|discard (ID...|filters|--all) --group G [--dry-run] [--yes]
//	bento consumer parked list --group G [--tenant T] [--aggregate TYPE[/ID]] [--reason R] [--limit N] [--json]
//	bento consumer parked show --group G --aggregate TYPE/ID [--tenant T] [--json]
//	bento consumer parked release MESSAGE_ID --group G --aggregate TYPE/ID [--tenant T] --versions V [--yes]
//	bento consumer members --group G [--takeover-time D] [--json]
//	bento consumer declare --group G --event-type T... [--partitions N] [--classic]
//	bento consumer delete (--group G|--topology) [--dry-run] [--yes]
//	bento unroutable list [--event-type T]... [--limit N]
//	bento unroutable replay [--event-type T]... [--dry-run] [--yes]
//
// The consumer and unroutable commands read the RabbitMQ broker from
// AMQP_URL and use the exchange of --exchange (or BENTO_EXCHANGE; default
// bento.events).
//
// Every command that deletes or changes rows or queues says what it would
// do with --dry-run and changes nothing; without --yes it asks for
// confirmation on standard input first.
//
// Exit codes: 0 success; 1 the operation failed, or was declined at the
// confirmation prompt; 2 the command could not start: bad arguments, or
// DATABASE_URL missing, malformed or unreachable.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
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

// commands maps each top-level command to its implementation.
var commands = map[string]func(c *cli, ctx context.Context, args []string) error{
	"migrate":     (*cli).migrate,
	"stats":       (*cli).stats,
	"dead":        (*cli).dead,
	"purge":       (*cli).purge,
	"inbox":       (*cli).inbox,
	"idempotency": (*cli).idempotency,
	"console":     (*cli).console,
	"maintain":    (*cli).maintain,
	"consumer":    (*cli).consumerCmd,
	"unroutable":  (*cli).unroutable,
}

const usage = `usage: bento <command> [arguments]

Commands:
  migrate up|status|sql     apply, list or print the migrations
  stats                     outbox backlog per tenant and status
  dead list|show|requeue|discard
                            inspect and act on dead letters
  consumer dead list|show|replay|discard
                            a consumer group's dead letters on RabbitMQ (AMQP_URL)
  consumer parked list|show|release
                            events a consumer group parked behind a dead letter or a gap
  consumer members          a partitioned group's live instances and their partitions
  consumer declare          declare a group's queues before it is deployed
  consumer delete           delete a group's queues (and the exchange's, --topology)
  unroutable list|replay    events no queue was bound for, parked by RabbitMQ
  purge                     delete sent outbox rows past retention
  inbox purge               delete inbox records past the dedup window
  idempotency purge         delete expired idempotency keys
  maintain                  create and drop partitions of partitioned tables
  console                   serve the web console

DATABASE_URL selects the database: postgres://... or sqlite:PATH.
Run 'bento <command> -h' for a command's flags.
Exit codes: 0 ok, 1 failed or not confirmed, 2 bad arguments or DATABASE_URL.
`

// run runs one command and returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	c := &cli{stdin: bufio.NewReader(stdin), stdout: stdout, stderr: stderr, getenv: getenv}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	name := args[0]
	if name == "help" || name == "-h" || name == "--help" || name == "-help" {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "bento: unknown command %q\n\n%s", name, usage)
		return exitUsage
	}
	err := cmd(c, ctx, args[1:])
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "bento %s: %s\n", name, ue.msg)
		return exitUsage
	case errors.Is(err, errDeclined):
		fmt.Fprintf(stderr, "bento %s: %v\n", name, err)
		return exitFailure
	default:
		fmt.Fprintf(stderr, "bento %s: %v\n", name, err)
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
