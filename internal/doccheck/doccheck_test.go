package doccheck_test

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/doc/comment"
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
	mark string // the marker comment on the line before the fence, if any
}

// Markers a Go block may carry on the line before its fence:
//
//	<!-- fragment -->                       uses names the prose defines
//	<!-- excerpt: examples/x/main.go -->    appears verbatim in that file
//
// An unmarked Go block must compile on its own.
var markRE = regexp.MustCompile(`^<!--\s*(fragment|excerpt:\s*\S+)\s*-->$`)

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
			if k := len(d.prose); k > 0 && d.prose[k-1].line == n-1 {
				if mm := markRE.FindStringSubmatch(strings.TrimSpace(d.prose[k-1].text)); mm != nil {
					open.mark = mm[1]
				}
			}
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
			// A public package owns its name over an internal one of the
			// same name (partition and internal/partition): docs use the
			// public one.
			if old, ok := ix.paths[key]; !ok || strings.HasPrefix(old, module+"/internal/") {
				ix.paths[key] = module + "/" + filepath.ToSlash(dir)
			}
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

// check type-checks body, importing the packages it names under their
// names, as a file when its declarations parse on their own, else as the
// body of a function. It returns the type errors, leaving out those a
// fragment may have when fragment is set, or the parse error when body is
// neither declarations nor statements.
func (c *checker) check(where, body string, fragment bool) ([]string, error) {
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
			if fragment && re.MatchString(msg) {
				return
			}
		}
		problems = append(problems, msg)
	}}
	_, _ = conf.Check("doc", c.fset, []*ast.File{file}, nil)
	return problems, nil
}

// goBlock is a Go code block of a document.
type goBlock struct {
	where string // path:line
	block
}

func goBlocks(t *testing.T) []goBlock {
	t.Helper()
	var out []goBlock
	for _, d := range documents(t) {
		for _, b := range d.blocks {
			if b.info == "go" {
				out = append(out, goBlock{fmt.Sprintf("%s:%d", d.path, b.line), b})
			}
		}
	}
	require.NotEmpty(t, out)
	return out
}

// TestGoBlocksCompile checks every Go code block of the documents. A block
// marked as an excerpt must appear verbatim in the file it names, which
// the build compiles. A block marked as a fragment may use names the
// prose defines (db, ctx, ...) and leave variables unused, but every use
// of a package's API must match it: a renamed function, a wrong number of
// results or arguments, a missing field or method fails. Any other block
// must compile on its own, its imports aside.
func TestGoBlocksCompile(t *testing.T) {
	t.Parallel()
	blocks := goBlocks(t)
	var bodies []string
	for _, b := range blocks {
		bodies = append(bodies, b.body)
	}
	c := newChecker(t, bodies)
	for _, b := range blocks {
		if path, ok := strings.CutPrefix(b.mark, "excerpt:"); ok {
			src, err := os.ReadFile(filepath.Join(root, strings.TrimSpace(path)))
			if assert.NoError(t, err, "%s: the file of an excerpt", b.where) {
				assert.True(t, strings.Contains(string(src), strings.Trim(b.body, "\n")),
					"%s: the excerpt is not in %s as written:\n%s", b.where, path, b.body)
			}
			continue
		}
		problems, err := c.check(b.where, b.body, b.mark == "fragment")
		if assert.NoError(t, err, b.where) {
			assert.Empty(t, problems, "%s: the Go block does not compile (mark it <!-- fragment --> if it uses names the prose defines):\n%s", b.where, b.body)
		}
	}
}

// TestMarkersAreRecognised shows that a marker applies to the block right
// after it, and only to it.
func TestMarkersAreRecognised(t *testing.T) {
	t.Parallel()
	doc := "text\n<!-- fragment -->\n```go\nx := 1\n```\n\n<!-- excerpt: a/b.go -->\n```go\ny\n```\n\n```go\nz\n```\n"
	path := filepath.Join(t.TempDir(), "doc.md")
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
	abs, err := filepath.Abs(root)
	require.NoError(t, err)
	rel, err := filepath.Rel(abs, path)
	require.NoError(t, err)
	d := parseDocument(t, rel)
	require.Len(t, d.blocks, 3)
	assert.Equal(t, "fragment", d.blocks[0].mark)
	assert.Equal(t, "excerpt: a/b.go", d.blocks[1].mark)
	assert.Empty(t, d.blocks[2].mark)
}

