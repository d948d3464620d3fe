package outbox_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The package's SQL lives in queries.go. Any other non-test .go file of the
// package breaks the rule when it has
//   - a string literal containing one of sqlKeywords (upper case, as the
//     package writes SQL), or
//   - a call of one of sqlMethods (GORM's calls that take SQL text) whose
//     first argument is, or is built with, a string literal.
var (
	sqlKeywords = []string{"SELECT ", "UPDATE ", "DELETE ", "INSERT "}
	sqlMethods  = map[string]bool{
		"Raw": true, "Exec": true, "Where": true, "Not": true, "Or": true, "Select": true,
		"Order": true, "Group": true, "Having": true, "Joins": true, "Expr": true,
	}
)

// sqlOutsideQueries returns where the Go source src, named name, breaks the
// rule above.
func sqlOutsideQueries(t *testing.T, name, src string) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	require.NoError(t, err)
	var found []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BasicLit:
			if n.Kind != token.STRING {
				return true
			}
			for _, k := range sqlKeywords {
				if strings.Contains(n.Value, k) {
					found = append(found, fset.Position(n.Pos()).String()+": literal with "+strings.TrimSpace(k))
				}
			}
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok || !sqlMethods[sel.Sel.Name] || len(n.Args) == 0 || !hasStringLit(n.Args[0]) {
				return true
			}
			found = append(found, fset.Position(n.Pos()).String()+": "+sel.Sel.Name+" with a literal")
		}
		return true
	})
	return found
}

// hasStringLit reports whether e is a string literal or a concatenation
// with one.
func hasStringLit(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.BasicLit:
		return e.Kind == token.STRING
	case *ast.ParenExpr:
		return hasStringLit(e.X)
	case *ast.BinaryExpr:
		return e.Op == token.ADD && (hasStringLit(e.X) || hasStringLit(e.Y))
	}
	return false
}

func TestSQLOnlyInQueriesFile(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	checked := 0
	for _, name := range files {
		if name == "queries.go" || strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		assert.Empty(t, sqlOutsideQueries(t, name, string(src)), "%s: SQL belongs in queries.go", name)
		checked++
	}
	assert.Greater(t, checked, 5, "the package's files were not found")
}

func TestSQLOnlyInQueriesFileCatches(t *testing.T) {
	t.Parallel()
	for name, src := range map[string]string{
		"keyword in a constant":    "const q = `SELECT id FROM outbox_events`",
		"keyword in a string":      `var q = "DELETE FROM outbox_events"`,
		"Where with a literal":     `func f() { db.Where("status = ?", x) }`,
		"Exec with a concatenated": `func f() { db.Exec(q + " AND tenant_id = @tenant") }`,
		"Expr with a literal":      `func f() { gorm.Expr("now()") }`,
	} {
		assert.NotEmpty(t, sqlOutsideQueries(t, "bad.go", "package outbox\n"+src), name)
	}
	for name, src := range map[string]string{
		"named constant": `func f() { db.Exec(markSentSQL, args) }`,
		"builder":        `func f() { db.Raw(countSentSQL(tenant != ""), args) }`,
		"error message":  `var err = errors.New("outbox: delete sent: empty worker")`,
	} {
		assert.Empty(t, sqlOutsideQueries(t, "good.go", "package outbox\n"+src), name)
	}
}
