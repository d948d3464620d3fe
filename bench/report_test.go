package main

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

func point(key, family string, rate, p50, p99 float64, committed, received int) steadyPoint {
	return steadyPoint{Key: key, Label: key, Family: family, steadyRun: steadyRun{
		Rate: rate, Achieved: rate, Committed: committed, Received: received,
		Latency: latencies{P50: p50, P99: p99},
	}}
}

func TestSummarizeSteadyAndTargets(t *testing.T) {
	t.Parallel()
	runs := []steadyResult{
		{Idle: []IdleCPU{{Key: "bento", ProcessPercent: 0.2, BackendPercent: 0.1}},
			Points: []steadyPoint{
				point("bento@1000", "bento", 1000, 2, 10, 100, 100),
				point("watermill-forwarder-10ms@1000", "peer", 1000, 8, 30, 100, 100),
				point("bento@5000", "bento", 5000, 4, 60, 100, 100),
			}},
		{Idle: []IdleCPU{{Key: "bento", ProcessPercent: 0.4, BackendPercent: 0.9}},
			Points: []steadyPoint{
				point("bento@1000", "bento", 1000, 4, 20, 100, 100),
				point("watermill-forwarder-10ms@1000", "peer", 1000, 12, 50, 100, 99),
				point("bento@5000", "bento", 5000, 4, 40, 100, 100),
			}},
		{Idle: []IdleCPU{{Key: "bento", ProcessPercent: 0.3, BackendPercent: -1}},
			Points: []steadyPoint{
				point("bento@1000", "bento", 1000, 2.5, 14, 100, 100),
				point("watermill-forwarder-10ms@1000", "peer", 1000, 10, 40, 100, 100),
				point("bento@5000", "bento", 5000, 4, 45, 100, 100),
			}},
	}
	s := summarizeSteady(runs, steadyConfig{Rates: []float64{1000, 5000}, Duration: time.Second, Writers: 4,
		PeerPolls: []time.Duration{10 * time.Millisecond}})
	if len(s.Rows) != 3 {
		t.Fatalf("%d rows, want 3", len(s.Rows))
	}
	b, peer := s.Rows[0], s.Rows[1]
	if b.P50 != 2.5 || b.P99 != 14 {
		t.Errorf("bento@1000 medians p50 %v, p99 %v; want 2.5, 14", b.P50, b.P99)
	}
	if peer.PeerOverBentoP50 != 4 || math.Abs(peer.PeerOverBentoP99-40.0/14) > 1e-9 || peer.Lost != 1 {
		t.Errorf("peer row %+v: want 4x p50, 2.86x p99, 1 lost", peer)
	}
	if s.Idle[0].ProcessPercent != 0.3 || s.Idle[0].BackendPercent != 0.1 {
		t.Errorf("idle medians %+v, want process 0.3, backends 0.1", s.Idle[0])
	}
	got := map[string]bool{}
	for _, tg := range steadyTargets(s) {
		got[tg.Name] = tg.Met
	}
	want := map[string]bool{
		"steady 1k/s: bento p50 commit -> consumer (ms)":       true,
		"steady 1k/s: bento p99 commit -> consumer (ms)":       true,
		"steady 5k/s: bento p99 commit -> consumer (ms)":       true, // median 45
		"idle projector, % of a core (process + its backends)": true, // 0.4
	}
	if len(got) != len(want) {
		t.Errorf("targets %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("target %q met = %v, want %v", k, got[k], v)
		}
	}
	// A lost event fails the latency target however fast the rest was.
	s.Rows[0].Lost = 1
	if steadyTargets(s)[0].Met {
		t.Error("p50 target met although an event was lost")
	}
}

func TestSummarizeConsumeAndTargets(t *testing.T) {
	t.Parallel()
	runs := []consumeResult{
		{{Handler: "noop", Mode: "inbox", Consumers: 8, Rate: 6000}, {Handler: "noop", Mode: "plain", Consumers: 8, Rate: 9000}},
		{{Handler: "noop", Mode: "inbox", Consumers: 8, Rate: 5500}, {Handler: "noop", Mode: "plain", Consumers: 8, Rate: 10000}},
		{{Handler: "noop", Mode: "inbox", Consumers: 8, Rate: 4000}, {Handler: "noop", Mode: "plain", Consumers: 8, Rate: 9500}},
	}
	c := summarizeConsume(runs, consumeConfig{Messages: 10, Concurrency: []int{8}, Handlers: []string{"noop"}})
	if len(c.Rows) != 1 {
		t.Fatalf("%d rows, want 1", len(c.Rows))
	}
	row := c.Rows[0]
	if row.Inbox != 5500 || row.Plain != 9500 || math.Abs(row.Ratio-5500.0/9500) > 1e-9 {
		t.Errorf("row %+v: want 5,500 / 9,500", row)
	}
	ts := consumeTargets(c)
	if len(ts) != 2 || ts[0].Met || !ts[1].Met {
		t.Errorf("targets %+v: want the ratio (0.58) missed and the rate (5,500) met", ts)
	}
}

