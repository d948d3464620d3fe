package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/inbox"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/tenant"
)

// inspect opens the database and returns an Inspector of group, and the
// function that closes the database.
func (c *cli) inspect(ctx context.Context, group string, opts *consumer.InspectOpts) (*consumer.Inspector, func(), error) {
	if group == "" {
		return nil, nil, usagef("--group is required")
	}
	db, err := c.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	insp, err := consumer.Inspect(db, group, opts)
	if err != nil {
		closeAll(db)
		if errors.Is(err, inbox.ErrNotMigrated) {
			return nil, nil, errors.New("the inbox tables do not exist here: run bento migrate up")
		}
		return nil, nil, usagef("%v", err)
	}
	return insp, func() { closeAll(db) }, nil
}

// parkedFlags are the flags that select a group's parked events.
type parkedFlags struct {
	group, tenant, aggregate *string
}

func addParkedFlags(fs *flag.FlagSet) parkedFlags {
	return parkedFlags{
		group:     fs.String("group", "", "the consumer group (required)"),
		tenant:    fs.String("tenant", "", "only this tenant (show and release: default when unset)"),
		aggregate: fs.String("aggregate", "", "list: only this aggregate, TYPE or TYPE/ID; show and release: the aggregate, TYPE/ID (required)"),
	}
}

// filter returns the filter of the flags and reason.
func (f parkedFlags) filter(reason string) (inbox.ParkedFilter, error) {
	typ, id, err := parseAggregate(*f.aggregate)
	if err != nil {
		return inbox.ParkedFilter{}, err
	}
	switch reason {
	case "", inbox.ParkedHeld, inbox.ParkedWaiting, inbox.ParkedGap:
	default:
		return inbox.ParkedFilter{}, usagef("bad --reason %q: want held, waiting or gap", reason)
	}
	return inbox.ParkedFilter{TenantID: *f.tenant, AggregateType: typ, AggregateID: id, Reason: reason}, nil
}

// one returns the one aggregate the flags name, TYPE/ID of --tenant
// (the default tenant when unset).
func (f parkedFlags) one() (inbox.Aggregate, error) {
	typ, id, err := parseAggregate(*f.aggregate)
	if err != nil {
		return inbox.Aggregate{}, err
	}
	if typ == "" || id == "" {
		return inbox.Aggregate{}, usagef("--aggregate TYPE/ID is required")
	}
	t := *f.tenant
	if t == "" {
		t = tenant.Default
	}
	return inbox.Aggregate{TenantID: t, Type: typ, ID: id}, nil
}

// describeParked says in words which parked events f selects.
func describeParked(group string, f inbox.ParkedFilter) string {
	var parts []string
	if f.TenantID != "" {
		parts = append(parts, "tenant "+f.TenantID)
	}
	if f.AggregateType != "" {
		parts = append(parts, describeAggregate(f.AggregateType, f.AggregateID))
	}
	if f.Reason != "" {
		parts = append(parts, "reason "+f.Reason)
	}
	what := "parked events or holds in " + group
	if len(parts) > 0 {
		what += " with " + strings.Join(parts, " and ")
	}
	return what
}

// parkedJSON is the JSON form of a parked event.
type parkedJSON struct {
	ID            string    `json:"id"`
	Tenant        string    `json:"tenant"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	Version       int64     `json:"version"`
	EventType     string    `json:"event_type,omitempty"`
	Reason        string    `json:"reason"`
	Partition     int       `json:"partition"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"last_error,omitempty"`
	ParkedAt      time.Time `json:"parked_at"`
}

// holdJSON is the JSON form of a hold.
type holdJSON struct {
	MessageID     string    `json:"message_id"`
	Tenant        string    `json:"tenant"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	Version       int64     `json:"version"`
	Since         time.Time `json:"since"`
}

func parkedRowsJSON(ps []inbox.Parked) []parkedJSON {
	out := make([]parkedJSON, 0, len(ps))
	for _, p := range ps {
		out = append(out, parkedJSON{ID: p.MessageID, Tenant: p.TenantID, AggregateType: p.AggregateType,
			AggregateID: p.AggregateID, Version: p.Version, EventType: p.Metadata.Get(messaging.MetaEventType), Reason: p.Reason,
			Partition: p.Partition, Attempts: p.Attempts, LastError: p.LastError, ParkedAt: p.ParkedAt.UTC()})
	}
	return out
}

func holdsJSON(hs []inbox.Hold) []holdJSON {
	out := make([]holdJSON, 0, len(hs))
	for _, h := range hs {
		out = append(out, holdJSON{MessageID: h.MessageID, Tenant: h.TenantID, AggregateType: h.AggregateType,
			AggregateID: h.AggregateID, Version: h.Version, Since: h.CreatedAt.UTC()})
	}
	return out
}

