package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/outbox"
)

// filterFlags are the flags that select dead rows.
type filterFlags struct {
	tenant, topic, aggregate *string
}

func addFilterFlags(fs *flag.FlagSet) filterFlags {
	return filterFlags{
		tenant:    fs.String("tenant", "", "only this tenant"),
		topic:     fs.String("topic", "", "only this topic (exact)"),
		aggregate: fs.String("aggregate", "", "only this aggregate: TYPE or TYPE/ID"),
	}
}

// filter builds the outbox filter from the flags and the ids.
func (f filterFlags) filter(ids []string) (outbox.Filter, error) {
	out := outbox.Filter{IDs: ids, Tenant: *f.tenant, Topic: *f.topic}
	var err error
	out.AggregateType, out.AggregateID, err = parseAggregate(*f.aggregate)
	return out, err
}

// describe says in words which rows f selects.
func describe(f outbox.Filter) things {
	var parts []string
	if len(f.IDs) > 0 {
		parts = append(parts, describeIDs(f.IDs))
	}
	if f.Tenant != "" {
		parts = append(parts, "tenant "+f.Tenant)
	}
	if f.Topic != "" {
		parts = append(parts, "topic "+f.Topic)
	}
	if f.AggregateType != "" {
		parts = append(parts, describeAggregate(f.AggregateType, f.AggregateID))
	}
	what := things{noun: "dead event"}
	if len(parts) > 0 {
		what.qualifier = " with " + strings.Join(parts, " and ")
	}
	return what
}

func (c *cli) deadList(ctx context.Context, args []string) error {
	fs := c.newFlags("dead list", "[--tenant T] [--topic T] [--aggregate TYPE[/ID]] [--limit N] [--json]")
	ff := addFilterFlags(fs)
	readLimit := addLimit(fs, "at most this many rows")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	limit, err := readLimit()
	if err != nil {
		return err
	}
	f, err := ff.filter(nil)
	if err != nil {
		return err
	}
	st, done, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer done()
	rows, err := st.ListDead(ctx, f, limit)
	if err != nil {
		return err
	}
	if *asJSON {
		return c.printJSON(deadJSON(rows, false))
	}
	if len(rows) == 0 {
		fmt.Fprintln(c.stdout, describe(f).n(0))
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTENANT\tTOPIC\tAGGREGATE\tATTEMPTS\tFAILED AT\tLAST ERROR")
	for _, m := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", m.ID, m.TenantID, m.Topic, aggregateOf(&m), m.Attempts,
			timeOrDash(m.FailedAt), oneLine(deref(m.LastError), 60))
	}
	return c.flushListing(tw, len(rows), limit)
}

func (c *cli) deadShow(ctx context.Context, args []string) error {
	fs := c.newFlags("dead show", "ID [--json]")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want exactly one event id")
	}
	st, done, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer done()
	m, err := st.Get(ctx, pos[0])
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return fmt.Errorf("no outbox event %s", pos[0])
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return c.printJSON(deadJSON([]outbox.Message{*m}, true)[0])
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	for _, kv := range [][2]string{
		{"id", m.ID}, {"status", string(m.Status)}, {"tenant", m.TenantID}, {"topic", m.Topic},
		{"aggregate", aggregateOf(m)}, {"version", fmt.Sprint(m.AggregateVersion)},
		{"schema version", fmt.Sprint(m.SchemaVersion)}, {"attempts", fmt.Sprint(m.Attempts)},
		{"occurred at", m.OccurredAt.UTC().Format(time.RFC3339Nano)},
		{"created at", m.CreatedAt.UTC().Format(time.RFC3339Nano)},
		{"failed at", timeOrDash(m.FailedAt)}, {"last error", deref(m.LastError)},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	md, _ := json.Marshal(m.Metadata)
	fmt.Fprintf(c.stdout, "metadata: %s\npayload: %s\n", md, []byte(m.Payload))
	return nil
}