// TestTypeCheckCatchesDrift shows the checker failing blocks that have
// drifted from the API, and passing the same blocks written right.
func TestTypeCheckCatchesDrift(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, body string
		fragment   bool
		ok         bool
	}{
		{"right", "env := bentotest.New(t, nil)\nc := env.MustConsumer(t, \"notification\")\n_ = c\n", true, true},
		{"two results into one", "env := bentotest.New(t, nil)\nc := env.Consumer(t, \"notification\")\n_ = c\n", true, false},
		{"renamed function", "p, err := projector.NewOutboxProjector(store, pub, nil)\n", true, false},
		{"missing field", "cfg := &outbox.Config{MaxPayload: 1}\n_ = cfg\n", true, false},
		{"wrong argument count", "err := outbox.Migrate(ctx)\n", true, false},
		{"declarations", "type Order struct {\n\taggregate.Base\n}\n\nfunc (*Order) AggregateType() string { return \"order\" }\n", false, true},
		{"unmarked block with an undefined name", "err := outbox.Migrate(ctx, db)\n_ = err\n", false, false},
		{"unmarked block left unused", "var ctx context.Context\nvar db *gorm.DB\nerr := outbox.Migrate(ctx, db)\n", false, false},
		{"unmarked block that compiles", "var ctx context.Context\nvar db *gorm.DB\nerr := outbox.Migrate(ctx, db)\n_ = err\n", false, true},
	}
	var bodies []string
	for _, c := range cases {
		bodies = append(bodies, c.body)
	}
	c := newChecker(t, bodies)
	for _, tc := range cases {
		problems, err := c.check(tc.name, tc.body, tc.fragment)
		require.NoError(t, err, tc.name)
		if tc.ok {
			assert.Empty(t, problems, tc.name)
		} else {
			assert.NotEmpty(t, problems, "%s: the checker let a drifted block through", tc.name)
		}
	}
}

// packageDocCode returns the code blocks of the package doc comments of
// the repository's Go files that name one of bento's packages, keyed by
// file:line.
func packageDocCode(t *testing.T, c *checker) map[string]string {
	t.Helper()
	out := map[string]string{}
	fset := token.NewFileSet()
	var p comment.Parser
	err := filepath.WalkDir(root, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if name := e.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil || f.Doc == nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for i, b := range p.Parse(f.Doc.Text()).Content {
			code, ok := b.(*comment.Code)
			if !ok {
				continue
			}
			for _, m := range c.pkgRE.FindAllStringSubmatch(code.Text, -1) {
				if _, bento := c.ix.paths[m[1]]; bento {
					out[fmt.Sprintf("%s (package doc, block %d)", rel, i)] = code.Text
					break
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// TestPackageDocCodeTypeChecks checks the code in package doc comments as
// fragments: the examples a reader meets first in the API reference must
// match the API.
func TestPackageDocCodeTypeChecks(t *testing.T) {
	t.Parallel()
	c := &checker{ix: loadIndex(t), pkgRE: regexp.MustCompile(`\b([a-z][a-z0-9]*)\.[A-Za-z_]`)}
	blocks := packageDocCode(t, c)
	require.NotEmpty(t, blocks)
	var bodies []string
	for _, body := range blocks {
		bodies = append(bodies, body)
	}
	c = newChecker(t, bodies)
	for where, body := range blocks {
		problems, err := c.check(where, body, true)
		if assert.NoError(t, err, "%s:\n%s", where, body) {
			assert.Empty(t, problems, "%s: the code does not type-check:\n%s", where, body)
		}
	}
}
