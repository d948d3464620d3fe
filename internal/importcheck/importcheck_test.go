package importcheck

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// module is the import path of bento's main module.
const module = "github.com/bentoevents/bento"

// allowed lists, by package under internal/, the bento packages outside
// internal/ it may import (non-test imports), each with the reason. Every
// other such import fails TestInternalPackagesImportOnlyDownward, and so
// does an exception no longer used, so the list stays exact. bentotest is
// never allowed, not even through another package.
var allowed = map[string]map[string]string{
	"internal/instance": {
		"aggregate": "an instance id ends in a fresh aggregate.NewID, the one id generator",
	},
	"internal/partition": {
		"partition": "the options, results and errors of partition maintenance are the public package's; the machinery hands them back unconverted",
		"aggregate": "a nil MaintainOpts.Clock means aggregate.SystemClock, the one default clock",
	},
	"internal/buscheck": {
		"messaging": "the checks the memory bus and RabbitMQ tests share build messages with messaging's metadata keys and partition names",
	},
	"internal/testenv": {
		"messaging": "partition queue names come from messaging.PartitionQueue, the one place that forms them",
	}, // deadfixture is a test fixture: the failing consumer the dead-letter
	// tests of cmd/bento and console share. It drives the public API as a
	// user's consumer would; no library package imports it.
	"internal/deadfixture": {
		"aggregate": "the fixture's event ids and aggregate ids",
		"consumer":  "it runs a partitioned consumer whose handler fails for good",
		"dbbus":     "it runs that consumer on the database bus too, for the database-bus variants of the tests",
		"inbox":     "it creates the inbox tables the consumer writes",
		"messaging": "it builds the fixture's events with messaging.NewMessage, and its handler takes a messaging.Envelope",
		"rabbitmq":  "it publishes the fixture's events over AMQP",
		"outbox":    "it builds the events as outbox rows, as the relay does",
	},
}

// forbidden is the public package no internal package may depend on.
const forbidden = "bentotest"

// pkg is what go list says of one package: its path, its non-test
// imports, and every package it depends on.
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// rel returns path relative to the module ("internal/testenv"), and
// whether it is in the module.
func rel(path string) (string, bool) {
	if path == module {
		return "", true
	}
	return strings.CutPrefix(path, module+"/")
}

func isInternal(r string) bool { return r == "internal" || strings.HasPrefix(r, "internal/") }

// problems returns every breach of the rule among pkgs, sorted.
func problems(pkgs []pkg, allowed map[string]map[string]string) []string {
	var out []string
	used := map[string]map[string]bool{}
	for _, p := range pkgs {
		from, ok := rel(p.ImportPath)
		if !ok || !isInternal(from) {
			continue
		}
		for _, imp := range p.Imports {
			to, ok := rel(imp)
			if !ok || isInternal(to) {
				continue
			}
			if _, ok := allowed[from][to]; ok && to != forbidden {
				if used[from] == nil {
					used[from] = map[string]bool{}
				}
				used[from][to] = true
				continue
			}
			out = append(out, fmt.Sprintf("%s imports %s: a package under internal/ imports no public bento package except those listed in allowed, with a reason", from, to))
		}
		for _, dep := range p.Deps {
			if to, _ := rel(dep); to == forbidden && !slices.Contains(p.Imports, dep) {
				out = append(out, fmt.Sprintf("%s depends on %s through another package: no package under internal/ may", from, forbidden))
			}
		}
	}
	for from, tos := range allowed {
		for to := range tos {
			if to == forbidden {
				out = append(out, fmt.Sprintf("allowed lists %s importing %s, which no package under internal/ may import: remove the entry", from, to))
				continue
			}
			if !used[from][to] {
				out = append(out, fmt.Sprintf("allowed lists %s importing %s, which it no longer does: remove the entry", from, to))
			}
		}
	}
	slices.Sort(out)
	return out
}

// list runs go list on every package of the module.
func list(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps", module+"/...")
	cmd.Dir = "../.."
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		err := dec.Decode(&p)
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestInternalPackagesImportOnlyDownward(t *testing.T) {
	t.Parallel()
	pkgs := list(t)
	var internal []string
	for _, p := range pkgs {
		if r, _ := rel(p.ImportPath); isInternal(r) {
			internal = append(internal, r)
		}
	}
	require.Contains(t, internal, "internal/testenv", "go list saw the internal packages")
	assert.Empty(t, problems(pkgs, allowed))
}

// TestProblemsAreFound feeds the rule a module whose internal packages
// breach it in every way it knows.
func TestProblemsAreFound(t *testing.T) {
	t.Parallel()
	p := func(path string, imports, deps []string) pkg {
		abs := func(rs []string) []string {
			var out []string
			for _, r := range rs {
				out = append(out, module+"/"+r)
			}
			return out
		}
		return pkg{ImportPath: module + "/" + path, Imports: abs(imports), Deps: abs(deps)}
	}
	pkgs := []pkg{
		p("internal/testenv", []string{"bentotest", "messaging", "internal/dialect"}, []string{"bentotest", "messaging", "internal/dialect"}),
		p("internal/migrate", []string{"outbox"}, []string{"outbox"}),
		p("internal/dialect", []string{"internal/txn"}, []string{"internal/txn"}),
		p("internal/tracing", []string{"messaging"}, []string{"messaging", "bentotest"}),
		p("outbox", []string{"internal/dialect", "bentotest"}, []string{"internal/dialect", "bentotest"}),
	}
	allow := map[string]map[string]string{
		"internal/testenv":  {"messaging": "a reason", "bentotest": "no reason is enough"},
		"internal/tracing":  {"messaging": "a reason"},
		"internal/instance": {"aggregate": "gone"},
	}
	assert.Equal(t, []string{
		"allowed lists internal/instance importing aggregate, which it no longer does: remove the entry",
		"allowed lists internal/testenv importing bentotest, which no package under internal/ may import: remove the entry",
		"internal/migrate imports outbox: a package under internal/ imports no public bento package except those listed in allowed, with a reason",
		"internal/testenv imports bentotest: a package under internal/ imports no public bento package except those listed in allowed, with a reason",
		"internal/tracing depends on bentotest through another package: no package under internal/ may",
	}, problems(pkgs, allow))
}