// deadAct requeues or discards dead rows.
func (c *cli) deadAct(ctx context.Context, verb string, args []string) error {
	fs := c.newFlags("dead "+verb, "(ID...|--topic T|--aggregate TYPE[/ID]|--all) [--tenant T] [--dry-run] [--yes]")
	ff := addFilterFlags(fs)
	all := fs.Bool("all", false, "every dead event (with --tenant: every one of that tenant)")
	dry := fs.Bool("dry-run", false, "say what would change and change nothing")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	ids, err := parse(fs, args)
	if err != nil {
		return err
	}
	f, err := ff.filter(ids)
	if err != nil {
		return err
	}
	if len(ids) == 0 && f.Topic == "" && f.AggregateType == "" && !*all {
		return usagef("say which dead events to %s: ids, --topic, --aggregate or --all", verb)
	}
	if *all && (len(ids) > 0 || f.Topic != "" || f.AggregateType != "") {
		return usagef("--all does not go with ids, --topic or --aggregate")
	}
	st, done, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer done()
	n, err := st.CountDead(ctx, f)
	if err != nil {
		return err
	}
	what := describe(f)
	if n == 0 {
		fmt.Fprintf(c.stdout, "%s: nothing to %s\n", what.n(0), verb)
		return nil
	}
	if *dry {
		fmt.Fprintf(c.stdout, "would %s %s (dry run: nothing changed)\n", verb, what.n(n))
		return nil
	}
	question := fmt.Sprintf("%s %s?", verb, what.n(n))
	if verb == "discard" {
		question = fmt.Sprintf("discard %s? They are deleted for good.", what.n(n))
	}
	if err := c.confirm(*yes, question); err != nil {
		return err
	}
	var moved int64
	if verb == "requeue" {
		moved, err = st.Requeue(ctx, f, *all)
	} else {
		moved, err = st.Discard(ctx, f, *all)
	}
	if err != nil {
		return err
	}
	past := map[string]string{"requeue": "requeued", "discard": "discarded"}[verb]
	fmt.Fprintf(c.stdout, "%s %s\n", past, what.n(moved))
	return nil
}

// deadRow is the JSON form of a dead row.
type deadRow struct {
	ID               string          `json:"id"`
	Status           outbox.Status   `json:"status"`
	Tenant           string          `json:"tenant"`
	Topic            string          `json:"topic"`
	AggregateType    string          `json:"aggregate_type,omitempty"`
	AggregateID      string          `json:"aggregate_id,omitempty"`
	AggregateVersion int64           `json:"aggregate_version,omitempty"`
	Attempts         int             `json:"attempts"`
	OccurredAt       time.Time       `json:"occurred_at"`
	FailedAt         *time.Time      `json:"failed_at,omitempty"`
	LastError        string          `json:"last_error,omitempty"`
	Metadata         outbox.Metadata `json:"metadata,omitempty"`
	Payload          json.RawMessage `json:"payload,omitempty"`
}

// deadJSON converts rows; full adds the metadata and payload.
func deadJSON(rows []outbox.Message, full bool) []deadRow {
	out := make([]deadRow, 0, len(rows))
	for _, m := range rows {
		r := deadRow{
			ID: m.ID, Status: m.Status, Tenant: m.TenantID, Topic: m.Topic,
			AggregateType: m.AggregateType, AggregateID: m.AggregateID, AggregateVersion: m.AggregateVersion,
			Attempts: m.Attempts, OccurredAt: m.OccurredAt.UTC(), FailedAt: m.FailedAt, LastError: deref(m.LastError),
		}
		if full {
			r.Metadata, r.Payload = m.Metadata, json.RawMessage(m.Payload)
		}
		out = append(out, r)
	}
	return out
}

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func aggregateOf(m *outbox.Message) string {
	if m.AggregateType == "" && m.AggregateID == "" {
		return "-"
	}
	return fmt.Sprintf("%s/%s@%d", m.AggregateType, m.AggregateID, m.AggregateVersion)
}

// timeOrDash is timeOrDashValue for an optional time: "-" when nil.
func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return timeOrDashValue(*t)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// oneLine flattens s to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
