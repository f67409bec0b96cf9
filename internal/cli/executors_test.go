package cli

import (
	"errors"
	"io/fs"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/google/go-cmp/cmp"
)

// executorFlags is what an executor's flags struct implements: the
// executor it configures.
type executorFlags interface {
	executorDef() executorDef
}

// TestExecutorsAreRegistered: every struct ExecutorFlags embeds is an
// executor's flags and is listed (executors), names are unique, and
// each executor can be built and shown by --dry-run.
func TestExecutorsAreRegistered(t *testing.T) {
	t.Parallel()
	var f ExecutorFlags
	typ := reflect.TypeOf(f)
	embedded := 0
	for i := range typ.NumField() {
		field := typ.Field(i)
		if !field.Anonymous {
			continue
		}
		embedded++
		if !reflect.PointerTo(field.Type).Implements(reflect.TypeOf((*executorFlags)(nil)).Elem()) {
			t.Errorf("ExecutorFlags embeds %s, which registers no executor (it lacks executorDef)", field.Type)
		}
	}
	defs := f.executors()
	if len(defs) != embedded {
		t.Errorf("%d executors registered, %d structs embedded", len(defs), embedded)
	}
	seen := map[string]bool{}
	for _, d := range defs {
		for _, n := range append([]string{d.Name}, d.Aliases...) {
			if n == "" || seen[n] {
				t.Errorf("executor name %q is empty or taken twice", n)
			}
			seen[n] = true
		}
		if d.New == nil || d.What == "" || d.Dirs.Work == "" || d.Dirs.Steps == "" || d.Dirs.Outputs == "" {
			t.Errorf("executor %s: New, What and all Dirs must be set: %+v", d.Name, d)
		}
	}
	if !seen[defaultExecutor] {
		t.Errorf("the default executor %q is not registered", defaultExecutor)
	}
}

// commandFlags returns the long names of the flags of command name in
// the tree Main parses.
func commandFlags(t *testing.T, name string) map[string]bool {
	t.Helper()
	var root CLI
	p, err := kong.New(&root, kong.Exit(func(int) { t.Fatal("exit") }), executorVars())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range p.Model.Children {
		if n.Name == name {
			flags := map[string]bool{}
			for _, f := range n.Flags {
				flags[f.Name] = true
			}
			return flags
		}
	}
	t.Fatalf("no command %q", name)
	return nil
}

// TestExecutorFlagsWorkForRunAndServe walks both commands' kong models:
// an executor flag that run accepts and serve does not (or the other way)
// breaks the promise that moving a runner to another executor is only a
// settings change.
func TestExecutorFlagsWorkForRunAndServe(t *testing.T) {
	t.Parallel()
	var only struct {
		ExecutorFlags `embed:""`
	}
	p, err := kong.New(&only, executorVars())
	if err != nil {
		t.Fatal(err)
	}
	runFlags, serveFlags := commandFlags(t, "run"), commandFlags(t, "serve")
	var executorFlags []string
	for _, f := range p.Model.Flags {
		if f.Name == "help" {
			continue
		}
		executorFlags = append(executorFlags, f.Name)
		if !runFlags[f.Name] {
			t.Errorf("run does not accept the executor flag --%s", f.Name)
		}
		if !serveFlags[f.Name] {
			t.Errorf("serve does not accept the executor flag --%s", f.Name)
		}
	}
	for _, want := range []string{"executor", "image", "shell-root", "namespace", "docker-host"} {
		if !slices.Contains(executorFlags, want) {
			t.Errorf("--%s is not among the executor flags %v", want, executorFlags)
		}
	}
}

// TestServeTakesDockerFlags: through the real Main, serve --executor
// docker with the docker flags gets past flag parsing (it stops at the
// missing --did instead).
func TestServeTakesDockerFlags(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "serve", "--executor", "docker", "--docker-host", "unix:///nonexistent", "--docker-pull", "never", "--network", "none", "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello")
	if r.code != ExitConfig || strings.Contains(r.stderr, "unknown flag") || !strings.Contains(r.stderr, "--did") {
		t.Errorf("exit %d, stderr:\n%s\nwant exit %d for the missing --did, not a flag error", r.code, r.stderr, ExitConfig)
	}
}

// TestModuleExecutorsMatch: the NixOS module's settings.executor enum
// lists exactly the registered names and aliases. The module is not in
// the package's source, so the Nix build skips this.
func TestModuleExecutorsMatch(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../nix/module.nix")
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("nix/module.nix is not in this source tree")
	}
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)\bexecutor = mkOption \{\s*type = types\.enum \[([^\]]*)\]`).FindSubmatch(b)
	if m == nil {
		t.Fatal("nix/module.nix: no settings.executor enum found")
	}
	var got []string
	for _, q := range regexp.MustCompile(`"([^"]*)"`).FindAllSubmatch(m[1], -1) {
		got = append(got, string(q[1]))
	}
	var f ExecutorFlags
	var want []string
	for _, d := range f.executors() {
		want = append(want, d.Name)
		want = append(want, d.Aliases...)
	}
	slices.Sort(got)
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("nix/module.nix settings.executor enum differs from the registered executors (-registry +module):\n%s", diff)
	}
}

// TestModuleEgressMatches: the NixOS module's egress modes are the
// flags' (--egress, --egress-untrusted), and its defaults the flags'.
func TestModuleEgressMatches(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../nix/module.nix")
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("nix/module.nix is not in this source tree")
	}
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)\begressModes = \[([^\]]*)\]`).FindSubmatch(b)
	if m == nil {
		t.Fatal("nix/module.nix: no egressModes list found")
	}
	var modes []string
	for _, q := range regexp.MustCompile(`"([^"]*)"`).FindAllSubmatch(m[1], -1) {
		modes = append(modes, string(q[1]))
	}
	kube := reflect.TypeFor[KubeFlags]()
	for _, tt := range []struct{ field, option string }{{"Egress", "egress"}, {"EgressUntrusted", `"egress-untrusted"`}} {
		f, ok := kube.FieldByName(tt.field)
		if !ok {
			t.Fatalf("KubeFlags has no %s", tt.field)
		}
		if diff := cmp.Diff(strings.Split(f.Tag.Get("enum"), ","), modes); diff != "" {
			t.Errorf("nix/module.nix egressModes differ from --%s's (-flag +module):\n%s", f.Name, diff)
		}
		d := regexp.MustCompile(`(?s)\s` + regexp.QuoteMeta(tt.option) + ` = mkOption \{\s*type = types\.enum egressModes;\s*default = "([^"]*)"`).FindSubmatch(b)
		if d == nil || string(d[1]) != f.Tag.Get("default") {
			t.Errorf("nix/module.nix settings.%s: no default of the flag's %q found", tt.option, f.Tag.Get("default"))
		}
	}
}
