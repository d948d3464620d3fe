// Command bench measures bento against Watermill's own outbox and a bare
// pgx + amqp091 loop on one machine, in one run: the relay drain of a
// backlog from PostgreSQL to RabbitMQ with publisher confirms, the
// commit-to-consumer latency at a steady rate (and the CPU of an idle
// relay), the unit-of-work commit against the same GORM write without
// events, the consumer's throughput with and without the inbox, and the
// claim cost beside few and many sent rows; on request, the claim cost with
// events held back behind dead ones, and the delivery lag of scheduled
// messages from their due time beside a bare due-time poller, with cancels
// at a paced rate. It prints medians over the runs,
// writes them as JSON and draws charts as SVG.
//
// It is its own module, so watermill-sql and the like stay out of bento's
// go.mod. From the repository root:
//
//	go -C bench run . [-scenarios=drain,steady,commit,consume,claim] [-runs=3] [-events=100000]
//	go -C bench run . -scenarios=claimheld
//	go -C bench run . -scenarios=scheduled -runs=1
//
// It needs PostgreSQL (database "test", user postgres) and RabbitMQ; see
// -pg and -amqp. Each run works in a fresh schema and fresh
// exchange and queue names, all removed afterwards.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// options are the command-line flags.
type options struct {
	scenarios      []string
	runs           int
	events         int
	out            string
	docs           string
	commitDuration time.Duration
	claim          claimConfig
	claimHeld      claimHeldConfig
	steady         steadyConfig
	consume        consumeConfig
	scheduled      scheduledConfig
	cpuProfile     string
	from           string
}

// allScenarios are the scenarios in the order, the ones a run
// without -scenarios measures.
var allScenarios = []string{"drain", "steady", "commit", "consume", "claim"}

// moreScenarios are measured only when -scenarios names them: claimheld,
// the claim with events held behind dead ones, a focused check of the
// claim statement rather than of a relay.
// scheduled, the delivery lag of scheduled messages and their cancellation,
// beside a bare due-time poller.
var moreScenarios = []string{"claimheld", "scheduled"}

// knownScenarios are allScenarios and moreScenarios, in that order.
func knownScenarios() []string { return slices.Concat(allScenarios, moreScenarios) }