func TestCounterRate(t *testing.T) {
	t.Parallel()
	c := newCounter(3)
	c.add()
	c.add()
	select {
	case <-c.done:
		t.Fatal("done after 2 of 3")
	default:
	}
	c.add()
	<-c.done
	c.first.Store(0)
	c.last.Store(int64(time.Second))
	if s, r := c.rate(); s != 1 || r != 2 {
		t.Errorf("rate = %v s, %v/s; want 1 s, 2/s (two messages after the first)", s, r)
	}
}

func TestResultsName(t *testing.T) {
	t.Parallel()
	if got := resultsName(allScenarios); got != "results.json" {
		t.Errorf("all scenarios: %q", got)
	}
	if got := resultsName([]string{"consume", "steady"}); got != "results-steady-consume.json" {
		t.Errorf("steady and consume: %q", got)
	}
}

func TestParseList(t *testing.T) {
	t.Parallel()
	var f floatList
	if err := f.Set("1000, 5000"); err != nil || len(f) != 2 || f[1] != 5000 {
		t.Errorf("floatList %v, %v", f, err)
	}
	var d durationList
	if err := d.Set("1s,10ms"); err != nil || d.String() != "1s,10ms" {
		t.Errorf("durationList %v, %v", d, err)
	}
	if err := d.Set(""); err != nil || len(d) != 0 {
		t.Errorf("empty durationList %v, %v", d, err)
	}
	var n intList
	if err := n.Set("1,x"); err == nil {
		t.Error("intList accepted x")
	}
	if err := (consumeConfig{Messages: 10, Concurrency: []int{1}, Handlers: []string{"sleep"}, Modes: consumeModes}).validate(); err == nil {
		t.Error("an unknown handler passed validation")
	}
}

func TestLogChart(t *testing.T) {
	t.Parallel()
	a := newAxis(1.7, 820, true)
	if a.lo != 1 || a.hi != 1000 || len(a.ticks) != 4 {
		t.Errorf("log axis %+v, want 1..1000 with 4 ticks", a)
	}
	if x := a.x(10, 300); math.Abs(x-100) > 1e-9 {
		t.Errorf("10 on a 1..1000 axis 300 wide at %v, want 100", x)
	}
	if x := a.x(0.5, 300); x != 1 {
		t.Errorf("a value below the axis at %v, want the 1-pixel minimum", x)
	}
	svg := barChart(chartSpec{Title: "t", Subtitle: "s", Axis: "ms", Log: true, Format: msText,
		Bars: []bar{{Label: "a", Value: 2.345, Family: "bento-light"}, {Label: "b", Value: 820, Family: "peer"}}})
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := d.Token(); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("not well-formed: %v", err)
		}
	}
	for _, want := range []string{"2.35 ms", "820 ms", ">1,000<", barColors["bento-light"]} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
}

func TestReportRoundTrip(t *testing.T) {
	t.Parallel()
	r := &Report{Runs: 1, Scenarios: []string{"steady", "consume"},
		Steady:  summarizeSteady([]steadyResult{{Points: []steadyPoint{point("bento@1000", "bento", 1000, 2, 10, 5, 5)}}}, steadyConfig{}),
		Consume: summarizeConsume([]consumeResult{{{Handler: "noop", Mode: "inbox", Consumers: 1, Rate: 10}}}, consumeConfig{Concurrency: []int{1}, Handlers: []string{"noop"}}),
	}
	js, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if back.Steady.Rows[0].P99 != 10 || back.Consume.Rows[0].Inbox != 10 {
		t.Errorf("round trip lost figures: %+v %+v", back.Steady.Rows, back.Consume.Rows)
	}
	if cs := charts(&back); cs["steady"] == "" || cs["consume"] == "" || cs["drain"] != "" {
		t.Errorf("charts of a steady + consume report: %d", len(cs))
	}
}
