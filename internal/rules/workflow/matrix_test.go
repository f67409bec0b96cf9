package workflow

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMatrixLegs(t *testing.T) {
	t.Parallel()
	src := `on: push
image: "golang:${{ matrix.go }}"
runners: ["did:plc:${{ matrix.os }}"]
env:
  TARGET: "${{matrix.os}}-${{ matrix.go }}"
matrix:
  go: ["1.22", "1.23"]
  os: [linux, darwin, windows]
  exclude:
    - {go: "1.22", os: windows}
  include:
    - {os: linux, race: "true"}
    - {go: "1.24", os: plan9}
  max-parallel: 2
  fail-fast: true
steps:
  - run: go test ./...
`
	w, err := Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if w.Matrix.MaxParallel != 2 || !w.Matrix.FailFast {
		t.Errorf("max-parallel %d, fail-fast %v; want 2, true", w.Matrix.MaxParallel, w.Matrix.FailFast)
	}
	type leg struct {
		Name, Image string
		Runners     []string
		Env         []EnvVar
	}
	var got []leg
	for _, l := range w.Legs() {
		got = append(got, leg{l.Name, l.Image, l.Runners, l.Env})
		if l.Leg == nil || l.Leg.Base != "test" || l.Leg.MaxParallel != 2 || !l.Leg.FailFast {
			t.Errorf("leg %s: Leg %+v", l.Name, l.Leg)
		}
	}
	want := []leg{
		{"test (go=1.22, os=linux, race=true)", "golang:1.22", []string{"did:plc:linux"},
			[]EnvVar{{"TARGET", "linux-1.22"}, {"go", "1.22"}, {"os", "linux"}, {"race", "true"}}},
		{"test (go=1.22, os=darwin)", "golang:1.22", []string{"did:plc:darwin"},
			[]EnvVar{{"TARGET", "darwin-1.22"}, {"go", "1.22"}, {"os", "darwin"}}},
		{"test (go=1.23, os=linux, race=true)", "golang:1.23", []string{"did:plc:linux"},
			[]EnvVar{{"TARGET", "linux-1.23"}, {"go", "1.23"}, {"os", "linux"}, {"race", "true"}}},
		{"test (go=1.23, os=darwin)", "golang:1.23", []string{"did:plc:darwin"},
			[]EnvVar{{"TARGET", "darwin-1.23"}, {"go", "1.23"}, {"os", "darwin"}}},
		{"test (go=1.23, os=windows)", "golang:1.23", []string{"did:plc:windows"},
			[]EnvVar{{"TARGET", "windows-1.23"}, {"go", "1.23"}, {"os", "windows"}}},
		{"test (go=1.24, os=plan9)", "golang:1.24", []string{"did:plc:plan9"},
			[]EnvVar{{"TARGET", "plan9-1.24"}, {"go", "1.24"}, {"os", "plan9"}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Legs (-want +got):\n%s", diff)
	}
	// The workflow itself is left as the file says.
	if w.Image != "golang:${{ matrix.go }}" || len(w.Env) != 1 {
		t.Errorf("the workflow changed: image %q, env %v", w.Image, w.Env)
	}
	// Each leg is found again by its name (an adopted run, a re-run).
	for _, l := range w.Legs() {
		if got := LegOf([]*Workflow{w}, l.Name); got == nil || got.Image != l.Image {
			t.Errorf("LegOf(%q) = %v", l.Name, got)
		}
	}
	if LegOf([]*Workflow{w}, "test (go=1.22, os=windows)") != nil {
		t.Error("LegOf found an excluded leg")
	}
	if n := len(Plan([]*Workflow{w, mustParse(t, "on: push\nsteps: [{run: x}]\n")})); n != 7 {
		t.Errorf("Plan: %d runs, want 7", n)
	}
}

func TestMatrixOnlyInclude(t *testing.T) {
	t.Parallel()
	w := mustParse(t, "on: push\nmatrix:\n  include:\n    - {a: x}\n    - {a: y, b: z}\nsteps: [{run: x}]\n")
	var names []string
	for _, l := range w.Legs() {
		names = append(names, l.Name)
	}
	if diff := cmp.Diff([]string{"w (a=x)", "w (a=y, b=z)"}, names); diff != "" {
		t.Errorf("legs (-want +got):\n%s", diff)
	}
}

func mustParse(t testing.TB, src string) *Workflow {
	t.Helper()
	w, err := Parse("w.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// lists is a matrix of n lists of the given sizes, named k0, k1, ….
func lists(sizes ...int) string {
	var b strings.Builder
	b.WriteString("on: push\nmatrix:\n")
	for i, n := range sizes {
		fmt.Fprintf(&b, "  k%d: [", i)
		for j := range n {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "v%d", j)
		}
		b.WriteString("]\n")
	}
	return b.String()
}

func TestMatrixErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src string
		want      []string
	}{
		{"257 legs", lists(257) + "steps: [{run: x}]\n", []string{
			`w.yaml:3:3: matrix: 257 legs, more than the limit of 256`,
		}},
		{"256 legs and one include", lists(16, 16) + "  include: [{k0: new, k1: new}]\nsteps: [{run: x}]\n", []string{
			`w.yaml:3:3: matrix: 257 legs or more, more than the limit of 256`,
		}},
		{"a product too large to count", lists(100, 100, 100, 100, 100) + "steps: [{run: x}]\n", []string{
			`w.yaml:3:3: matrix: the lists cross to more than 4096 legs before exclude; a matrix has at most 256`,
		}},
		{"not a mapping", "on: push\nmatrix: [a]\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:9: matrix: want a mapping of NAME: [values] (and include, exclude, max-parallel, fail-fast), got a list`,
		}},
		{"bad settings", "on: push\nmatrix:\n  a: [x]\n  max-parallel: 0\n  fail-fast: yes\nsteps: [{run: x}]\n", []string{
			`w.yaml:4:17: matrix.max-parallel: want a positive number of legs, got "0"`,
			`w.yaml:5:14: matrix.fail-fast: want true or false, got "yes"`,
		}},
		{"bad names and values", "on: push\nmatrix:\n  1a: [x]\n  b: []\n  c: [x, x]\n  d: [\"\\u202e\"]\nsteps: [{run: x}]\n", []string{
			`w.yaml:3:3: matrix: "1a" is not a usable variable name (letters, digits, _; KNOTLESS_ is reserved; the settings are include, exclude, max-parallel, fail-fast)`,
			`w.yaml:4:6: matrix.b: want a list of at least one value, got a list`,
			`w.yaml:5:10: matrix.c: "x" is listed twice`,
			`w.yaml:6:7: matrix.d: character U+202E not allowed in a matrix value`,
		}},
		{"exclude of no list", "on: push\nmatrix:\n  a: [x, y]\n  exclude: [{b: x}, {a: z}]\nsteps: [{run: x}]\n", []string{
			`w.yaml:4:14: matrix.exclude[0]: "b" is not one of the matrix's lists (a)`,
		}},
		{"exclude of no leg", "on: push\nmatrix:\n  a: [x, y]\n  exclude: [{a: z}]\nsteps: [{run: x}]\n", []string{
			`w.yaml:4:14: matrix.exclude[0]: excludes no leg`,
		}},
		{"references", "on: push\nimage: \"${{ matrix.b }}\"\nenv: {X: \"${{ matrix }}\"}\nrunners: [\"${{ matrix.a }}\"]\nmatrix:\n  a: [x]\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:8: image: "${{ matrix.b }}": the matrix has no "b" (known: a)`,
			`w.yaml:3:10: env.X: "${{ matrix }}": want ${{ matrix.NAME }}`,
			`w.yaml:4:11: runners: "x" is not a DID in the leg w (a=x) (want did:plc:… or did:web:…)`,
		}},
		{"reference without a matrix", "on: push\nimage: \"${{ matrix.b }}\"\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:8: image: "${{ matrix.b }}": the workflow has no matrix`,
		}},
		{"names beside others", "on: push\nenv: {a: 1}\nsecrets: [b]\nmatrix:\n  a: [x]\n  b: [y]\nsteps: [{run: x}]\n", []string{
			`w.yaml:5:3: matrix: "a" is also an env entry; a leg's steps get its value as that variable`,
			`w.yaml:5:3: matrix: "b" is a secret the workflow grants; a matrix value of that name would stand beside it`,
		}},
		{"a condition of no key", "on: push\nmatrix:\n  a: [x]\nif: matrix.b == \"x\"\nsteps: [{run: x}]\n", []string{
			`w.yaml:4:5: if: unknown name "matrix.b" (known: event.kind, event.ref, event.branch, event.tag, event.base, event.trusted, matrix.a)`,
		}},
		{"two legs alike", "on: push\nmatrix:\n  include: [{a: x}, {a: x}]\nsteps: [{run: x}]\n", []string{
			`w.yaml:3:3: matrix: two legs are both "w (a=x)"`,
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
			} else if err != nil {
				got = []string{err.Error()}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMatrixConditions(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `on: push
matrix:
  os: [linux, darwin]
  include: [{os: linux, extra: "yes"}]
if: matrix.os != "darwin" || event.branch == "main"
steps:
  - run: x
  - name: linux only
    if: matrix.os == "linux" && matrix.extra == "yes"
    run: y
`)
	ev := CondEvent{Kind: "push", Ref: "refs/heads/dev"}
	var got []string
	for _, l := range w.Legs() {
		holds, err := l.Holds(ev, nil)
		if err != nil {
			t.Fatal(err)
		}
		runs, err := l.StepRuns(1, StateSuccess, l.CondVars(ev, nil))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s: holds %v, step runs %v", l.Name, holds, runs))
	}
	want := []string{
		"w (os=linux, extra=yes): holds true, step runs true",
		"w (os=darwin): holds false, step runs false",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// BenchmarkPlanMatrix256 parses a workflow of a 256-leg matrix (16×16
// and an exclude and include) and plans its legs: the issue asks at
// most 50 ms.
func BenchmarkPlanMatrix256(b *testing.B) {
	src := []byte(lists(16, 17) + `  exclude: [{k1: v16}]
  include: [{k0: v0, extra: "1"}]
image: "golang:${{ matrix.k0 }}"
env: {A: "${{ matrix.k1 }}"}
if: matrix.k0 != "v3"
steps:
  - run: go test ./...
    if: matrix.k1 == "v1"
`)
	b.ReportAllocs()
	for b.Loop() {
		w, err := Parse("w.yaml", src)
		if err != nil {
			b.Fatal(err)
		}
		if n := len(w.Legs()); n != 256 {
			b.Fatalf("%d legs", n)
		}
	}
}

// TestMatrixClass: class may be templated by the matrix's values, each
// leg in its own class; a leg whose class is no class's name, or a
// template without a matrix, is an error at the class.
func TestMatrixClass(t *testing.T) {
	t.Parallel()
	w, err := Parse("w.yaml", []byte("on: push\nmatrix: {size: [small, large]}\nclass: build-${{ matrix.size }}\nsteps: [{run: x}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range w.Legs() {
		got = append(got, l.Name+": "+l.Class)
	}
	if diff := cmp.Diff([]string{"w (size=small): build-small", "w (size=large): build-large"}, got); diff != "" {
		t.Errorf("legs' classes (-want +got):\n%s", diff)
	}
	for _, tt := range []struct{ src, want string }{
		{"on: push\nmatrix: {size: [small, Large]}\nclass: ${{ matrix.size }}\nsteps: [{run: x}]\n", "w.yaml:3:8: class: in the leg w (size=Large): "},
		{"on: push\nclass: ${{ matrix.size }}\nsteps: [{run: x}]\n", `w.yaml:2:8: class: "${{ matrix.size }}": the workflow has no matrix`},
		{"on: push\nmatrix: {size: [a]}\nclass: ${{ matrix.os }}\nsteps: [{run: x}]\n", `w.yaml:3:8: class: "${{ matrix.os }}": the matrix has no "os"`},
	} {
		_, err := Parse("w.yaml", []byte(tt.src))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want %s", tt.src, err, tt.want)
		}
	}
}
