package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/rabbitmq"
)

// deadLetterFlags are the flags that select a group's dead letters.
type deadLetterFlags struct {
	group, exchange, bus, eventType, aggregate, cause *string
	olderThan                                         *ageFlag
}

func addDeadLetterFlags(fs *flag.FlagSet) deadLetterFlags {
	f := deadLetterFlags{
		group:     fs.String("group", "", "the consumer group (required)"),
		exchange:  fs.String("exchange", rabbitmq.DefaultExchange, "the group's event exchange (or BENTO_EXCHANGE); a replay reaches only the group"),
		bus:       addBusFlag(fs),
		eventType: fs.String("event-type", "", "only this event type"),
		aggregate: fs.String("aggregate", "", "only this aggregate: TYPE or TYPE/ID"),
		cause:     fs.String("cause", "", "only this cause: decode, permanent, failed, gap or poison"),
		olderThan: &ageFlag{},
	}
	fs.Var(f.olderThan, "older-than", "only dead letters given up `AGE` ago or earlier (30m, 2h, 7d)")
	return f
}

// deadLetterTarget returns the dead letters of the bus the flags choose,
// with the function that closes what it opened, and the filter the flags
// say.
func (c *cli) deadLetterTarget(ctx context.Context, fs *flag.FlagSet, f deadLetterFlags, ids []string) (*consumer.DeadLetters, func(), consumer.DeadFilter, error) {
	out := consumer.DeadFilter{IDs: ids, EventType: *f.eventType, Cause: *f.cause, OlderThan: f.olderThan.d}
	if *f.group == "" {
		return nil, nil, out, usagef("--group is required")
	}
	var err error
	if out.AggregateType, out.AggregateID, err = parseAggregate(*f.aggregate); err != nil {
		return nil, nil, out, err
	}
	dead, done, err := c.deadLetters(ctx, fs, *f.bus, *f.exchange)
	return dead, done, out, err
}

// describeDead says in words which dead letters f selects.
func describeDead(group string, f consumer.DeadFilter) things {
	var parts []string
	if len(f.IDs) > 0 {
		parts = append(parts, describeIDs(f.IDs))
	}
	if f.EventType != "" {
		parts = append(parts, "event type "+f.EventType)
	}
	if f.AggregateType != "" {
		parts = append(parts, describeAggregate(f.AggregateType, f.AggregateID))
	}
	if f.Cause != "" {
		parts = append(parts, "cause "+f.Cause)
	}
	if f.OlderThan > 0 {
		parts = append(parts, "given up more than "+humanAge(f.OlderThan)+" ago")
	}
	what := things{noun: "dead letter", qualifier: " of " + group}
	if len(parts) > 0 {
		what.qualifier += " with " + strings.Join(parts, " and ")
	}
	return what
}

func (c *cli) consumerDeadList(ctx context.Context, args []string) error {
	fs := c.newFlags("consumer dead list", "--group G [--bus B] [--event-type T] [--aggregate TYPE[/ID]] [--cause C] [--older-than D] [--limit N] [--json]")
	ff := addDeadLetterFlags(fs)
	readLimit := addLimit(fs, "at most this many")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	limit, err := readLimit()
	if err != nil {
		return err
	}
	dl, done, f, err := c.deadLetterTarget(ctx, fs, ff, nil)
	if err != nil {
		return err
	}
	defer done()
	dead, err := dl.List(ctx, *ff.group, f, limit)
	if err != nil {
		return err
	}
	if *asJSON {
		return c.printJSON(deadLettersJSON(dead, false))
	}
	if len(dead) == 0 {
		fmt.Fprintln(c.stdout, describeDead(*ff.group, f).n(0))
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tEVENT TYPE\tAGGREGATE\tCAUSE\tATTEMPTS\tDEAD AT\tREPLAYS\tERROR")
	for _, d := range dead {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\n", d.MessageID, d.EventType, deadAggregate(d), orDash(d.Cause),
			d.Attempts, timeOrDashValue(d.DeadAt), d.Replays, oneLine(d.Error, 60))
	}
	return c.flushListing(tw, len(dead), limit)
}

