package console

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// dataPackages are the packages whose functions read or change the outbox
// and the broker.
var dataPackages = map[string]bool{"outbox": true, "consumer": true, "rabbitmq": true, "inbox": true, "dbbus": true, "process": true}

// pureFuncs are the functions of dataPackages that reach no data.
var pureFuncs = map[string]bool{"rabbitmq.UnroutableQueue": true, "process.ValidateTable": true}

// TestOnlyTheScopeReachesTheData: no file of the package but scope.go
// calls a function of the outbox, consumer, rabbitmq, dbbus, inbox or process packages
// (but names), or touches a store field or the scope's inspector, so
// every page and action, today's and tomorrow's, goes through the scope
// and its tenant.
func TestOnlyTheScopeReachesTheData(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if name == "scope.go" || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if pkg, ok := sel.X.(*ast.Ident); ok && dataPackages[pkg.Name] && !pureFuncs[pkg.Name+"."+sel.Sel.Name] {
					t.Errorf("%s: %s.%s called outside scope.go: go through c.data, which keeps to Config.Tenant",
						fset.Position(n.Pos()), pkg.Name, sel.Sel.Name)
				}
			case *ast.SelectorExpr:
				if n.Sel.Name == "store" || n.Sel.Name == "inspector" {
					t.Errorf("%s: .%s used outside scope.go: go through c.data, which keeps to Config.Tenant",
						fset.Position(n.Pos()), n.Sel.Name)
				}
			}
			return true
		})
	}
	if checked < 5 {
		t.Fatalf("checked %d files: not the console's directory?", checked)
	}
}
