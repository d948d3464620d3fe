package doccheck_test

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// root is the repository, seen from this package's directory.
const root = "../.."

// module is the repository's module path.
const module = "github.com/bentoevents/bento"

// block is a fenced code block of a document.
type block struct {
	line int    // of the opening fence, 1-based
	info string // the fence's info string ("go", "sh", ...)
	body string
}

// prose is a line outside code blocks.
type prose struct {
	line int
	text string
}

// document is one Markdown file, split into code blocks and prose.
type document struct {
	path   string // relative to root
	blocks []block
	prose  []prose
	errs   []string // fence errors
}

var fenceRE = regexp.MustCompile("^\\s{0,3}(```+|~~~+)\\s*(.*)$")

// parseDocument splits path (relative to root) into blocks and prose lines,
// and records fences left open or written in the middle of a line.
func parseDocument(t *testing.T, path string) *document {
	t.Helper()
	f, err := os.Open(filepath.Join(root, path))
	require.NoError(t, err)
	defer f.Close()
	d := &document{path: path}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var open *block
	var fence string
	var body strings.Builder
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		m := fenceRE.FindStringSubmatch(line)
		switch {
		case open == nil && m != nil:
			open, fence = &block{line: n, info: strings.TrimSpace(m[2])}, m[1]
			body.Reset()
		case open != nil && m != nil && strings.HasPrefix(m[1], fence) && m[2] == "":
			open.body = body.String()
			d.blocks = append(d.blocks, *open)
			open = nil
		case open != nil:
			if strings.Contains(line, fence) && strings.TrimSpace(line) != "" && !strings.HasPrefix(strings.TrimSpace(line), fence) {
				d.errs = append(d.errs, fmt.Sprintf("%s:%d: a fence in the middle of a line inside the block opened at line %d", path, n, open.line))
			}
			body.WriteString(line)
			body.WriteByte('\n')
		default:
			// ``` inside an inline code span is text; anywhere else on a
			// line it is a fence that Markdown does not see as one.
			if strings.Contains(stripInlineCode(line), "```") {
				d.errs = append(d.errs, fmt.Sprintf("%s:%d: a code fence in the middle of a line", path, n))
			}
			d.prose = append(d.prose, prose{line: n, text: line})
		}
	}
	require.NoError(t, sc.Err())
	if open != nil {
		d.errs = append(d.errs, fmt.Sprintf("%s:%d: code block never closed", path, open.line))
	}
	return d
}

var inlineCodeRE = regexp.MustCompile("``[^`]+``|`[^`]+`")

// stripInlineCode removes the inline code spans of a line.
func stripInlineCode(s string) string { return inlineCodeRE.ReplaceAllString(s, "") }

// documents are the Markdown files the checks read.
func documents(t *testing.T) []*document {
	t.Helper()
	paths := []string{"README.md", "CHANGELOG.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	for _, p := range more {
		rel, err := filepath.Rel(root, p)
		require.NoError(t, err)
		paths = append(paths, rel)
	}
	var out []*document
	for _, p := range paths {
		out = append(out, parseDocument(t, p))
	}
	return out
}

func TestCodeFencesAreBalanced(t *testing.T) {
	t.Parallel()
	for _, d := range documents(t) {
		for _, e := range d.errs {
			t.Error(e)
		}
	}
}

var linkRE = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

func TestRelativeLinksExist(t *testing.T) {
	t.Parallel()
	for _, d := range documents(t) {
		for _, p := range d.prose {
			for _, m := range linkRE.FindAllStringSubmatch(stripInlineCode(p.text), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
					continue
				}
				target, _, _ = strings.Cut(target, "#")
				full := filepath.Join(root, filepath.Dir(d.path), target)
				_, err := os.Stat(full)
				assert.NoError(t, err, "%s:%d: link to %s", d.path, p.line, m[1])
			}
		}
	}
}

// outside are the words that point outside the repository.
var outside = []string{"DESIGN.md", "STYLE.md", "../shared", "seeds/"}

func TestDocumentsStandOnTheirOwn(t *testing.T) {
	t.Parallel()
	for _, d := range documents(t) {
		for _, p := range d.prose {
			for _, w := range outside {
				assert.NotContains(t, p.text, w, "%s:%d cites something outside the repository", d.path, p.line)
			}
		}
		for _, b := range d.blocks {
			for _, w := range outside {
				assert.NotContains(t, b.body, w, "%s:%d: a code block cites something outside the repository", d.path, b.line)
			}
		}
	}
}

