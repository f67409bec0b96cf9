package workflow

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseFull(t *testing.T) {
	t.Parallel()
	src := `on: [push, batch]
branches: main
image: alpine:3
runners: [did:plc:abc]
timeout: 10m
env:
  GOFLAGS: -mod=mod
  N: 3
secrets: [TOKEN, KEY]
cache: [.cache/go, /root/.npm]
queue: first
superseded: finish
resources: {cpu: 500m, memory: 1Gi}
steps:
  - name: build
    run: |
      go build ./...
    timeout: 2m
    secrets: [TOKEN]
  - uses: lint
`
	got, err := Parse("ci.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := &Workflow{
		Name: "ci", File: "ci.yaml",
		On:         []Trigger{Push, Batch},
		Branches:   []string{"main"},
		Image:      "alpine:3",
		Runners:    []string{"did:plc:abc"},
		Timeout:    10 * time.Minute,
		Env:        []EnvVar{{"GOFLAGS", "-mod=mod"}, {"N", "3"}},
		Secrets:    []string{"TOKEN", "KEY"},
		Cache:      []string{".cache/go", "/root/.npm"},
		Queue:      "first",
		Superseded: "finish",
		Resources:  Resources{CPU: "500m", Memory: "1Gi"},
		Steps: []Step{
			{Name: "build", Run: "go build ./...\n", Timeout: 2 * time.Minute, Secrets: []string{"TOKEN"}, Line: 15},
			{Name: "lint", Uses: "lint", Line: 20},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Parse (-want +got):\n%s", diff)
	}
}

func TestParseErrorsHavePositions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"unknown field", "on: push\nstep:\n  - run: x\n", []string{
			`w.yaml:2:1: workflow: unknown field "step" (known: branches, cache, env, image, on, queue, resources, runners, secrets, steps, superseded, timeout)`,
			`w.yaml:1:1: workflow: missing field "steps"`,
		}},
		{"wrong types", "on: push\ntimeout: [1]\nsteps:\n  - run: x\n    timeout: 5\n", []string{
			`w.yaml:2:10: timeout: want a string, got a list`,
			`w.yaml:2:10: timeout: want a positive duration like 90s or 10m, got ""`,
			`w.yaml:5:14: timeout: want a positive duration like 90s or 10m, got "5"`,
		}},
		{"several at once", "on: deploy\nsteps:\n  - name: a\n    run: x\n    secrets: [TOKEN]\n  - name: a\n    run: y\n    uses: z\n", []string{
			`w.yaml:1:5: on: unknown event "deploy" (want push, pull or batch)`,
			`w.yaml:5:14: steps[0].secrets: "TOKEN" is not granted by the workflow's secrets`,
			`w.yaml:6:5: steps[1]: run and uses exclude each other`,
			`w.yaml:6:11: steps[1].name: "a" is used by an earlier step`,
		}},
		{"outputs explained", "on: push\noutputs: [a]\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:1: unknown field "outputs": a step writes its outputs to the directory $KNOTLESS_RUN_OUTPUTS`,
		}},
		{"syntax", "on: push\nsteps:\n  - run: 'x\n", []string{
			`w.yaml:3:10: could not find end character of single-quoted text`,
		}},
		{"bad quantity and env", "on: push\nresources: {cpu: lots}\nenv: {KNOTLESS_X: 1}\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:18: resources.cpu: want a positive quantity like 500m, 2 or 4Gi, got "lots"`,
			`w.yaml:3:7: env: "KNOTLESS_X" is not a usable variable name (letters, digits, _; KNOTLESS_ is reserved)`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("w.yaml", []byte(tt.src))
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("Parse error = %v, want Errors", err)
			}
			var got []string
			for _, e := range errs {
				got = append(got, e.Error())
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMatches(t *testing.T) {
	t.Parallel()
	w := &Workflow{On: []Trigger{Push}, Branches: []string{"main", "release/*"}}
	for _, tt := range []struct {
		event  Trigger
		branch string
		want   bool
	}{
		{Push, "main", true}, {Push, "release/1.0", true}, {Push, "dev", false}, {Pull, "main", false},
	} {
		if got := w.Matches(tt.event, tt.branch); got != tt.want {
			t.Errorf("Matches(%s, %s) = %v, want %v", tt.event, tt.branch, got, tt.want)
		}
	}
}

func TestExampleWorkflowIsValid(t *testing.T) {
	t.Parallel()
	w, err := Load("../../examples/hello/.knotless/workflows/build.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(w.StepNames(), ","); got != "inspect,build,publish" {
		t.Errorf("steps = %s", got)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("on: push\nsteps:\n  - run: echo hi\n"))
	f.Add([]byte("on: [push, pull]\nenv: {A: 1}\nsecrets: [T]\nsteps: [{name: a, run: x, secrets: [T]}]\n"))
	f.Add([]byte("a: &x {b: 1}\nc: *x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := Parse("f.yaml", data)
		if err == nil && (w == nil || len(w.Steps) == 0 || len(w.On) == 0) {
			t.Fatalf("valid workflow without steps or events: %+v", w)
		}
		var errs Errors
		if err != nil && (!errors.As(err, &errs) || len(errs) == 0) {
			t.Fatalf("error is not a non-empty Errors: %v", err)
		}
	})
}

// TestParseWarnsOfFieldsNotActedOn: fields that parse and then do
// nothing are named, with their line, until their feature lands.
func TestParseWarnsOfFieldsNotActedOn(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		src       string
		want      []string
		neverRuns bool
	}{
		{"none", "on: push\nsteps:\n  - run: x\n", nil, false},
		{"cache", "on: push\ncache: .cache\nsteps:\n  - run: x\n", nil, false},
		{"queue", "on: push\nqueue: first\nsteps:\n  - run: x\n", nil, false},
		{"batch", "on: [push, batch]\nsteps:\n  - run: x\n", nil, false},
		{"batch only", "on: batch\nsteps:\n  - run: x\n", nil, false},
		{"no events", "on: []\nsteps:\n  - run: x\n", []string{"w.yaml:1:5: warning: on: no events: this workflow never runs"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w, err := Parse("w.yaml", []byte(tt.src))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, warning := range w.Warnings {
				got = append(got, warning.String())
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
			if w.NeverRuns() != tt.neverRuns {
				t.Errorf("NeverRuns() = %v, want %v", w.NeverRuns(), tt.neverRuns)
			}
		})
	}
}
