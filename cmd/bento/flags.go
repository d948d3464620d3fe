package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// newFlags returns a flag set for the command name whose usage line is
// synopsis.
func (c *cli) newFlags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("bento "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported once, by run
	fs.Usage = func() {
		fmt.Fprintf(c.stdout, "usage: bento %s %s\n", name, synopsis)
		fs.SetOutput(c.stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// parse parses args, flags and positional arguments in any order, and
// returns the positional ones. -h prints the usage and returns errHelp; a
// bad flag returns a usageError.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) { // the flag package printed the usage
				return nil, errHelp
			}
			return nil, usagef("%v (see -h)", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// parseFlags parses args, which must be flags only.
func parseFlags(fs *flag.FlagSet, args []string) error {
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected arguments %q (this command takes flags only)", pos)
	}
	return nil
}

// addLimit adds the --limit flag, 100 by default, to fs; the function it
// returns reads it once fs is parsed, refusing a limit below 1.
func addLimit(fs *flag.FlagSet, usage string) func() (int, error) {
	limit := fs.Int("limit", 100, usage)
	return func() (int, error) {
		if *limit < 1 {
			return 0, usagef("--limit must be at least 1")
		}
		return *limit, nil
	}
}

// ageFlag is a duration flag that also accepts days ("7d", "1d12h").
type ageFlag struct {
	d   time.Duration
	set bool
}

// String returns the age as humanAge prints it, "" for none; flag's usage
// shows it as the default.
func (a *ageFlag) String() string {
	if a == nil || a.d <= 0 {
		return ""
	}
	return humanAge(a.d)
}

// Set parses s as [parseAge] does.
func (a *ageFlag) Set(s string) error {
	d, err := parseAge(s)
	if err != nil {
		return err
	}
	a.d, a.set = d, true
	return nil
}

// parseAge parses a non-negative age: a Go duration ("36h", "90m") with an
// optional leading number of days ("7d", "1d12h").
func parseAge(s string) (time.Duration, error) {
	if s == "" {
		return 0, fmt.Errorf("bad age %q: want e.g. 7d, 36h or 1d12h", s)
	}
	var days time.Duration
	rest := s
	if i := strings.IndexByte(s, 'd'); i >= 0 {
		n, err := strconv.Atoi(s[:i])
		if err != nil || n < 0 || n > 100*365 {
			return 0, fmt.Errorf("bad age %q: want e.g. 7d, 36h or 1d12h", s)
		}
		days, rest = time.Duration(n)*24*time.Hour, s[i+1:]
	}
	var d time.Duration
	if rest != "" {
		var err error
		d, err = time.ParseDuration(rest)
		if err != nil {
			return 0, fmt.Errorf("bad age %q: want e.g. 7d, 36h or 1d12h", s)
		}
	}
	if d < 0 {
		return 0, fmt.Errorf("bad age %q: must not be negative", s)
	}
	return days + d, nil
}

// parseAggregate splits the value of an --aggregate flag, TYPE or TYPE/ID;
// an empty value selects no aggregate.
func parseAggregate(a string) (typ, id string, err error) {
	if a == "" {
		return "", "", nil
	}
	typ, id, _ = strings.Cut(a, "/")
	if typ == "" {
		return "", "", usagef("bad --aggregate %q: want TYPE or TYPE/ID", a)
	}
	return typ, id, nil
}

// describeAggregate says in words the aggregate an --aggregate flag
// selects.
func describeAggregate(typ, id string) string {
	if id == "" {
		return "aggregate " + typ
	}
	return "aggregate " + typ + "/" + id
}

// describeIDs says in words a list of ids: "id A", "ids A, B".
func describeIDs(ids []string) string {
	if len(ids) == 1 {
		return "id " + ids[0]
	}
	return "ids " + strings.Join(ids, ", ")
}

// humanAge prints an age rounded for people: 3d4h, 5h12m, 4m3s, 850ms,
// without zero trailing units (7d, 2h, 5m); "-" for none.
func humanAge(d time.Duration) string {
	var s string
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		s = d.Round(time.Second).String()
	case d < 24*time.Hour:
		s = d.Round(time.Minute).String()
	default:
		days := d / (24 * time.Hour)
		h := (d % (24 * time.Hour)).Round(time.Hour) / time.Hour
		s = fmt.Sprintf("%dd%dh", days, h)
	}
	for _, zero := range []string{"m0s", "h0m", "d0h"} {
		if strings.HasSuffix(s, zero) {
			s = s[:len(s)-2]
		}
	}
	return s
}

// olderThan says in words "more than AGE ago", or "" for a zero age, which
// selects every age.
func olderThan(verb string, d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return " " + verb + " more than " + humanAge(d) + " ago"
}

// things names what a command counts, a noun and what narrows it
// ("dead event", " with topic order.paid"), so that its messages read right
// for every count.
type things struct{ noun, qualifier, plural string }

// n says n things: "no dead events", "1 dead event", "3 dead events", each
// followed by the qualifier. The plural is noun+"s" unless plural is set.
func (t things) n(n int64) string {
	plural := t.plural
	if plural == "" {
		plural = t.noun + "s"
	}
	switch n {
	case 0:
		return "no " + plural + t.qualifier
	case 1:
		return "1 " + t.noun + t.qualifier
	}
	return fmt.Sprintf("%d %s%s", n, plural, t.qualifier)
}

func trimLower(s string) string { return strings.ToLower(strings.TrimSpace(s)) }