// index holds the names the repository's Go code declares, per package:
// "Name" for a top-level declaration and "Type.Name" for a method, a
// struct field or an interface method. Packages are keyed by name; a main
// package by its directory's name.
type index struct {
	names map[string]map[string]bool
	paths map[string]string // package key -> import path
	tests map[string]bool   // every Test, Benchmark, Example and Fuzz function
}

var (
	indexOnce sync.Once
	repoIndex *index
	indexErr  error
)

func loadIndex(t *testing.T) *index {
	t.Helper()
	indexOnce.Do(func() { repoIndex, indexErr = buildIndex() })
	require.NoError(t, indexErr)
	return repoIndex
}

func buildIndex() (*index, error) {
	ix := &index{names: map[string]map[string]bool{}, paths: map[string]string{}, tests: map[string]bool{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if name := e.Name(); path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		key := strings.TrimSuffix(f.Name.Name, "_test")
		if key == "main" {
			key = filepath.Base(dir)
		}
		if ix.names[key] == nil {
			ix.names[key] = map[string]bool{}
		}
		if !strings.HasSuffix(path, "_test.go") && !strings.HasPrefix(dir, "bench") && !strings.HasPrefix(dir, "examples/") {
			ix.paths[key] = module + "/" + filepath.ToSlash(dir)
		}
		add := func(name string) { ix.names[key][name] = true }
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					add(d.Name.Name)
					for _, prefix := range []string{"Test", "Benchmark", "Example", "Fuzz"} {
						if strings.HasPrefix(d.Name.Name, prefix) {
							ix.tests[d.Name.Name] = true
						}
					}
					continue
				}
				typ := d.Recv.List[0].Type
				if star, ok := typ.(*ast.StarExpr); ok {
					typ = star.X
				}
				if g, ok := typ.(*ast.IndexExpr); ok {
					typ = g.X
				}
				if g, ok := typ.(*ast.IndexListExpr); ok {
					typ = g.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					add(id.Name + "." + d.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						add(s.Name.Name)
						var fields *ast.FieldList
						switch tt := s.Type.(type) {
						case *ast.StructType:
							fields = tt.Fields
						case *ast.InterfaceType:
							fields = tt.Methods
						}
						if fields == nil {
							continue
						}
						for _, fl := range fields.List {
							for _, n := range fl.Names {
								add(s.Name.Name + "." + n.Name)
							}
							if len(fl.Names) == 0 { // embedded: its name
								ft := fl.Type
								if star, ok := ft.(*ast.StarExpr); ok {
									ft = star.X
								}
								switch e := ft.(type) {
								case *ast.Ident:
									add(s.Name.Name + "." + e.Name)
								case *ast.SelectorExpr:
									add(s.Name.Name + "." + e.Sel.Name)
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							add(n.Name)
						}
					}
				}
			}
		}
		return nil
	})
	return ix, err
}

// has reports whether pkg declares name ("Name" or "Type.Member"). A
// member of an embedded type counts as the embedding type's member.
func (ix *index) has(pkg, name string) bool {
	names := ix.names[pkg]
	if names[name] {
		return true
	}
	typ, member, ok := strings.Cut(name, ".")
	if !ok || !names[typ] {
		return false
	}
	for n := range names { // one level of embedding within the package
		if emb, ok := strings.CutPrefix(n, typ+"."); ok && names[emb] && names[emb+"."+member] {
			return true
		}
	}
	return false
}

var (
	spanRE   = regexp.MustCompile("`([^`]+)`")
	symbolRE = regexp.MustCompile(`^\*?([a-z][a-z0-9]*)\.([A-Z]\w*)(?:\.([A-Z]\w*))?(?:\[[^\]]*\])?(?:\(.*\))?$`)
	testRE   = regexp.MustCompile(`^(?:Test|Benchmark|Example|Fuzz)\w*$`)
	fileRE   = regexp.MustCompile(`^[\w.-]+(?:/[\w.-]+)*\.(?:go|sql|sh|md|json|yaml|yml|svg|html|css|txt)$`)
)

