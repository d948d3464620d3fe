package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// ConsumeReport is the consumer scenario over all runs.
type ConsumeReport struct {
	Config consumeConfig   `json:"config"`
	Runs   []consumeResult `json:"runs"`
	Rows   []ConsumeRow    `json:"medians"`
}

// ConsumeRow compares one handler with n consumers with and without the
// inbox (median messages per second over the runs).
type ConsumeRow struct {
	Handler   string  `json:"handler"`
	Consumers int     `json:"consumers"`
	Inbox     float64 `json:"inbox_messages_per_second"`
	Plain     float64 `json:"plain_messages_per_second"`
	Ratio     float64 `json:"inbox_over_plain"`
	// Direct is the inbox middleware called without a broker: the rate
	// its transactions allow on their own.
	Direct float64 `json:"direct_messages_per_second,omitempty"`
	// Batched is the partitioned consumer applying many messages per
	// transaction; Bare the batched exactly-once loop on amqp091 and pgx:
	// the limit.
	Batched     float64   `json:"batched_messages_per_second,omitempty"`
	Bare        float64   `json:"bare_messages_per_second,omitempty"`
	BareRatio   float64   `json:"batched_over_bare,omitempty"`
	RunsBatched []float64 `json:"runs_batched,omitempty"`
	RunsInbox   []float64 `json:"runs_inbox"`
	RunsPlain   []float64 `json:"runs_plain"`
	RunsDirect  []float64 `json:"runs_direct,omitempty"`
	RunsBare    []float64 `json:"runs_bare,omitempty"`
	// WatermillSQL is the handler without the inbox on watermill-sql's
	// PostgreSQL subscriber: the database bus's peer.
	WatermillSQL     float64   `json:"watermill_sql_messages_per_second,omitempty"`
	RunsWatermillSQL []float64 `json:"runs_watermill_sql,omitempty"`
	// Database is the batched consumer on the database bus (PostgreSQL,
	// no broker); DatabaseIdle the most CPU its drained consumer used
	// over the runs, process and backends, in percent of one core.
	Database     float64   `json:"database_bus_messages_per_second,omitempty"`
	RunsDatabase []float64 `json:"runs_database_bus,omitempty"`
	DatabaseIdle float64   `json:"database_bus_idle_percent_of_core,omitempty"`
}

func summarizeConsume(runs []consumeResult, cfg consumeConfig) *ConsumeReport {
	c := &ConsumeReport{Config: cfg, Runs: runs}
	for _, h := range cfg.Handlers {
		for _, n := range cfg.Concurrency {
			row := ConsumeRow{Handler: h, Consumers: n}
			for _, run := range runs {
				for _, r := range run {
					if r.Handler != h || r.Consumers != n || r.Stalled != nil {
						continue
					}
					switch r.Mode {
					case "inbox":
						row.RunsInbox = append(row.RunsInbox, r.Rate)
					case "plain":
						row.RunsPlain = append(row.RunsPlain, r.Rate)
					case "direct":
						row.RunsDirect = append(row.RunsDirect, r.Rate)
					case "batched":
						row.RunsBatched = append(row.RunsBatched, r.Rate)
					case "bare":
						row.RunsBare = append(row.RunsBare, r.Rate)
					case "wmsql":
						row.RunsWatermillSQL = append(row.RunsWatermillSQL, r.Rate)
					case "dbbus":
						row.RunsDatabase = append(row.RunsDatabase, r.Rate)
						if i := r.Idle; i != nil {
							row.DatabaseIdle = max(row.DatabaseIdle, i.ProcessPercent+max(i.BackendPercent, 0))
						}
					}
				}
			}
			row.Inbox, row.Plain, row.Direct = median(row.RunsInbox), median(row.RunsPlain), median(row.RunsDirect)
			row.Batched, row.Bare = median(row.RunsBatched), median(row.RunsBare)
			row.WatermillSQL, row.Database = median(row.RunsWatermillSQL), median(row.RunsDatabase)
			row.Ratio, row.BareRatio = ratio(row.Inbox, row.Plain), ratio(row.Batched, row.Bare)
			c.Rows = append(c.Rows, row)
		}
	}
	return c
}

