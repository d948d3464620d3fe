package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/testenv"
)

const (
	alertRules = "../../deploy/prometheus/bento-alerts.yml"
	dashboard  = "../../deploy/grafana/bento-dashboard.json"
	operations = "../../docs/operations.md"
)

// rules returns the alerting rules' names and expressions.
func rules(t *testing.T) (names, exprs []string) {
	t.Helper()
	b, err := os.ReadFile(alertRules)
	require.NoError(t, err)
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(b, &f))
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			names, exprs = append(names, r.Alert), append(exprs, r.Expr)
		}
	}
	require.NotEmpty(t, names)
	return names, exprs
}

// panelExprs returns the queries of the dashboard's panels.
func panelExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dashboard)
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	var out []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	require.NotEmpty(t, out)
	return out
}

var metricName = regexp.MustCompile(`\bbento_[a-z0-9_]+\b`)

// TestDashboardAndAlertsUseExportedMetrics runs minishop on PostgreSQL and
// RabbitMQ, places and pays an order, and checks that every metric the
// Grafana dashboard and the Prometheus alerting rules in deploy/ use is
// exported on its /metrics; that the rules pass promtool check rules; and
// that each alert has its runbook line in docs/operations.md.
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	names, exprs := rules(t)
	exprs = append(exprs, panelExprs(t)...)
	used := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricName.FindAllString(e, -1) {
			used[m] = true
		}
	}

	ex := testenv.NewExchange(t)
	_, dsn := testenv.Postgres(t)
	deleteQueues(t, ex.URL, groupQueues()...)
	ex.Queues(groupQueues()...)
	for group := range groupBindings {
		ex.Partitioned(group, consumer.DefaultPartitions)
	}
	p := start(t, []string{"DATABASE_URL=" + dsn, "AMQP_URL=" + ex.URL, "MINISHOP_EXCHANGE=" + ex.Name}, "-addr", "127.0.0.1:0")
	placed := call(t, "POST", p.url+"/orders", `{"customer_id":"c1","items":[{"sku":"apple","qty":1}]}`, nil)
	require.Equal(t, 201, placed.status, "%s", placed.body)
	id := placed.json(t)["id"].(string)
	require.Equal(t, 200, call(t, "POST", p.url+"/orders/"+id+"/pay", "", nil).status)
	testenv.WaitFor(t, 30*time.Second, "the notification", func() bool { return len(notifications(t, p.url, id)) == 1 })

	// The gauges read from the database and the broker refresh at start,
	// the histograms fill as messages are handled: give them a moment.
	var lacking []string
	testenv.Poll(30*time.Second, func() bool { lacking = missing(used, families(t, p.url)); return len(lacking) == 0 })
	assert.Empty(t, lacking, "used by deploy/ but not exported by minishop")

	doc, err := os.ReadFile(operations)
	require.NoError(t, err)
	for _, n := range names {
		assert.True(t, strings.Contains(string(doc), "- **`"+n+"`**"), "a runbook line for %s in docs/operations.md", n)
	}

	promtool := os.Getenv("BENTO_PROMTOOL")
	if promtool == "" {
		promtool, _ = exec.LookPath("promtool")
	}
	if promtool == "" {
		msg := "promtool not found; install it with: bash scripts/promtool.sh"
		if testenv.InCI() {
			t.Fatal(msg + " (CI is set, so this is a failure)")
		}
		t.Skip(msg)
	}
	out, err := exec.Command(promtool, "check", "rules", alertRules).CombinedOutput()
	assert.NoError(t, err, "promtool check rules:\n%s", out)
	assert.Contains(t, string(out), "SUCCESS")
}

// families returns the metric families minishop exports, by name, with
// their types.
func families(t *testing.T, base string) map[string]string {
	t.Helper()
	r := call(t, "GET", base+"/metrics", "", nil)
	require.Equal(t, 200, r.status)
	out := map[string]string{}
	for _, line := range strings.Split(string(r.body), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = f[3]
		}
	}
	return out
}

// missing returns the names in used that exported lacks: a name is there
// as a family, or as a histogram's _bucket, _sum or _count series.
func missing(used map[string]bool, exported map[string]string) []string {
	var out []string
	for name := range used {
		if _, ok := exported[name]; ok {
			continue
		}
		found := false
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] == "histogram" {
				found = true
			}
		}
		if !found {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