func TestNamedSymbolsTestsAndFilesExist(t *testing.T) {
	t.Parallel()
	ix := loadIndex(t)
	for _, d := range documents(t) {
		if d.path == "CHANGELOG.md" {
			continue // a history names what no longer exists
		}
		for _, p := range d.prose {
			for _, m := range spanRE.FindAllStringSubmatch(p.text, -1) {
				span := strings.TrimSpace(m[1])
				where := fmt.Sprintf("%s:%d: `%s`", d.path, p.line, span)
				switch {
				case symbolRE.MatchString(span):
					s := symbolRE.FindStringSubmatch(span)
					pkg, name := s[1], s[2]
					if s[3] != "" {
						name += "." + s[3]
					}
					if _, known := ix.names[pkg]; !known {
						continue // a variable or a package not in this repository
					}
					assert.True(t, ix.has(pkg, name), "%s: %s declares no %s", where, pkg, name)
				case testRE.MatchString(span):
					assert.True(t, ix.tests[span], "%s: no such test, benchmark or example", where)
				case fileRE.MatchString(span) && strings.Contains(span, "/"):
					_, errRoot := os.Stat(filepath.Join(root, span))
					_, errHere := os.Stat(filepath.Join(root, filepath.Dir(d.path), span))
					assert.True(t, errRoot == nil || errHere == nil, "%s: no such file", where)
				}
			}
		}
	}
}

// stdImports are the standard and third-party packages Go blocks may use
// without importing them, by the name they are used under.
var stdImports = map[string]string{
	"context": "context", "errors": "errors", "fmt": "fmt", "http": "net/http", "io": "io",
	"json": "encoding/json", "log": "log", "os": "os", "signal": "os/signal", "slog": "log/slog",
	"sql": "database/sql", "strings": "strings", "sync": "sync", "syscall": "syscall",
	"testing": "testing", "time": "time",
	"gorm":       "gorm.io/gorm",
	"postgres":   "gorm.io/driver/postgres",
	"sqlite":     "github.com/glebarez/sqlite",
	"message":    "github.com/ThreeDotsLabs/watermill/message",
	"amqp":       "github.com/rabbitmq/amqp091-go",
	"prometheus": "github.com/prometheus/client_golang/prometheus",
	"promhttp":   "github.com/prometheus/client_golang/prometheus/promhttp",
}

// exportData maps import paths to their compiled export data, from
// `go list -export`, for the type checker.
func exportData(t *testing.T, paths []string) map[string]string {
	t.Helper()
	args := append([]string{"list", "-export", "-deps", "-f", "{{if .Export}}{{.ImportPath}}={{.Export}}{{end}}"}, paths...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())
	m := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if path, file, ok := strings.Cut(line, "="); ok {
			m[path] = file
		}
	}
	return m
}

// tolerated are the type errors a fragment may have: it uses variables
// the surrounding prose defines, and may leave them unused.
var tolerated = []*regexp.Regexp{
	regexp.MustCompile(`^undefined: [A-Za-z_]\w*$`),
	regexp.MustCompile(`declared and not used`),
	regexp.MustCompile(`imported and not used`),
	regexp.MustCompile(`^missing return$`),
	regexp.MustCompile(`^no new variables on left side of :=$`),
	regexp.MustCompile(`redeclared in this block`),
	regexp.MustCompile(`^label \w+ declared and not used$`),
}

// checker type-checks Go blocks against the packages they name.
type checker struct {
	ix      *index
	fset    *token.FileSet
	imp     types.Importer
	pkgRE   *regexp.Regexp
	exports map[string]string
}