// consumeTargets checks the inbox targets for every row: at least 60% of
// the same consumer without the inbox and at least 5,000 msg/s; and, where
// the batched consumer and the bare batched loop ran: with the no-op
// handler, at least 50% of the loop, at least 12,000 msg/s and faster than
// the consumer without the inbox; with the writing handler and 8
// consumers, at least 3x 3,287 msg/s (the inbox consumer's before batches).
func consumeTargets(c *ConsumeReport) []Target {
	var ts []Target
	for _, row := range c.Rows {
		if row.Inbox > 0 {
			name := fmt.Sprintf("inbox consumer, %s handler, %d consumer(s)", row.Handler, row.Consumers)
			ts = append(ts,
				Target{Name: name + " vs without", Want: ">= 0.60", Got: row.Ratio, Met: row.Ratio >= 0.6},
				Target{Name: name + ", msg/s", Want: ">= 5000", Got: row.Inbox, Met: row.Inbox >= 5000})
		}
		ts = append(ts, databaseBusTargets(row)...)
		if row.Batched == 0 {
			continue
		}
		batched := fmt.Sprintf("batched consumer, %s handler, %d partition(s)", row.Handler, row.Consumers)
		switch {
		case row.Handler == "noop":
			if row.Bare > 0 {
				ts = append(ts, Target{Name: batched + " vs the bare batched loop", Want: ">= 0.50", Got: row.BareRatio, Met: row.BareRatio >= 0.5})
			}
			ts = append(ts, Target{Name: batched + ", msg/s", Want: ">= 12000", Got: row.Batched, Met: row.Batched >= 12000})
			if row.Plain > 0 {
				ts = append(ts, Target{Name: batched + " vs without the inbox", Want: "> 1.00", Got: ratio(row.Batched, row.Plain),
					Met: row.Batched > row.Plain})
			}
		case row.Handler == "write" && row.Consumers == 8:
			ts = append(ts, Target{Name: batched + ", msg/s", Want: ">= 9861", Got: row.Batched, Met: row.Batched >= 3*3287})
		}
	}
	return ts
}

// databaseBusTargets checks the database bus's consumer where it ran: at
// least 5x watermill-sql's subscriber, at least 50% of the batched
// consumer on RabbitMQ (where each ran), and under 1% of a core when idle.
func databaseBusTargets(row ConsumeRow) []Target {
	if row.Database == 0 {
		return nil
	}
	name := fmt.Sprintf("database bus consumer, %s handler, %d partition(s)", row.Handler, row.Consumers)
	var ts []Target
	if row.WatermillSQL > 0 {
		r := ratio(row.Database, row.WatermillSQL)
		ts = append(ts, Target{Name: name + " vs watermill-sql", Want: ">= 5x", Got: r, Met: r >= 5})
	}
	if row.Batched > 0 {
		r := ratio(row.Database, row.Batched)
		ts = append(ts, Target{Name: name + " vs RabbitMQ (batched)", Want: ">= 0.50", Got: r, Met: r >= 0.5})
	}
	if len(row.RunsDatabase) > 0 {
		ts = append(ts, Target{Name: name + ", idle, % of a core", Want: "< 1", Got: row.DatabaseIdle, Met: row.DatabaseIdle < 1})
	}
	return ts
}

