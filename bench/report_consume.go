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
	Direct     float64   `json:"direct_messages_per_second,omitempty"`
	RunsInbox  []float64 `json:"runs_inbox"`
	RunsPlain  []float64 `json:"runs_plain"`
	RunsDirect []float64 `json:"runs_direct,omitempty"`
}

func summarizeConsume(runs []consumeResult, cfg consumeConfig) *ConsumeReport {
	c := &ConsumeReport{Config: cfg, Runs: runs}
	for _, h := range cfg.Handlers {
		for _, n := range cfg.Concurrency {
			row := ConsumeRow{Handler: h, Consumers: n}
			for _, run := range runs {
				for _, r := range run {
					if r.Handler != h || r.Consumers != n {
						continue
					}
					switch r.Mode {
					case "inbox":
						row.RunsInbox = append(row.RunsInbox, r.Rate)
					case "plain":
						row.RunsPlain = append(row.RunsPlain, r.Rate)
					case "direct":
						row.RunsDirect = append(row.RunsDirect, r.Rate)
					}
				}
			}
			row.Inbox, row.Plain, row.Direct = median(row.RunsInbox), median(row.RunsPlain), median(row.RunsDirect)
			row.Ratio = ratio(row.Inbox, row.Plain)
			c.Rows = append(c.Rows, row)
		}
	}
	return c
}

// consumeTargets checks DESIGN.md's inbox targets for every row: at least
// 60% of the same consumer without the inbox and at least 5,000 msg/s.
func consumeTargets(c *ConsumeReport) []Target {
	var ts []Target
	for _, row := range c.Rows {
		name := fmt.Sprintf("inbox consumer, %s handler, %d consumer(s)", row.Handler, row.Consumers)
		ts = append(ts,
			Target{Name: name + " vs without", Want: ">= 0.60", Got: row.Ratio, Met: row.Ratio >= 0.6},
			Target{Name: name + ", msg/s", Want: ">= 5000", Got: row.Inbox, Met: row.Inbox >= 5000})
	}
	return ts
}

func printConsume(w io.Writer, c *ConsumeReport) {
	fmt.Fprintf(w, "\nConsumer: %s messages pre-published to the group's queue, drained by n competing consumers;\n"+
		"inbox = consumer.NewAMQP, without = the same handler on a Watermill router over bento's AMQPSubscriber,\n"+
		"no broker = the inbox middleware called in a loop, without RabbitMQ\n",
		thousands(float64(c.Config.Messages)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "handler\tconsumers\tinbox msg/s\twithout msg/s\tinbox/without\tinbox, no broker msg/s\truns (inbox / without)\t")
	for _, r := range c.Rows {
		var runs []string
		for i := range r.RunsInbox {
			p := 0.0
			if i < len(r.RunsPlain) {
				p = r.RunsPlain[i]
			}
			runs = append(runs, thousands(r.RunsInbox[i])+"/"+thousands(p))
		}
		direct := "-"
		if r.Direct > 0 {
			direct = thousands(r.Direct)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.2f\t%s\t%s\t\n", r.Handler, r.Consumers, thousands(r.Inbox), thousands(r.Plain), r.Ratio,
			direct, strings.Join(runs, " "))
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
	}
	sub := fmt.Sprintf("%s messages, %s · %s", thousands(float64(c.Config.Messages)), runsText(r.Runs), machineText(r.Machine))
	return barChart(chartSpec{
		Title:    "Consumer throughput, RabbitMQ → handler, with and without the inbox",
		Subtitle: sub,
		Axis:     "messages per second (higher is better)",
		Bars:     bars,
	})
}