// newChecker builds the export data of every package the bodies name.
func newChecker(t *testing.T, bodies []string) *checker {
	t.Helper()
	c := &checker{ix: loadIndex(t), fset: token.NewFileSet(), pkgRE: regexp.MustCompile(`\b([a-z][a-z0-9]*)\.[A-Za-z_]`)}
	var paths []string
	for _, body := range bodies {
		for _, m := range c.pkgRE.FindAllStringSubmatch(body, -1) {
			if p := c.importOf(m[1]); p != "" {
				paths = append(paths, p)
			}
		}
	}
	sort.Strings(paths)
	c.exports = exportData(t, slices.Compact(paths))
	c.imp = importer.ForCompiler(c.fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := c.exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
	return c
}

func (c *checker) importOf(name string) string {
	if p, ok := c.ix.paths[name]; ok {
		return p
	}
	return stdImports[name]
}

// check returns the type errors of body that a fragment may not have, or
// the parse error when body is neither declarations nor statements. The
// packages body names are imported under their names.
func (c *checker) check(where, body string) ([]string, error) {
	var imports []string
	names := map[string]bool{}
	for _, m := range c.pkgRE.FindAllStringSubmatch(body, -1) {
		if p := c.importOf(m[1]); p != "" && !names[m[1]] {
			names[m[1]] = true
			imports = append(imports, fmt.Sprintf("%s %q", m[1], p))
		}
	}
	head := "package doc\n\nimport (\n\t" + strings.Join(imports, "\n\t") + "\n)\n\n"
	if strings.HasPrefix(strings.TrimSpace(body), "package ") {
		head = ""
	}
	file, err := parser.ParseFile(c.fset, where, head+body, parser.SkipObjectResolution)
	if err != nil {
		file, err = parser.ParseFile(c.fset, where, head+"func _() {\n"+body+"\n}\n", parser.SkipObjectResolution)
	}
	if err != nil {
		return nil, fmt.Errorf("parses neither as declarations nor as statements: %w", err)
	}
	var problems []string
	conf := types.Config{Importer: c.imp, Error: func(err error) {
		msg := err.(types.Error).Msg
		for _, re := range tolerated {
			if re.MatchString(msg) {
				return
			}
		}
		problems = append(problems, msg)
	}}
	_, _ = conf.Check("doc", c.fset, []*ast.File{file}, nil)
	return problems, nil
}

// TestGoBlocksTypeCheck type-checks every Go code block against the
// packages it names: as a file when its declarations parse on their own,
// else as the body of a function. Names the prose defines (db, ctx, ...)
// may stay undefined, but every use of a package's API must match it: a
// renamed function, a wrong number of results or arguments, a missing
// field or method fails.
func TestGoBlocksTypeCheck(t *testing.T) {
	t.Parallel()
	var bodies []string
	type goBlock struct {
		where string
		body  string
	}
	var blocks []goBlock
	for _, d := range documents(t) {
		for _, b := range d.blocks {
			if b.info == "go" {
				blocks = append(blocks, goBlock{fmt.Sprintf("%s:%d", d.path, b.line), b.body})
				bodies = append(bodies, b.body)
			}
		}
	}
	require.NotEmpty(t, blocks)
	c := newChecker(t, bodies)
	for _, b := range blocks {
		problems, err := c.check(b.where, b.body)
		if assert.NoError(t, err, b.where) {
			assert.Empty(t, problems, "%s: the Go block does not type-check:\n%s", b.where, b.body)
		}
	}
}

// TestTypeCheckCatchesDrift shows the checker failing blocks that have
// drifted from the API, and passing the same blocks written right.
func TestTypeCheckCatchesDrift(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, body string
		ok         bool
	}{
		{"right", "env := bentotest.New(t, nil)\nc := env.MustConsumer(t, \"notification\")\n_ = c\n", true},
		{"two results into one", "env := bentotest.New(t, nil)\nc := env.Consumer(t, \"notification\")\n_ = c\n", false},
		{"renamed function", "p, err := projector.NewOutboxProjector(store, pub, nil)\n", false},
		{"missing field", "cfg := &outbox.Config{MaxPayload: 1}\n_ = cfg\n", false},
		{"wrong argument count", "err := outbox.Migrate(ctx)\n", false},
		{"declarations", "type Order struct {\n\taggregate.Base\n}\n\nfunc (*Order) AggregateType() string { return \"order\" }\n", true},
	}
	var bodies []string
	for _, c := range cases {
		bodies = append(bodies, c.body)
	}
	c := newChecker(t, bodies)
	for _, tc := range cases {
		problems, err := c.check(tc.name, tc.body)
		require.NoError(t, err, tc.name)
		if tc.ok {
			assert.Empty(t, problems, tc.name)
		} else {
			assert.NotEmpty(t, problems, "%s: the checker let a drifted block through", tc.name)
		}
	}
}
