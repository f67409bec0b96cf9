package archtest

import (
	"bytes"
	"encoding/json"
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
	"sort"
	"strings"
	"sync"
	"testing"
)

// The daemon's parts (docs/design/daemon.md, "Who owns what"): intake,
// run control, the scheduler, the lander and live output reach each
// other, and the outside, only through the ports they declare; the
// daemon wires them. job, state and
// checks are what they all name: job and state import no part, checks
// only state (the type of its outbox port). Nothing but the CLI imports
// the daemon, and the rig (the -short tests' outside world) imports no
// part, so every part's tests can use it.
var parts = map[string][]string{
	// part: the parts it may import
	"internal/parts/intake":    {"internal/rules/job", "internal/parts/checks", "internal/parts/state"},
	"internal/parts/scheduler": {"internal/rules/job", "internal/parts/checks", "internal/parts/state"},
	"internal/parts/lander":    {"internal/rules/job", "internal/parts/checks", "internal/parts/state"},
	"internal/parts/runctl":    {"internal/rules/job", "internal/parts/checks", "internal/parts/state"},
	"internal/parts/checks":    {"internal/parts/state"},
	"internal/rules/job":       nil,
	"internal/parts/state":     nil,
	"internal/parts/rig":       {"internal/rules/job"},
	"internal/parts/live":      {"internal/rules/job"},
}

func TestPartsImportNoOtherPart(t *testing.T) {
	t.Parallel()
	var pkgs []string
	for p := range parts {
		pkgs = append(pkgs, module+p)
	}
	sort.Strings(pkgs)
	graph := importGraph(t, pkgs...)
	others := append([]string{"internal/daemon", "internal/cli"}, keys(parts)...)
	for _, p := range pkgs {
		allowed := map[string]bool{p: true}
		for _, a := range parts[strings.TrimPrefix(p, module)] {
			allowed[module+a] = true
		}
		for _, o := range others {
			bad := module + o
			if allowed[bad] {
				continue
			}
			// The shortest chain from p to the part, through allowed
			// packages or not: cut it where it first enters a part.
			if chain := importChain(graph, p, func(dep string) bool { return dep == bad }); chain != nil {
				t.Errorf("%s imports %s, another part: reach it through a port declared in %s instead: %s", p, bad, p, strings.Join(chain, " -> "))
			}
		}
	}
}

func TestNothingButTheCLIImportsTheDaemon(t *testing.T) {
	t.Parallel()
	all := modulePackages(t)
	graph := importGraph(t, all...)
	for _, p := range all {
		if p == module+"internal/cli" || p == module+"internal/daemon" || strings.HasPrefix(p, module+"cmd/") || strings.HasPrefix(p, module+"tests/") {
			continue
		}
		if chain := importChain(graph, p, func(dep string) bool { return dep == module+"internal/daemon" }); chain != nil {
			t.Errorf("%s imports the daemon, the composition root: %s", p, strings.Join(chain, " -> "))
		}
	}
}

