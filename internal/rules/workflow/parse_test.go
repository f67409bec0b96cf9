package workflow

import (
	"errors"
	"slices"
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
artifacts: [report.txt, "coverage/**/*.html"]
queue: first
superseded: finish
class: large
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
		Artifacts:  []string{"report.txt", "coverage/**/*.html"},
		Queue:      "first",
		Superseded: "finish",
		Class:      "large",
		Resources:  Resources{CPU: "500m", Memory: "1Gi"},
		Steps: []Step{
			{Name: "build", Run: "go build ./...\n", Timeout: 2 * time.Minute, Secrets: []string{"TOKEN"}, Line: 17},
			{Name: "lint", Uses: "lint", Line: 22},
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
			`w.yaml:2:1: workflow: unknown field "step" (known: artifacts, branches, cache, class, concurrency, env, if, image, matrix, needs, on, queue, resources, retry, runners, secrets, services, steps, superseded, timeout)`,
			`w.yaml:1:1: workflow: missing field "steps"`,
		}},
		{"a class name no runner can have", "on: push\nclass: Large\nsteps:\n  - run: x\n", []string{
			`w.yaml:2:8: class: class name "Large": want lower-case letters, digits and dashes, starting with a letter`,
		}},
		{"wrong types", "on: push\ntimeout: [1]\nsteps:\n  - run: x\n    timeout: 5\n", []string{
			`w.yaml:2:10: timeout: want a string, got a list`,
			`w.yaml:2:10: timeout: want a positive duration like 90s or 10m, got ""`,
			`w.yaml:5:14: timeout: want a positive duration like 90s or 10m, got "5"`,
		}},
		{"several at once", "on: deploy\nsteps:\n  - name: a\n    run: x\n    secrets: [TOKEN]\n  - name: a\n    run: y\n    uses: z\n", []string{
			`w.yaml:1:5: on: unknown event "deploy" (want push, pull, batch, dispatch or schedule)`,
			`w.yaml:5:14: steps[0].secrets: "TOKEN" is not granted by the workflow's secrets`,
			`w.yaml:6:5: steps[1]: run and uses exclude each other`,
			`w.yaml:6:11: steps[1].name: "a" is used by an earlier step`,
		}},
		{"outputs explained", "on: push\noutputs: [a]\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:1: unknown field "outputs": a step writes its outputs to the directory $KNOTLESS_RUN_OUTPUTS`,
		}},
		{"artifacts", "on: push\nartifacts:\n  - /etc/passwd\n  - ../x\n  - ''\n  - a//b\n  - ./a\n  - 'a/**b'\n  - '[x'\n  - \"a\\u202etxt\"\n  - ok/**/*.txt\nsteps: [{run: x}]\n", []string{
			`w.yaml:3:5: artifacts: "/etc/passwd": absolute path: want a path relative to the outputs directory`,
			`w.yaml:4:5: artifacts: "../x": ".." not allowed`,
			`w.yaml:5:5: artifacts: "": empty path`,
			`w.yaml:6:5: artifacts: "a//b": empty or "." part: write the path clean`,
			`w.yaml:7:5: artifacts: "./a": empty or "." part: write the path clean`,
			`w.yaml:8:5: artifacts: "a/**b": "**b": ** must be a whole part (a/**/b), elsewhere * does`,
			`w.yaml:9:5: artifacts: "[x": bad pattern "[x": syntax error in pattern`,
			`w.yaml:10:5: artifacts: "a\u202etxt": character U+202E not allowed`,
		}},
		{"artifacts of the wrong type", "on: push\nartifacts: {a: b}\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:12: artifacts: want a string, got a mapping`,
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
	w, err := Load("../../../examples/hello/.knotless/workflows/build.yaml")
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
	f.Add([]byte("on: push\nif: event.kind == 'push'\nsteps:\n  - {run: x, if: \"failure() || event.foo\", working-directory: a/b, continue-on-error: true}\n"))
	f.Add([]byte("on:\n  push:\n  dispatch:\n    inputs:\n      target: {type: choice, options: [a, b], default: a}\n      dry: {type: boolean, required: true}\n      note:\n  schedule:\n    - cron: '0 3 * * 1-5'\n    - cron: '@daily'\nsteps: [{run: x}]\n"))
	f.Add([]byte("on: {schedule: [{cron: '61 * * * *'}, {cron: '@every 1h'}], dispatch: {inputs: {KNOTLESS_X: {type: number}}}}\nsteps: [{run: x}]\n"))
	f.Add([]byte("on: push\nartifacts: [report.txt, 'site/**/*.html', '**']\nsteps: [{run: x}]\n"))
	f.Add([]byte("on: push\nimage: 'i:${{ matrix.a }}'\nmatrix:\n  a: [x, y]\n  b: [1, 2]\n  exclude: [{a: x, b: 1}]\n  include: [{a: y, c: z}, {a: w}]\n  max-parallel: 2\n  fail-fast: true\nif: matrix.c == 'z'\nsteps: [{run: x, if: \"matrix.a == 'y'\"}]\n"))
	f.Add([]byte("on:\n  push: {paths-ignore: ['docs/**']}\n  pull: {paths: ['src/**/*.go', go.mod]}\nsteps: [{run: x}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := Parse("f.yaml", data)
		if err == nil && (w == nil || len(w.Steps) == 0 || (len(w.On) == 0 && len(w.Warnings) == 0)) {
			t.Fatalf("valid workflow without steps, or without events and not warned of it: %+v", w)
		}
		if err == nil {
			// A schedule has its crons, every one of which parses; inputs
			// come only with dispatch.
			if slices.Contains(w.On, Schedule) != (len(w.Schedule) > 0) {
				t.Fatalf("on %v with schedule %v", w.On, w.Schedule)
			}
			for _, c := range w.Schedule {
				if _, err := ParseCron(c.Spec); err != nil {
					t.Fatalf("valid workflow with a bad cron %q: %v", c.Spec, err)
				}
			}
			if len(w.Inputs) > 0 && !slices.Contains(w.On, Dispatch) {
				t.Fatalf("inputs %v without on: dispatch", w.Inputs)
			}
			// Every artifacts entry is a clean relative pattern, which
			// names nothing outside the outputs directory.
			for _, a := range w.Artifacts {
				if err := CheckArtifact(a); err != nil || MatchArtifact(a, "../x") || MatchArtifact(a, "/x") {
					t.Fatalf("valid workflow with artifacts entry %q: %v", a, err)
				}
			}
			// A matrix plans 1 to MaxLegs legs, each named apart, within
			// a check's workflow field, its runners DIDs; a path filter
			// has its patterns, each clean.
			legs := w.Legs()
			names := map[string]bool{}
			for _, l := range legs {
				if names[l.Name] || len(l.Name) > maxLegName || len(l.Runners) != len(w.Runners) {
					t.Fatalf("leg %q named twice, too long, or without its runners", l.Name)
				}
				for _, r := range l.Runners {
					if !strings.HasPrefix(r, "did:") {
						t.Fatalf("leg %q with runner %q", l.Name, r)
					}
				}
				names[l.Name] = true
			}
			if len(legs) < 1 || len(legs) > MaxLegs {
				t.Fatalf("%d legs", len(legs))
			}
			for tr, f := range w.PathFilters {
				if (tr != Push && tr != Pull) || (len(f.Paths) == 0) == (len(f.Ignore) == 0) {
					t.Fatalf("path filter of %s: %+v", tr, f)
				}
				for _, p := range append(f.Paths, f.Ignore...) {
					if err := CheckPathPattern(p); err != nil {
						t.Fatalf("valid workflow with path pattern %q: %v", p, err)
					}
				}
			}
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

// TestParseDispatchAndSchedule: on as a mapping of events to their
// settings, with typed dispatch inputs and cron entries.
func TestParseDispatchAndSchedule(t *testing.T) {
	t.Parallel()
	src := `on:
  push:
  dispatch:
    inputs:
      target:
        type: choice
        description: where to deploy
        options: [staging, production]
        default: staging
      dry_run: {type: boolean, default: true}
      note: {required: true}
      extra:
  schedule:
    - cron: "0 3 * * 1-5"
    - cron: "@daily"
steps:
  - run: x
`
	got, err := Parse("d.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	str := func(s string) *string { return &s }
	want := &Workflow{
		Name: "d", File: "d.yaml", Superseded: "cancel",
		On: []Trigger{Push, Dispatch, Schedule},
		Inputs: []Input{
			{Name: "target", Type: InputChoice, Description: "where to deploy", Options: []string{"staging", "production"}, Default: str("staging"), Line: 5},
			{Name: "dry_run", Type: InputBoolean, Default: str("true"), Line: 10},
			{Name: "note", Type: InputString, Required: true, Line: 11},
			{Name: "extra", Type: InputString, Line: 12},
		},
		Schedule: []Cron{{Spec: "0 3 * * 1-5", Line: 14}, {Spec: "@daily", Line: 15}},
		Steps:    []Step{{Name: "step 1", Run: "x", Line: 17}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Parse (-want +got):\n%s", diff)
	}
	if !got.Matches(Dispatch, "main") || !got.Matches(Schedule, "main") || got.Matches(Pull, "main") {
		t.Errorf("Matches: dispatch %v, schedule %v, pull %v; want true, true, false",
			got.Matches(Dispatch, "main"), got.Matches(Schedule, "main"), got.Matches(Pull, "main"))
	}

	// The list form takes dispatch (no inputs) beside the other events.
	w, err := Parse("l.yaml", []byte("on: [push, dispatch]\nsteps: [{run: x}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Trigger{Push, Dispatch}, w.On); diff != "" {
		t.Errorf("list form (-want +got):\n%s", diff)
	}
}

// TestParseDispatchAndScheduleErrors: each mistake in on's mapping form
// is an error naming the file, line and column.
func TestParseDispatchAndScheduleErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"bad cron", "on:\n  schedule:\n    - cron: '61 * * * *'\nsteps: [{run: x}]\n", []string{
			`w.yaml:3:13: on.schedule[0].cron: bad cron expression "61 * * * *": end of range (61) above maximum (59): 61`,
		}},
		{"six fields", "on:\n  schedule:\n    - cron: '0 0 3 * * *'\nsteps: [{run: x}]\n", []string{
			`w.yaml:3:13: on.schedule[0].cron: bad cron expression "0 0 3 * * *": expected exactly 5 fields, found 6: [0 0 3 * * *]`,
		}},
		{"@every", "on:\n  schedule:\n    - cron: '@every 1h'\nsteps: [{run: x}]\n", []string{
			`w.yaml:3:13: on.schedule[0].cron: bad cron expression "@every 1h": @every is not a schedule of fixed ticks; write the minutes and hours it runs at`,
		}},
		{"time zone", "on:\n  schedule:\n    - cron: 'TZ=Europe/Paris 0 3 * * *'\nsteps: [{run: x}]\n", []string{
			`w.yaml:3:13: on.schedule[0].cron: bad cron expression "TZ=Europe/Paris 0 3 * * *": a time zone is not supported; schedules are in UTC`,
		}},
		{"schedule without crons", "on: [push, schedule]\nsteps: [{run: x}]\n", []string{
			`w.yaml:1:12: on: schedule needs its cron entries: on: {schedule: [{cron: "0 3 * * *"}]}`,
		}},
		{"empty schedule", "on:\n  schedule: []\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:13: on.schedule: want a list of at least one {cron: "…"}, got a list`,
		}},
		{"schedule entry without cron", "on:\n  schedule:\n    - {at: 3}\nsteps: [{run: x}]\n", []string{
			`w.yaml:3:8: on.schedule[0]: unknown field "at" (known: cron)`,
			`w.yaml:3:8: on.schedule[0]: missing field "cron"`,
		}},
		{"push with settings", "on:\n  push: {branches: [main]}\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:10: on.push: unknown field "branches": the branches a workflow runs for are its branches field (known here: paths, paths-ignore)`,
		}},
		{"batch with settings", "on:\n  batch: {paths: [a]}\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:10: on.batch: takes no settings, got a mapping (the branches a workflow runs for are its branches field)`,
		}},
		{"unknown event in the mapping", "on:\n  deploy:\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:3: on: unknown event "deploy" (want push, pull, batch, dispatch or schedule)`,
		}},
		{"event twice", "on: [push, push]\nsteps: [{run: x}]\n", []string{
			`w.yaml:1:12: on: push is named twice`,
		}},
		{"inputs", `on:
  dispatch:
    inputs:
      env: {type: choice}
      level: {type: choice, options: [a, b, a], default: c}
      dry: {type: boolean, default: maybe}
      must: {required: true, default: x}
      n: {type: number, options: [1]}
      KNOTLESS_X:
      TOKEN:
      s: {type: string, options: [x], required: yes}
secrets: [TOKEN]
steps: [{run: x}]
`, []string{
			`w.yaml:4:7: on.dispatch.inputs.env: a choice needs options`,
			`w.yaml:5:45: on.dispatch.inputs.level.options: "a" is listed twice`,
			`w.yaml:5:58: on.dispatch.inputs.level.default: "c" is not one of the options (a, b, a)`,
			`w.yaml:6:37: on.dispatch.inputs.dry.default: want true or false, got "maybe"`,
			`w.yaml:7:24: on.dispatch.inputs.must: required and default exclude each other (a required input is always given)`,
			`w.yaml:8:17: on.dispatch.inputs.n.type: want string, boolean or choice, got "number"`,
			`w.yaml:9:7: on.dispatch.inputs: "KNOTLESS_X" is not a usable variable name (letters, digits, _; KNOTLESS_ is reserved)`,
			`w.yaml:11:49: on.dispatch.inputs.s.required: want true or false, got "yes"`,
			`w.yaml:11:34: on.dispatch.inputs.s.options: only a choice has options`,
			`w.yaml:10:7: on.dispatch.inputs: "TOKEN" is a secret the workflow grants; an input of that name would stand beside it`,
		}},
		{"inputs not a mapping", "on:\n  dispatch:\n    inputs: [a]\nsteps: [{run: x}]\n", []string{
			`w.yaml:3:13: on.dispatch.inputs: want a mapping of name to input, got a list`,
		}},
		{"dispatch unknown setting", "on:\n  dispatch: {ref: main}\nsteps: [{run: x}]\n", []string{
			`w.yaml:2:14: on.dispatch: unknown field "ref" (known: inputs)`,
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

// TestMatchArtifact: each part of a pattern matches one part of the
// name as path.Match does; a part ** matches any number of parts.
func TestMatchArtifact(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		pattern, name string
		want          bool
	}{
		{"report.txt", "report.txt", true},
		{"report.txt", "dir/report.txt", false},
		{"*.txt", "report.txt", true},
		{"*.txt", ".hidden.txt", true},
		{"*.txt", "dir/report.txt", false},
		{"*", "dir/report.txt", false},
		{"dir/*", "dir/report.txt", true},
		{"**", "report.txt", true},
		{"**", "a/b/c", true},
		{"**/*.txt", "report.txt", true},
		{"**/*.txt", "a/b/report.txt", true},
		{"**/*.txt", "a/b/report.html", false},
		{"a/**/b", "a/b", true},
		{"a/**/b", "a/x/y/b", true},
		{"a/**/b", "a/x/y/c", false},
		{"a/**", "a", true},
		{"a/**", "a/x", true},
		{"**/**/**/**/**/**/**/**/**/**/z", strings.Repeat("a/", 200) + "y", false},
		{"r[0-9].log", "r7.log", true},
		{`\*`, "*", true},
		{`\*`, "x", false},
	} {
		if got := MatchArtifact(tt.pattern, tt.name); got != tt.want {
			t.Errorf("MatchArtifact(%q, %q) = %v, want %v", tt.pattern, tt.name, got, tt.want)
		}
	}
}

// A workflow publishes only the outputs its artifacts name: none
// without artifacts.
func TestPublished(t *testing.T) {
	t.Parallel()
	outputs := []string{"deploy.env", "report.txt", "site/a/index.html", "site/b.css"}
	for _, tt := range []struct {
		artifacts, want []string
	}{
		{nil, nil},
		{[]string{"report.txt"}, []string{"report.txt"}},
		{[]string{"site/**", "report.txt"}, []string{"report.txt", "site/a/index.html", "site/b.css"}},
		{[]string{"**/*.html"}, []string{"site/a/index.html"}},
	} {
		w := &Workflow{Artifacts: tt.artifacts}
		if diff := cmp.Diff(tt.want, w.Published(outputs)); diff != "" {
			t.Errorf("artifacts %v: published (-want +got):\n%s", tt.artifacts, diff)
		}
	}
}
