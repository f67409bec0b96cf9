package workflow

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPathFilters(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `on:
  push:
    paths-ignore: ["docs/**", "*.md"]
  pull:
    paths: ["src/**/*.go", go.mod]
  dispatch:
steps: [{run: x}]
`)
	want := map[Trigger]PathFilter{
		Push: {Ignore: []string{"docs/**", "*.md"}},
		Pull: {Paths: []string{"src/**/*.go", "go.mod"}},
	}
	if diff := cmp.Diff(want, w.PathFilters); diff != "" {
		t.Fatalf("PathFilters (-want +got):\n%s", diff)
	}
	tests := []struct {
		t       Trigger
		changed []string
		want    bool
	}{
		{Push, []string{"docs/a.md", "docs/deep/b.png", "README.md"}, false},
		{Push, []string{"docs/a.md", "main.go"}, true},
		{Push, []string{"sub/README.md"}, true}, // * does not cross a /
		{Push, nil, false},                      // nothing changed: nothing wanted
		{Pull, []string{"src/x.go"}, true},
		{Pull, []string{"src/a/b/c.go"}, true},
		{Pull, []string{"go.mod"}, true},
		{Pull, []string{"src/x.txt", "docs/a.md"}, false},
		{Dispatch, nil, true}, // no filter
	}
	for _, tt := range tests {
		ok, why := w.PathsAdmit(tt.t, tt.changed)
		if ok != tt.want || (ok == (why != "")) {
			t.Errorf("PathsAdmit(%s, %q) = %v, %q; want %v", tt.t, tt.changed, ok, why, tt.want)
		}
	}
	if _, why := w.PathsAdmit(Push, []string{"docs/a"}); why != "skipped: every file the push changed (1) matches on.push.paths-ignore (docs/**, *.md)" {
		t.Errorf("why = %q", why)
	}
}

func TestPathFilterErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src string
		want      []string
	}{
		{"both", "on:\n  push: {paths: [a], paths-ignore: [b]}\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:17: on.push: paths and paths-ignore exclude each other`,
		}},
		{"bad patterns", "on:\n  pull:\n    paths: [\"/abs\", \"!neg\", \"a/../b\", \"a**\", \"[x\"]\nsteps: [{run: x}]\n", []string{
			`w.yaml:3:13: on.pull.paths: "/abs": absolute path: want a path relative to the repository's root`,
			`w.yaml:3:21: on.pull.paths: "!neg": a leading ! is not a negation here: list the paths to leave out in paths-ignore`,
			`w.yaml:3:29: on.pull.paths: "a/../b": ".." not allowed`,
			`w.yaml:3:39: on.pull.paths: "a**": "a**": ** must be a whole part (a/**/b), elsewhere * does`,
			`w.yaml:3:46: on.pull.paths: "[x": bad pattern "[x": syntax error in pattern`,
		}},
		{"unknown field", "on:\n  push: {path: [a]}\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:10: on.push: unknown field "path" (known: paths, paths-ignore)`,
		}},
		{"empty", "on:\n  push: {paths: []}\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:17: on.push.paths: want at least one pattern`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("w.yaml", []byte(tt.src))
			var got []string
			if es, ok := err.(Errors); ok {
				for _, e := range es {
					got = append(got, e.Error())
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

// The reference's examples of a matrix, of path filters and of needs are
// workflows validate takes.
func TestReferenceMatrixAndPathExamplesParse(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../../docs/reference/workflow.md")
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("docs are left out of this source (the Nix package's)")
	}
	if err != nil {
		t.Fatal(err)
	}
	blocks := 0
	for i, block := range strings.Split(string(b), "```yaml\n")[1:] {
		src, _, _ := strings.Cut(block, "```")
		if !strings.Contains(src, "matrix:") && !strings.Contains(src, "paths") && !strings.Contains(src, "needs:") {
			continue
		}
		blocks++
		if _, err := Parse("example.yaml", []byte(src)); err != nil {
			t.Errorf("yaml block %d of docs/reference/workflow.md: %v", i+1, err)
		}
	}
	if blocks < 3 {
		t.Errorf("%d examples of a matrix or path filters in docs/reference/workflow.md, want at least 3", blocks)
	}
}