func printConsume(w io.Writer, c *ConsumeReport) {
	fmt.Fprintf(w, "\nConsumer: %s messages pre-published to the group's queue, drained by n competing consumers;\n"+
		"inbox = consumer.NewAMQP, without = the same handler on a Watermill router over bento's rabbitmq.Subscriber,\n"+
		"no broker = the inbox middleware called in a loop, without RabbitMQ,\n"+
		"batched = consumer.NewAMQP on n partitions, up to %d messages per transaction,\n"+
		"bare batched = amqp091 and pgx, %d deliveries per transaction, one multiple ack after commit (the limit)\n",
		thousands(float64(c.Config.Messages)), consumeBatchSize, bareConsumeBatch)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "handler\tconsumers\tinbox msg/s\twithout msg/s\tinbox/without\tinbox, no broker msg/s\tbatched msg/s\tbare batched msg/s\tbatched/bare\truns (inbox / without)\t")
	for _, r := range c.Rows {
		var runs []string
		for i := range r.RunsInbox {
			p := 0.0
			if i < len(r.RunsPlain) {
				p = r.RunsPlain[i]
			}
			runs = append(runs, thousands(r.RunsInbox[i])+"/"+thousands(p))
		}
		direct, batched, bare, bareRatio := "-", "-", "-", "-"
		if r.Direct > 0 {
			direct = thousands(r.Direct)
		}
		if r.Batched > 0 {
			batched = thousands(r.Batched)
		}
		if r.Bare > 0 {
			bare, bareRatio = thousands(r.Bare), fmt.Sprintf("%.2f", r.BareRatio)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t\n", r.Handler, r.Consumers, thousands(r.Inbox), thousands(r.Plain), r.Ratio,
			direct, batched, bare, bareRatio, strings.Join(runs, " "))
	}
	tw.Flush()
	var db []ConsumeRow
	for _, r := range c.Rows {
		if r.Database > 0 || r.WatermillSQL > 0 {
			db = append(db, r)
		}
	}
	if len(db) == 0 {
		return
	}
	fmt.Fprintf(w, "\nWithout a broker: database bus = consumer.NewDatabase on n partitions of a dbbus.Bus in PostgreSQL,\n"+
		"up to %d messages per transaction; watermill-sql = the handler without the inbox on n subscriptions of one\n"+
		"watermill-sql PostgreSQL consumer group; idle = the drained consumer's process and backends, %% of a core\n", consumeBatchSize)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "handler\tpartitions\tdatabase bus msg/s\twatermill-sql msg/s\tx watermill-sql\tof RabbitMQ batched\tidle %\t")
	for _, r := range db {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%.2f\t\n", r.Handler, r.Consumers, thousands(r.Database), thousands(r.WatermillSQL),
			times(ratio(r.Database, r.WatermillSQL)), percent(ratio(r.Database, r.Batched)), r.DatabaseIdle)
	}
	tw.Flush()
}

// consumeSVG draws the consumer medians, inbox beside without.
func consumeSVG(r *Report) string {
	c := r.Consume
	var bars []bar
	for _, row := range c.Rows {
		label := fmt.Sprintf("%s handler, %d consumer", row.Handler, row.Consumers)
		if row.Consumers != 1 {
			label += "s"
		}
		bars = append(bars,
			bar{Label: label + ", without inbox", Value: row.Plain, Family: "bare"},
			bar{Label: label + ", inbox", Value: row.Inbox, Family: "bento", Note: percent(row.Ratio) + " of without"})
		if row.Batched > 0 {
			bars = append(bars, bar{Label: label + ", inbox, batched", Value: row.Batched, Family: "bento",
				Note: percent(ratio(row.Batched, row.Plain)) + " of without"})
		}
		if row.Bare > 0 {
			bars = append(bars, bar{Label: label + ", bare batched loop", Value: row.Bare, Family: "bare"})
		}
	}
	sub := fmt.Sprintf("%s messages, %s · %s", thousands(float64(c.Config.Messages)), runsText(r.Runs), machineText(r.Machine))
	return barChart(chartSpec{
		Title:    "Consumer throughput, RabbitMQ → handler, with and without the inbox, one or many per transaction",
		Subtitle: sub,
		Axis:     "messages per second (higher is better)",
		Bars:     bars,
	})
}