func parseFlags() (options, *env, error) {
	var (
		o         options
		scenarios string
		e         = &env{}
		rates     = floatList{1000, 5000}
		polls     = durationList{time.Second, 10 * time.Millisecond}
		consumers = intList{1, 8}
		handlers  = stringList(consumeHandlers)
		modes     = stringList(consumeModes)
		held      = defaultClaimHeldConfig()
		heldRows  = intList(held.Held)
		limits    = intList(held.Limits)
		shapes    = stringList(held.Shapes)
		layouts   = stringList(held.Layouts)
	)
	flag.StringVar(&scenarios, "scenarios", strings.Join(allScenarios, ","), "comma-separated scenarios to run: "+
		strings.Join(knownScenarios(), ", ")+" (the default is all but "+strings.Join(moreScenarios, ", ")+")")
	flag.IntVar(&o.runs, "runs", 3, "repetitions of each scenario; the tables show medians")
	flag.IntVar(&o.events, "events", 100000, "events in the drain backlog (Watermill's forwarder relays at most 20,000 of them)")
	flag.StringVar(&o.out, "out", "", "directory for the results JSON and the charts (default: the results folder beside this program)")
	flag.StringVar(&o.docs, "docs", "", `directory to copy the charts into as benchmarks-<chart>.svg (default: docs of the repository; "-" for nowhere)`)
	flag.DurationVar(&o.commitDuration, "commit-duration", 5*time.Second, "how long each commit measurement runs")
	flag.IntVar(&o.claim.Pending, "claim-pending", 10000, "unsent rows in the claim scenario")
	flag.IntVar(&o.claim.SentSmall, "claim-sent-small", 10000, "sent rows beside them, first measurement")
	flag.IntVar(&o.claim.SentLarge, "claim-sent-large", 1000000, "sent rows beside them, second measurement")
	flag.IntVar(&o.claim.Claims, "claims", 200, "claims measured at each size")
	flag.Var(&heldRows, "claimheld-held", "claimheld: events held back behind dead ones, one measurement each, comma-separated; the smallest is the base")
	flag.IntVar(&held.Ready, "claimheld-ready", held.Ready, "claimheld: ready rows of other aggregates beside them")
	flag.IntVar(&held.PerAggregate, "claimheld-per-aggregate", held.PerAggregate, "claimheld: held events behind each dead one in the shape many")
	flag.Var(&limits, "claimheld-limits", "claimheld: rows per claim, comma-separated")
	flag.IntVar(&held.Claims, "claimheld-claims", held.Claims, "claimheld: timed claims per measurement")
	flag.DurationVar(&held.Budget, "claimheld-budget", held.Budget, fmt.Sprintf(
		"claimheld: time after which a measurement stops timing claims, once it timed %d", claimHeldMinClaims))
	flag.Var(&shapes, "claimheld-shapes", "claimheld: one (one dead event, every held event behind it), many (-claimheld-per-aggregate behind each)")
	flag.Var(&layouts, "claimheld-layouts", "claimheld: plain, partitioned (outbox.MigrateWith, daily partitions)")
	flag.Var(&rates, "steady-rates", "steady: events per second offered, comma-separated")
	flag.DurationVar(&o.steady.Duration, "steady-duration", 10*time.Second, "steady: measured time at each rate")
	flag.DurationVar(&o.steady.Warmup, "steady-warmup", 2*time.Second, "steady: time at each rate before measuring")
	flag.IntVar(&o.steady.Writers, "steady-writers", 16, "steady: goroutines committing, each with its own account")
	flag.IntVar(&o.steady.Accounts, "steady-accounts", 1024, "steady: accounts the events change, dealt out to the writers")
	flag.BoolVar(&o.steady.NoNotify, "steady-no-notify", false, "steady: an experiment: disable the outbox's NOTIFY trigger (the projector then polls)")
	flag.DurationVar(&o.steady.Idle, "idle", 10*time.Second, "steady: how long the idle relays' CPU is measured (0: not at all)")
	flag.Var(&polls, "peer-polls", "steady: poll intervals of Watermill's forwarder, comma-separated (empty: no peer)")
	flag.Float64Var(&o.steady.PeerMaxRate, "peer-max-rate", 1000, "steady: highest rate the forwarder is offered (it relays about 1,400/s at most)")
	flag.IntVar(&o.consume.Messages, "consume-messages", 20000, "consume: messages pre-published per measurement")
	flag.Var(&consumers, "consume-consumers", "consume: competing consumers of the group, comma-separated")
	flag.Var(&handlers, "consume-handlers", "consume: handlers, comma-separated: noop, write")
	flag.Var(&modes, "consume-modes", "consume: modes, comma-separated: inbox, plain (without the inbox), direct (the inbox without a broker), batched (partitions, many messages per transaction), bare (the batched exactly-once limit), dbbus (batched on the database bus), wmsql (watermill-sql's PostgreSQL subscriber, without the inbox)")
	flag.IntVar(&o.scheduled.Messages, "scheduled-messages", 100000, "scheduled: messages scheduled, falling due evenly over -scheduled-spread")
	flag.DurationVar(&o.scheduled.Spread, "scheduled-spread", time.Minute, "scheduled: the time over which the messages fall due")
	flag.DurationVar(&o.scheduled.Lead, "scheduled-lead", 40*time.Second, "scheduled: from the start of scheduling to the first due time (scheduling must end before)")
	flag.IntVar(&o.scheduled.Writers, "scheduled-writers", 4, "scheduled: goroutines scheduling, 200 messages per transaction")
	flag.DurationVar(&o.scheduled.PeerPoll, "scheduled-peer-poll", 10*time.Millisecond, "scheduled: the bare poller's sleep after a poll that found nothing due (0: no peer)")
	flag.IntVar(&o.scheduled.CancelMessages, "scheduled-cancel-messages", 40000, "scheduled: messages scheduled for the cancellation measurement, every other one cancelled (0: none)")
	flag.DurationVar(&o.scheduled.CancelSpread, "scheduled-cancel-spread", 2*time.Second, "scheduled: the time over which the cancellation's messages fall due")
	flag.Float64Var(&o.scheduled.CancelRate, "scheduled-cancel-rate", 10000, "scheduled: cancels per second offered")
	flag.IntVar(&o.scheduled.Cancellers, "scheduled-cancellers", 32, "scheduled: goroutines cancelling, each in its own transaction")
	flag.DurationVar(&o.scheduled.CancelAhead, "scheduled-cancel-ahead", 500*time.Millisecond, "scheduled: how long before the first due time the cancels start (negative: after, racing the release)")
	flag.IntVar(&o.scheduled.CancelsPerTx, "scheduled-cancels-per-tx", 1, "scheduled: cancels one transaction makes")
	flag.BoolVar(&o.scheduled.CancelPeer, "scheduled-cancel-peer", true, "scheduled: measure a bare DELETE by key beside the cancels")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	flag.StringVar(&o.from, "from", "", "measure nothing: print the tables of a results.json written earlier and redraw its chart")
	flag.StringVar(&e.pgDSN, "pg", "host=127.0.0.1 port=5432 user=postgres dbname=test sslmode=disable", "PostgreSQL keyword/value DSN (search_path is added)")
	flag.StringVar(&e.amqpURL, "amqp", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL")
	flag.Parse()
	o.claim.Limit = 100
	o.steady.Rates, o.steady.PeerPolls = rates, polls
	o.consume.Concurrency, o.consume.Handlers, o.consume.Modes = consumers, handlers, modes
	held.Held, held.Limits, held.Shapes, held.Layouts = heldRows, limits, shapes, layouts
	o.claimHeld = held

	for _, s := range strings.Split(scenarios, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(knownScenarios(), s) {
			return o, nil, fmt.Errorf("unknown scenario %q (want %s)", s, strings.Join(knownScenarios(), ", "))
		}
		if !slices.Contains(o.scenarios, s) {
			o.scenarios = append(o.scenarios, s)
		}
	}
	var errs []error
	if o.runs < 1 {
		errs = append(errs, fmt.Errorf("-runs: %d, must be at least 1", o.runs))
	}
	if o.events < 10 {
		errs = append(errs, fmt.Errorf("-events: %d, must be at least 10", o.events))
	}
	if o.claim.Pending < o.claim.Limit*10 {
		errs = append(errs, fmt.Errorf("-claim-pending: %d, must be at least %d", o.claim.Pending, o.claim.Limit*10))
	}
	if o.claim.SentLarge < o.claim.SentSmall {
		errs = append(errs, errors.New("-claim-sent-large is below -claim-sent-small"))
	}
	errs = append(errs, o.steady.validate(), o.consume.validate())
	if slices.Contains(o.scenarios, "claimheld") {
		errs = append(errs, o.claimHeld.validate())
	}
	if slices.Contains(o.scenarios, "scheduled") {
		errs = append(errs, o.scheduled.validate())
	}
	if err := errors.Join(errs...); err != nil {
		return o, nil, err
	}
	dir, found := benchDir()
	if o.out == "" {
		o.out = filepath.Join(dir, "results")
	}
	if o.docs == "" && found {
		o.docs = filepath.Join(dir, "..", "docs")
	}
	if o.docs == "-" {
		o.docs = ""
	}
	e.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return o, e, nil
}

// benchDir finds this program's module folder: the working directory or its
// bench subfolder. found is false when neither is it.
func benchDir() (dir string, found bool) {
	for _, d := range []string{".", "bench"} {
		f, err := os.Open(filepath.Join(d, "go.mod"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "module github.com/bentoevents/bento/bench" {
				f.Close()
				return d, true
			}
		}
		f.Close()
	}
	return ".", false
}

func run() error {
	o, e, err := parseFlags()
	if err != nil {
		return err
	}
	if o.from != "" {
		return redraw(o)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	rep := &Report{
		Started:   time.Now().UTC(),
		LoadStart: loadAverage(),
		Command:   strings.Join(os.Args[1:], " "),
		Scenarios: o.scenarios,
		Runs:      o.runs,
	}
	if rep.Machine, err = e.machine(ctx); err != nil {
		return err
	}
	progress("machine: %s, %d cores, %s, PostgreSQL %s, %s; load average %s", rep.Machine.CPU, rep.Machine.Cores,
		rep.Machine.Go, rep.Machine.PostgreSQL, rep.Machine.RabbitMQ, loadText(rep.LoadStart))

	has := func(s string) bool { return slices.Contains(o.scenarios, s) }
	variants := drainVariants(e)
	var (
		drainRuns  = map[string][]drainRun{}
		setups     []float64
		payload    float64
		commitRuns [][]commitResult
		claimRuns  [][]claimPoint
		heldRuns   [][]claimHeldPoint
		steadyRuns []steadyResult
		consRuns   []consumeResult
		schedRuns  []scheduledResult
	)
	for r := 1; r <= o.runs; r++ {
		if has("drain") {
			progress("run %d/%d drain: committing %d events with units of work", r, o.runs, o.events)
			b, err := newBacklog(ctx, e, o.events)
			if err != nil {
				return fmt.Errorf("drain setup: %w", err)
			}
			setups, payload = append(setups, b.SetupSeconds), b.PayloadBytes
			progress("  setup: %.1f s, payload %.0f bytes on average", b.SetupSeconds, b.PayloadBytes)
			for _, v := range variants {
				dr, err := v.run(ctx, b)
				if err != nil {
					_ = b.close()
					return fmt.Errorf("drain %s: %w", v.Key, err)
				}
				drainRuns[v.Key] = append(drainRuns[v.Key], dr)
				extra := ""
				if dr.ClaimSeconds > 0 {
					extra = fmt.Sprintf(" (claim %.2f s, mark sent %.2f s)", dr.ClaimSeconds, dr.SettleSeconds)
				}
				progress("  %-28s %7d rows in %6.2f s: %8s rows/s%s", v.Key, dr.Events, dr.Seconds, thousands(dr.Rate), extra)
			}
			if err := b.close(); err != nil {
				e.log.Warn("cleanup", "err", err)
			}
		}
		if has("steady") {
			progress("run %d/%d steady: %s events/s, %v each after %v warm-up, %d writers", r, o.runs,
				o.steady.ratesText(), o.steady.Duration, o.steady.Warmup, o.steady.Writers)
			res, err := runSteady(ctx, e, o.steady, func(s string) { progress("  %s", s) })
			if err != nil {
				return fmt.Errorf("steady: %w", err)
			}
			steadyRuns = append(steadyRuns, res)
		}
		if has("commit") {
			progress("run %d/%d commit: %v per measurement", r, o.runs, o.commitDuration)
			res, err := runCommit(ctx, e, o.commitDuration)
			if err != nil {
				return fmt.Errorf("commit: %w", err)
			}
			for _, c := range res {
				progress("  %-5s x%d: %8s commits/s", c.Mode, c.Goroutines, thousands(c.Rate))
			}
			commitRuns = append(commitRuns, res)
		}
		if has("consume") {
			progress("run %d/%d consume: %d messages, handlers %s, consumers %v", r, o.runs, o.consume.Messages,
				strings.Join(o.consume.Handlers, ", "), o.consume.Concurrency)
			res, err := runConsumeScenario(ctx, e, o.consume, func(s string) { progress("  %s", s) })
			if err != nil {
				return fmt.Errorf("consume: %w", err)
			}
			consRuns = append(consRuns, res)
		}
		if has("claim") {
			progress("run %d/%d claim: %d pending rows beside %d, then %d sent rows", r, o.runs,
				o.claim.Pending, o.claim.SentSmall, o.claim.SentLarge)
			res, err := runClaim(ctx, e, o.claim)
			if err != nil {
				return fmt.Errorf("claim: %w", err)
			}
			for _, p := range res {
				progress("  beside %7d sent: claim p50 %.2f ms, p95 %.2f ms; indexes %s", p.SentRows, p.Claim.P50, p.Claim.P95,
					strings.Join(p.Indexes, ", "))
			}
			claimRuns = append(claimRuns, res)
		}
		if has("claimheld") {
			c := o.claimHeld
			progress("run %d/%d claimheld: %s held rows beside %d ready, limits %s, %d claims each, shapes %s, tables %s", r, o.runs,
				intsText(c.Held), c.Ready, intsText(c.Limits), c.Claims, strings.Join(c.Shapes, ","), strings.Join(c.Layouts, ","))
			res, err := runClaimHeld(ctx, e, c, func(s string) { progress("  %s", s) })
			if err != nil {
				return fmt.Errorf("claimheld: %w", err)
			}
			heldRuns = append(heldRuns, res)
		}
		if has("scheduled") {
			c := o.scheduled
			progress("run %d/%d scheduled: %d messages due over %v after %v, peer poll %v; cancel %d of %d at %v/s", r, o.runs,
				c.Messages, c.Spread, c.Lead, c.PeerPoll, c.CancelMessages/2, c.CancelMessages, c.CancelRate)
			res, err := runScheduled(ctx, e, c, func(s string) { progress("  %s", s) })
			if err != nil {
				return fmt.Errorf("scheduled: %w", err)
			}
			schedRuns = append(schedRuns, res)
		}
	}

	if has("drain") {
		rep.Drain = summarizeDrain(variants, drainRuns, o.events, payload, setups)
	}
	if has("steady") {
		rep.Steady = summarizeSteady(steadyRuns, o.steady)
	}
	if has("consume") {
		rep.Consume = summarizeConsume(consRuns, o.consume)
	}
	if has("commit") {
		rep.Commit = summarizeCommit(commitRuns, o.commitDuration)
	}
	if has("claim") {
		rep.Claim = summarizeClaim(claimRuns, o.claim)
	}
	if has("claimheld") {
		rep.ClaimHeld = summarizeClaimHeld(heldRuns, o.claimHeld)
	}
	if has("scheduled") {
		rep.Scheduled = summarizeScheduled(schedRuns, o.scheduled)
	}
	rep.Targets = rep.targets()
	rep.Finished = time.Now().UTC()
	rep.LoadEnd = loadAverage()
	printReport(os.Stdout, rep)
	return writeOutputs(rep, o)
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