func keys(m map[string][]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// modulePackages lists the module's packages.
func modulePackages(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "knotless.dev/run/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	return strings.Fields(string(out))
}

// TestOnlyStateChangesTheState: no code outside internal/parts/state assigns
// to the daemon's state (a state.State's fields, their maps and
// slices): the state.Store's methods are the only way to change it.
func TestOnlyStateChangesTheState(t *testing.T) {
	t.Parallel()
	for _, f := range checkTyped(t, func(p *typedPackage) bool { return p.path != module+"internal/parts/state" }, func(p *typedPackage, n ast.Node) string {
		for _, target := range assigned(n) {
			if root := selectorOn(p.info, target, module+"internal/parts/state", "State"); root != "" {
				return "assigns to state.State." + root + ": change the state through a state.Store method"
			}
		}
		return ""
	}) {
		t.Error(f)
	}
}

// TestOnlyChecksSetsACheckStatus: no code outside internal/parts/checks (and
// forge, where the record is defined) makes a check record or sets a
// check's status: the checks part owns every transition.
func TestOnlyChecksSetsACheckStatus(t *testing.T) {
	t.Parallel()
	skip := map[string]bool{module + "internal/parts/checks": true, module + "internal/forge": true}
	for _, f := range checkTyped(t, func(p *typedPackage) bool { return !skip[p.path] }, func(p *typedPackage, n ast.Node) string {
		if lit, ok := n.(*ast.CompositeLit); ok && isNamed(p.info.TypeOf(lit), module+"internal/forge", "Check") {
			return "makes a forge.Check: the checks part (checks.Keeper) makes every check record"
		}
		if id, ok := n.(*ast.SelectorExpr); ok {
			if obj := p.info.Uses[id.Sel]; obj != nil && obj.Pkg() != nil && obj.Pkg().Path() == module+"internal/forge" &&
				(obj.Name() == "StatusQueued" || obj.Name() == "StatusRunning") {
				return "names forge." + obj.Name() + ": a check's status is the checks part's"
			}
		}
		for _, target := range assigned(n) {
			if sel, ok := target.(*ast.SelectorExpr); ok && sel.Sel.Name == "Status" && isNamed(p.info.TypeOf(sel.X), module+"internal/forge", "Check") {
				return "sets a check's status: move it through a checks.Keeper transition"
			}
		}
		return ""
	}) {
		t.Error(f)
	}
}

// assigned lists the expressions n writes to: the left of an
// assignment, the operand of ++ and --, the map of delete and the
// operand of clear.
func assigned(n ast.Node) []ast.Expr {
	switch n := n.(type) {
	case *ast.AssignStmt:
		return n.Lhs
	case *ast.IncDecStmt:
		return []ast.Expr{n.X}
	case *ast.CallExpr:
		if id, ok := n.Fun.(*ast.Ident); ok && (id.Name == "delete" || id.Name == "clear") && len(n.Args) > 0 {
			return []ast.Expr{n.Args[0]}
		}
	}
	return nil
}

// selectorOn walks e (x.f, x[i], *x, (x)) down to a field selected on a
// value of type pkg.name (or a pointer to one), and returns the field's
// name, or "".
func selectorOn(info *types.Info, e ast.Expr, pkg, name string) string {
	for {
		switch x := e.(type) {
		case *ast.SelectorExpr:
			if isNamed(info.TypeOf(x.X), pkg, name) {
				return x.Sel.Name
			}
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.StarExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		default:
			return ""
		}
	}
}

func isNamed(t types.Type, pkg, name string) bool {
	if t == nil {
		return false
	}
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == pkg && n.Obj().Name() == name
}

// typedPackage is one of the module's packages, its non-test files
// type-checked.
type typedPackage struct {
	path  string
	fset  *token.FileSet
	files []*ast.File
	info  *types.Info
}

// checkTyped type-checks the module's packages that want accepts and
// returns, file:line first, what check says of each node.
func checkTyped(t *testing.T, want func(*typedPackage) bool, check func(*typedPackage, ast.Node) string) []string {
	t.Helper()
	var found []string
	for _, p := range typedPackages(t) {
		if !want(p) {
			continue
		}
		for _, f := range p.files {
			ast.Inspect(f, func(n ast.Node) bool {
				if n == nil {
					return false
				}
				if why := check(p, n); why != "" {
					pos := p.fset.Position(n.Pos())
					found = append(found, fmt.Sprintf("%s:%d: %s", relToModule(pos.Filename), pos.Line, why))
				}
				return true
			})
		}
	}
	return found
}

func relToModule(name string) string {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return name
	}
	if rel, err := filepath.Rel(root, name); err == nil {
		return rel
	}
	return name
}

// listed is what go list says of a package.
type listed struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Export     string
}

// typed is the module's packages type-checked, once for the tests
// that read them.
var typed struct {
	once sync.Once
	pkgs []*typedPackage
	err  error
}

// typedPackages loads and type-checks the module's internal packages
// (non-test files), importing their dependencies from the export data
// go list -export builds (as go/packages does).
func typedPackages(t *testing.T) []*typedPackage {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		if testing.Short() {
			t.Skip("no go command on PATH")
		}
		t.Fatalf("the type tests need the go command: %v", err)
	}
	typed.once.Do(func() { typed.pkgs, typed.err = loadTyped() })
	if typed.err != nil {
		t.Fatal(typed.err)
	}
	return typed.pkgs
}

func loadTyped() ([]*typedPackage, error) {
	cmd := exec.Command("go", "list", "-export", "-deps", "-json", module+"internal/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -export: %w\n%s", err, stderr.Bytes())
	}
	exports := map[string]string{}
	var mine []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var l listed
		if err := dec.Decode(&l); err == io.EOF {
			break
		} else if err != nil {
			return nil, err
		}
		exports[l.ImportPath] = l.Export
		if strings.HasPrefix(l.ImportPath, module+"internal/") {
			mine = append(mine, l)
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		name, ok := exports[path]
		if !ok || name == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(name)
	})
	var pkgs []*typedPackage
	for _, l := range mine {
		p := &typedPackage{path: l.ImportPath, fset: fset, info: &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Uses: map[*ast.Ident]types.Object{}}}
		for _, name := range l.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(l.Dir, name), nil, 0)
			if err != nil {
				return nil, err
			}
			p.files = append(p.files, f)
		}
		conf := types.Config{Importer: imp}
		if _, err := conf.Check(l.ImportPath, fset, p.files, p.info); err != nil {
			return nil, fmt.Errorf("type-check %s: %w", l.ImportPath, err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}
