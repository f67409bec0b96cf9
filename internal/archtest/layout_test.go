package archtest

import (
	"errors"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// layout is what `ls internal` shows: each entry a group of packages of
// one kind, or a package of its own, as docs/design/architecture.md
// draws them ("The layout").
var layout = []string{
	"archtest", // these rules
	"cli",      // the commands
	"daemon",   // the composition root
	"engine",   // the run engine, its caches and its log
	"executor", // the executor contract and one package per executor
	"forge",    // the knotless records; the PDS client and the listings beside them
	"kube",     // Kubernetes plumbing: the client, the credential, exec, manifests
	"lib",      // small libraries that import nothing of the module
	"mirror",   // git mirrors
	"observe",  // metrics, telemetry, the status document, readiness
	"output",   // live output's stream, served, pushed and kept by the service
	"parts",    // the daemon's parts
	"rules",    // pure decisions and the values the parts share
}

func TestLayoutIsTheArchitecture(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir("..")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		if e.IsDir() {
			got = append(got, e.Name())
		}
	}
	for _, name := range got {
		if !slices.Contains(layout, name) {
			t.Errorf("internal/%s is a new entry of internal/: put it in a group (parts, rules, lib, …) or add it to layout and to the layout in docs/design/architecture.md", name)
		}
	}
	for _, name := range layout {
		if !slices.Contains(got, name) {
			t.Errorf("internal/%s is in layout but not in internal/", name)
		}
	}
	// The architecture page lists the same entries, in its layout block.
	doc, err := os.ReadFile("../../docs/design/architecture.md")
	if errors.Is(err, fs.ErrNotExist) {
		// The Nix package's source leaves docs out (nix/source.nix).
		t.Skip("no docs directory in this source tree: the layout drawing is checked from a checkout")
	}
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```text\ninternal/\n(.*?)```").FindSubmatch(doc)
	if block == nil {
		t.Fatal("docs/design/architecture.md has no layout block (```text, then internal/)")
	}
	var drawn []string
	for _, m := range regexp.MustCompile(`(?m)^  ([a-z]+)/`).FindAllSubmatch(block[1], -1) {
		drawn = append(drawn, string(m[1]))
	}
	want := slices.Clone(layout)
	sort.Strings(want)
	sort.Strings(drawn)
	if !slices.Equal(drawn, want) {
		t.Errorf("the layout in docs/design/architecture.md lists %v, internal/ holds %v", drawn, want)
	}
}

// Every daemon part lives in internal/parts, and everything there is a
// part (or the rig, their tests' outside world).
func TestPartsAreInParts(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir("../parts")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if _, ok := parts["internal/parts/"+e.Name()]; !ok {
			t.Errorf("internal/parts/%s is not a part that archtest's parts rules know: add it to parts, or move it out of internal/parts", e.Name())
		}
	}
	for p := range parts {
		if !strings.HasPrefix(p, "internal/parts/") && !strings.HasPrefix(p, "internal/rules/") {
			t.Errorf("%s is one of the daemon's parts (or what they name) outside internal/parts and internal/rules", p)
		}
	}
}

// TestLibImportsNothingOfTheModule: the small libraries of internal/lib
// import nothing of knotless-run, so any package may use them.
func TestLibImportsNothingOfTheModule(t *testing.T) {
	t.Parallel()
	libs := packagesUnder(t, "internal/lib")
	graph := importGraph(t, libs...)
	for _, p := range libs {
		if chain := importChain(graph, p, func(dep string) bool { return strings.HasPrefix(dep, module) }); chain != nil {
			t.Errorf("%s is a library of internal/lib but imports the module's %s: %s", p, chain[len(chain)-1], strings.Join(chain, " -> "))
		}
	}
}

// TestRulesImportOnlyRecordsAndLibraries: the rules (pure decisions and
// the values the parts share) import of the module only other rules,
// the records (internal/forge, not its client) and the libraries.
func TestRulesImportOnlyRecordsAndLibraries(t *testing.T) {
	t.Parallel()
	rules := packagesUnder(t, "internal/rules")
	graph := importGraph(t, rules...)
	allowed := func(dep string) bool {
		return dep == module+"internal/forge" || strings.HasPrefix(dep, module+"internal/rules/") || strings.HasPrefix(dep, module+"internal/lib/")
	}
	for _, p := range rules {
		if chain := importChain(graph, p, func(dep string) bool { return strings.HasPrefix(dep, module) && !allowed(dep) }); chain != nil {
			t.Errorf("%s is a rule but imports the module's %s: %s", p, chain[len(chain)-1], strings.Join(chain, " -> "))
		}
	}
}

// packagesUnder lists the module's packages under dir (a path from the
// module's root).
func packagesUnder(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, p := range modulePackages(t) {
		if strings.HasPrefix(p, module+dir+"/") {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no package under %s", dir)
	}
	return out
}