// parkedListJSON is the JSON of consumer parked list.
type parkedListJSON struct {
	Parked []parkedJSON `json:"parked"`
	Holds  []holdJSON   `json:"holds"`
}

func (c *cli) consumerParkedList(ctx context.Context, args []string) error {
	fs := c.newFlags("consumer parked list", "--group G [--tenant T] [--aggregate TYPE[/ID]] [--reason held|waiting|gap] [--limit N] [--json]")
	ff := addParkedFlags(fs)
	reason := fs.String("reason", "", "only events parked for this reason: held, waiting or gap (holds show with held)")
	readLimit := addLimit(fs, "at most this many parked events, and as many holds")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	limit, err := readLimit()
	if err != nil {
		return err
	}
	f, err := ff.filter(*reason)
	if err != nil {
		return err
	}
	insp, done, err := c.inspect(ctx, *ff.group, nil)
	if err != nil {
		return err
	}
	defer done()
	parked, err := insp.Parked(ctx, f, limit)
	if err != nil {
		return err
	}
	var holds []inbox.Hold
	if f.Reason == "" || f.Reason == inbox.ParkedHeld {
		if holds, err = insp.Holds(ctx, f, limit); err != nil {
			return err
		}
	}
	if *asJSON {
		return c.printJSON(parkedListJSON{Parked: parkedRowsJSON(parked), Holds: holdsJSON(holds)})
	}
	if len(parked) == 0 && len(holds) == 0 {
		fmt.Fprintln(c.stdout, "no "+describeParked(*ff.group, f))
		return nil
	}
	if len(parked) > 0 {
		if err := c.printParked(parked); err != nil {
			return err
		}
		if len(parked) == limit {
			fmt.Fprintf(c.stdout, "(first %d parked events; raise --limit or narrow the filter for more)\n", limit)
		}
	}
	if len(holds) > 0 {
		if len(parked) > 0 {
			fmt.Fprintln(c.stdout)
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "HELD BEHIND\tTENANT\tAGGREGATE\tVERSION\tSINCE")
		for _, h := range holds {
			fmt.Fprintf(tw, "%s\t%s\t%s/%s\t%d\t%s\n", h.MessageID, h.TenantID, h.AggregateType, h.AggregateID, h.Version,
				timeOrDashValue(h.CreatedAt))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(holds) == limit {
			fmt.Fprintf(c.stdout, "(first %d holds; raise --limit or narrow the filter for more)\n", limit)
		}
	}
	return nil
}

// printParked prints parked events as a table.
func (c *cli) printParked(parked []inbox.Parked) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTENANT\tAGGREGATE\tVERSION\tREASON\tPARTITION\tATTEMPTS\tPARKED AT\tERROR")
	for _, p := range parked {
		fmt.Fprintf(tw, "%s\t%s\t%s/%s\t%d\t%s\t%d\t%d\t%s\t%s\n", p.MessageID, p.TenantID, p.AggregateType, p.AggregateID,
			p.Version, p.Reason, p.Partition, p.Attempts, timeOrDashValue(p.ParkedAt), orDash(oneLine(p.LastError, 60)))
	}
	return tw.Flush()
}

// parkedShowJSON is the JSON of consumer parked show.
type parkedShowJSON struct {
	Tenant        string       `json:"tenant"`
	AggregateType string       `json:"aggregate_type"`
	AggregateID   string       `json:"aggregate_id"`
	Hold          *holdJSON    `json:"hold"`
	Parked        []parkedJSON `json:"parked"`
	Release       string       `json:"release"`
}