func (c *cli) consumerDeadShow(ctx context.Context, args []string) error {
	fs := c.newFlags("consumer dead show", "ID --group G [--bus B] [--show-payload] [--json]")
	ff := addDeadLetterFlags(fs)
	payload := fs.Bool("show-payload", false, "print the payload and the headers (they may hold personal data)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want exactly one message id")
	}
	dl, done, f, err := c.deadLetterTarget(ctx, fs, ff, pos)
	if err != nil {
		return err
	}
	defer done()
	dead, err := dl.List(ctx, *ff.group, f, 1)
	if err != nil {
		return err
	}
	if len(dead) == 0 {
		return fmt.Errorf("no dead letter %s in %s", pos[0], consumer.DeadLetterQueue(*ff.group))
	}
	d := dead[0]
	if *asJSON {
		return c.printJSON(deadLettersJSON(dead, *payload)[0])
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	for _, kv := range [][2]string{
		{"id", d.MessageID}, {"group", *ff.group}, {"event type", d.EventType}, {"tenant", d.TenantID},
		{"aggregate", deadAggregate(d)}, {"version", fmt.Sprint(d.AggregateVersion)}, {"cause", orDash(d.Cause)},
		{"attempts", fmt.Sprint(d.Attempts)}, {"dead at", timeOrDashValue(d.DeadAt)}, {"replays", fmt.Sprint(d.Replays)},
		{"error", d.Error},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if *payload {
		md, _ := json.Marshal(d.Metadata)
		fmt.Fprintf(c.stdout, "headers: %s\npayload: %s\n", md, d.Payload)
	} else {
		fmt.Fprintln(c.stdout, "payload: hidden (--show-payload shows it and the headers)")
	}
	return nil
}

// consumerDeadAct replays or discards dead letters.
func (c *cli) consumerDeadAct(ctx context.Context, verb string, args []string) error {
	fs := c.newFlags("consumer dead "+verb, "(ID...|--event-type T|--aggregate TYPE[/ID]|--cause C|--older-than D|--all) --group G [--bus B] [--dry-run] [--yes]")
	ff := addDeadLetterFlags(fs)
	all := fs.Bool("all", false, "every dead letter of the group")
	dry := fs.Bool("dry-run", false, "say what would change and change nothing")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	ids, err := parse(fs, args)
	if err != nil {
		return err
	}
	dl, closeBus, f, err := c.deadLetterTarget(ctx, fs, ff, ids)
	if err != nil {
		return err
	}
	defer closeBus()
	narrowed := len(ids) > 0 || f.EventType != "" || f.AggregateType != "" || f.Cause != "" || f.OlderThan > 0
	if !narrowed && !*all {
		return usagef("say which dead letters to %s: ids, --event-type, --aggregate, --cause, --older-than or --all", verb)
	}
	if narrowed && *all {
		return usagef("--all does not go with ids or filters")
	}
	what := describeDead(*ff.group, f)
	dead, err := dl.List(ctx, *ff.group, f, 100_000)
	if err != nil {
		return err
	}
	if len(dead) == 0 {
		fmt.Fprintf(c.stdout, "%s: nothing to %s\n", what.n(0), verb)
		return nil
	}
	if *dry {
		fmt.Fprintf(c.stdout, "would %s %s (dry run: nothing changed)\n", verb, what.n(int64(len(dead))))
		return nil
	}
	question := fmt.Sprintf("replay %s? They go back to this group only (its inbox skips what it applied).", what.n(int64(len(dead))))
	if verb == "discard" {
		question = fmt.Sprintf("discard %s? They are deleted for good.", what.n(int64(len(dead))))
	}
	if err := c.confirm(*yes, question); err != nil {
		return err
	}
	var done []consumer.DeadLetter
	if verb == "replay" {
		done, err = dl.Replay(ctx, *ff.group, f)
	} else {
		done, err = dl.Discard(ctx, *ff.group, f)
	}
	if err != nil {
		return fmt.Errorf("%s: %w (%d done before the error)", verb, err, len(done))
	}
	past := map[string]string{"replay": "replayed", "discard": "discarded"}[verb]
	fmt.Fprintf(c.stdout, "%s %s\n", past, what.n(int64(len(done))))
	return nil
}

// deadLetterRow is the JSON form of a consumer dead letter.
type deadLetterRow struct {
	ID               string            `json:"id"`
	EventType        string            `json:"event_type"`
	Tenant           string            `json:"tenant,omitempty"`
	AggregateType    string            `json:"aggregate_type,omitempty"`
	AggregateID      string            `json:"aggregate_id,omitempty"`
	AggregateVersion int64             `json:"aggregate_version,omitempty"`
	Cause            string            `json:"cause,omitempty"`
	Error            string            `json:"error,omitempty"`
	Attempts         int               `json:"attempts"`
	DeadAt           *time.Time        `json:"dead_at,omitempty"`
	Replays          int               `json:"replays"`
	Headers          map[string]string `json:"headers,omitempty"`
	Payload          json.RawMessage   `json:"payload,omitempty"`
}

func deadLettersJSON(dead []consumer.DeadLetter, payload bool) []deadLetterRow {
	out := make([]deadLetterRow, 0, len(dead))
	for _, d := range dead {
		r := deadLetterRow{ID: d.MessageID, EventType: d.EventType, Tenant: d.TenantID, AggregateType: d.AggregateType,
			AggregateID: d.AggregateID, AggregateVersion: d.AggregateVersion, Cause: d.Cause, Error: d.Error,
			Attempts: d.Attempts, Replays: d.Replays}
		if !d.DeadAt.IsZero() {
			at := d.DeadAt.UTC()
			r.DeadAt = &at
		}
		if payload {
			r.Headers = d.Metadata
			if json.Valid(d.Payload) {
				r.Payload = d.Payload
			} else {
				r.Payload, _ = json.Marshal(string(d.Payload))
			}
		}
		out = append(out, r)
	}
	return out
}

func deadAggregate(d consumer.DeadLetter) string {
	if d.AggregateType == "" && d.AggregateID == "" {
		return "-"
	}
	return d.AggregateType + "/" + d.AggregateID
}

// orDash returns s, or "-" for an empty s.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// timeOrDashValue formats t in RFC 3339 UTC, or "-" for the zero time.
func timeOrDashValue(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