func (c *cli) consumerParkedShow(ctx context.Context, args []string) error {
	fs := c.newFlags("consumer parked show", "--group G --aggregate TYPE/ID [--tenant T] [--limit N] [--json]")
	ff := addParkedFlags(fs)
	readLimit := addLimit(fs, "at most this many parked events")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	limit, err := readLimit()
	if err != nil {
		return err
	}
	agg, err := ff.one()
	if err != nil {
		return err
	}
	insp, done, err := c.inspect(ctx, *ff.group, nil)
	if err != nil {
		return err
	}
	defer done()
	a, err := insp.Aggregate(ctx, agg, limit)
	if err != nil {
		return err
	}
	if *asJSON {
		out := parkedShowJSON{Tenant: agg.TenantID, AggregateType: agg.Type, AggregateID: agg.ID,
			Parked: parkedRowsJSON(a.Events), Release: a.Release()}
		if a.Hold != nil {
			out.Hold = &holdsJSON([]inbox.Hold{*a.Hold})[0]
		}
		return c.printJSON(out)
	}
	held := "no dead letter"
	if h := a.Hold; h != nil {
		held = fmt.Sprintf("dead letter %s (version %d) since %s", h.MessageID, h.Version, timeOrDashValue(h.CreatedAt))
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	for _, kv := range [][2]string{
		{"group", insp.Group()}, {"tenant", agg.TenantID}, {"aggregate", agg.Type + "/" + agg.ID},
		{"held behind", held}, {"parked", fmt.Sprint(len(a.Events))},
		{"release", fmt.Sprintf("bento consumer parked release %s --group %s --tenant %s --aggregate %s/%s --versions V",
			a.Release(), insp.Group(), agg.TenantID, agg.Type, agg.ID)},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(a.Events) > 0 {
		fmt.Fprintln(c.stdout)
		if err := c.printParked(a.Events); err != nil {
			return err
		}
	}
	return nil
}

// parseVersions parses a --versions value, the group's Config.Versions.
func parseVersions(s string) (inbox.Versions, error) {
	for _, v := range []inbox.Versions{inbox.VersionsIgnored, inbox.VersionsIncreasing, inbox.VersionsContiguous} {
		if s == v.String() {
			return v, nil
		}
	}
	if s == "" {
		return 0, usagef("--versions is required: the group's consumer Config.Versions, ignored, increasing or contiguous " +
			"(under contiguous a release also skips the versions the first parked event waits for)")
	}
	return 0, usagef("bad --versions %q: want ignored, increasing or contiguous", s)
}

func (c *cli) consumerParkedRelease(ctx context.Context, args []string) error {
	fs := c.newFlags("consumer parked release", "MESSAGE_ID --group G --aggregate TYPE/ID [--tenant T] --versions ignored|increasing|contiguous [--yes]")
	ff := addParkedFlags(fs)
	versions := fs.String("versions", "", "the group's consumer Config.Versions: ignored, increasing or contiguous (required)")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want exactly one message id: the dead letter the aggregate is held behind, or its first parked event " +
			"(bento consumer parked show says which)")
	}
	agg, err := ff.one()
	if err != nil {
		return err
	}
	v, err := parseVersions(*versions)
	if err != nil {
		return err
	}
	insp, done, err := c.inspect(ctx, *ff.group, &consumer.InspectOpts{Versions: v})
	if err != nil {
		return err
	}
	defer done()
	a, err := insp.Aggregate(ctx, agg, 1)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("%s/%s of tenant %s in %s", agg.Type, agg.ID, agg.TenantID, insp.Group())
	question := fmt.Sprintf("release %s from %s? It is given up for good, and the aggregate's parked events are applied.",
		what, pos[0])
	if a.Hold != nil && a.Hold.MessageID == pos[0] {
		question = fmt.Sprintf("release %s from dead letter %s (version %d)? Its hold is lifted for good (discard or replay "+
			"the dead letter itself apart), and the aggregate's parked events are applied.", what, pos[0], a.Hold.Version)
	}
	if err := c.confirm(*yes, question); err != nil {
		return err
	}
	if err := insp.Release(ctx, agg, pos[0]); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "released %s from %s: a running consumer of the group applies its parked events within about a second\n",
		what, pos[0])
	return nil
}

// memberJSON is the JSON form of a group member.
type memberJSON struct {
	ID         string    `json:"id"`
	Partitions int       `json:"partitions"`
	Owns       []int     `json:"owns"`
	LastBeat   time.Time `json:"last_beat"`
	Expires    time.Time `json:"expires"`
}

// consumerMembers runs "bento consumer members": a partitioned group's
// live instances and the partitions each owns.
func (c *cli) consumerMembers(ctx context.Context, args []string) error {
	fs := c.newFlags("consumer members", "--group G [--takeover-time D] [--json]")
	group := fs.String("group", "", "the consumer group (required)")
	takeover := fs.Duration("takeover-time", consumer.DefaultTakeoverTime, "the group's consumer Config.TakeoverTime, for the last heartbeat")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *takeover <= 0 {
		return usagef("--takeover-time must be positive")
	}
	insp, done, err := c.inspect(ctx, *group, &consumer.InspectOpts{TakeoverTime: *takeover})
	if err != nil {
		return err
	}
	defer done()
	members, err := insp.Members(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		out := make([]memberJSON, 0, len(members))
		for _, m := range members {
			out = append(out, memberJSON{ID: m.ID, Partitions: m.Partitions, Owns: append([]int{}, m.Owns...),
				LastBeat: m.LastBeat, Expires: m.Expires})
		}
		return c.printJSON(out)
	}
	if len(members) == 0 {
		fmt.Fprintf(c.stdout, "no live members of %s (a group without partitions has none)\n", *group)
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tPARTITIONS\tOWNS\tLAST BEAT\tEXPIRES")
	for _, m := range members {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", m.ID, m.Partitions, partitionList(m.Owns),
			timeOrDashValue(m.LastBeat), timeOrDashValue(m.Expires))
	}
	return tw.Flush()
}

// partitionList prints partitions as "0,2,4", or "-" for none.
func partitionList(ps []int) string {
	if len(ps) == 0 {
		return "-"
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, ",")
}
