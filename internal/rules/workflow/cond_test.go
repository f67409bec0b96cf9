package workflow

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseStepControl(t *testing.T) {
	t.Parallel()
	src := `on: [push, dispatch]
steps:
  - name: build
    run: make
    working-directory: ./src/app/
    continue-on-error: true
  - name: clean
    run: make clean
    if: always()
  - name: here
    run: "true"
    working-directory: .
`
	w, err := Parse("w.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	type step struct {
		Dir      string
		Continue bool
		If       string
	}
	var got []step
	for _, s := range w.Steps {
		st := step{Dir: s.WorkingDirectory, Continue: s.ContinueOnError}
		if s.If != nil {
			st.If = s.If.Text
		}
		got = append(got, st)
	}
	want := []step{{Dir: "src/app", Continue: true}, {If: "always()"}, {}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
}

func TestStepControlErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, steps string
		want        []string
	}{
		{"unknown event field", "  - {run: x, if: event.foo == 'a'}\n", []string{
			`w.yaml:3:18: steps[0].if: unknown name "event.foo" (known: event.kind, event.ref, event.branch, event.tag, event.base, event.trusted, inputs.deploy, inputs.target, success(), failure(), cancelled(), always())`,
		}},
		{"type error, quoted", "  - run: x\n    if: \"event.kind == 1\"\n", []string{
			`w.yaml:4:21: steps[0].if: found no matching overload for '_==_' applied to '(string, int)'`,
		}},
		{"not a bool", "  - run: x\n    if: event.branch\n", []string{
			`w.yaml:4:9: steps[0].if: want a bool, got string`,
		}},
		{"input types", "  - run: x\n    if: inputs.deploy == 'yes' && inputs.target == 'prod'\n", []string{
			`w.yaml:4:23: steps[0].if: found no matching overload for '_==_' applied to '(bool, string)'`,
		}},
		{"unknown function", "  - run: x\n    if: finished()\n", []string{
			`w.yaml:4:17: steps[0].if: unknown name "finished()" (known: event.kind, event.ref, event.branch, event.tag, event.base, event.trusted, inputs.deploy, inputs.target, success(), failure(), cancelled(), always())`,
		}},
		{"syntax", "  - run: x\n    if: success() &&\n", []string{
			`w.yaml:4:21: steps[0].if: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}`,
		}},
		{"empty", "  - run: x\n    if: ''\n", []string{`w.yaml:4:9: steps[0].if: want an expression, got nothing`}},
		{"in a block", "  - run: x\n    if: |\n      success() &&\n        nope\n", []string{
			`w.yaml:4:9: steps[0].if: unknown name "nope" (known: event.kind, event.ref, event.branch, event.tag, event.base, event.trusted, inputs.deploy, inputs.target, success(), failure(), cancelled(), always()) (at line 2, column 3 of the expression)`,
		}},
		{"too long", "  - run: x\n    if: '" + strings.Repeat("true && ", 300) + "true'\n", []string{
			`w.yaml:4:9: steps[0].if: expression code point size exceeds limit: size: 2404, limit 2048`,
		}},
		{"continue-on-error", "  - run: x\n    continue-on-error: 1\n", []string{
			`w.yaml:4:24: steps[0].continue-on-error: want true or false, got "1"`,
		}},
		{"working-directory escapes", "  - run: x\n    working-directory: a/../../etc\n", []string{
			`w.yaml:4:24: steps[0].working-directory: "a/../../etc": must stay in the checkout: no .. in it`,
		}},
		{"working-directory absolute", "  - run: x\n    working-directory: /etc\n", []string{
			`w.yaml:4:24: steps[0].working-directory: "/etc": must be relative to the checkout, not absolute`,
		}},
		{"working-directory empty", "  - run: x\n    working-directory: ''\n", []string{
			`w.yaml:4:24: steps[0].working-directory: "": want a directory relative to the checkout, got nothing`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := "on: {dispatch: {inputs: {deploy: {type: boolean}, target: {type: choice, options: [prod, test]}}}}\nsteps:\n" + tt.steps
			_, err := Parse("w.yaml", []byte(src))
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("Parse: %v, want Errors", err)
			}
			var got []string
			for _, e := range es {
				got = append(got, e.Error())
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStepRuns(t *testing.T) {
	t.Parallel()
	src := `on: {push: {}, dispatch: {inputs: {deploy: {type: boolean}, target: {default: test}}}}
steps:
  - {name: plain, run: x}
  - {name: always, run: x, if: always()}
  - {name: failure, run: x, if: failure()}
  - {name: cancelled, run: x, if: cancelled()}
  - {name: success, run: x, if: success()}
  - {name: main, run: x, if: "event.kind == 'push' && event.branch == 'main' && event.trusted"}
  - {name: tag, run: x, if: "event.tag.startsWith('v') && event.branch == ''"}
  - {name: pull, run: x, if: "event.kind == 'pull' && event.base == 'main' && !event.trusted"}
  - {name: deploy, run: x, if: "inputs.deploy && inputs.target == 'prod'"}
  - {name: default, run: x, if: "!inputs.deploy && inputs.target == 'test'"}
  - {name: ref, run: x, if: "event.ref == 'refs/heads/main'"}
  - {name: failure-on-main, run: x, if: "failure() && event.branch == 'main'"}
`
	w, err := Parse("w.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	push := CondEvent{Kind: "push", Ref: "refs/heads/main", Trusted: true}
	tag := CondEvent{Kind: "push", Ref: "refs/tags/v1.2", Trusted: true}
	pull := CondEvent{Kind: "pull", Ref: "refs/heads/main", Base: "main"}
	dispatch := CondEvent{Kind: "dispatch", Ref: "refs/heads/dev", Trusted: true}
	tests := []struct {
		name  string
		state State
		ev    CondEvent
		vars  []EnvVar
		want  []string
	}{
		{"push, success", StateSuccess, push, nil, []string{"plain", "always", "success", "main", "default", "ref"}},
		// A condition without a step-state function holds only where
		// success() does: main, default and ref do not run here.
		{"push, failure", StateFailure, push, nil, []string{"always", "failure", "failure-on-main"}},
		{"push, cancelled", StateCancelled, push, nil, []string{"always", "cancelled"}},
		{"tag", StateSuccess, tag, nil, []string{"plain", "always", "success", "tag", "default"}},
		{"pull", StateSuccess, pull, nil, []string{"plain", "always", "success", "pull", "default", "ref"}},
		{"dispatch with inputs", StateSuccess, dispatch, []EnvVar{{"deploy", "true"}, {"target", "prod"}}, []string{"plain", "always", "success", "deploy"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vars := w.CondVars(tt.ev, tt.vars)
			var got []string
			for i, s := range w.Steps {
				ok, err := w.StepRuns(i, tt.state, vars)
				if err != nil {
					t.Fatalf("step %s: %v", s.Name, err)
				}
				if ok {
					got = append(got, s.Name)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("steps that run (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCondCostIsBounded(t *testing.T) {
	t.Parallel()
	src := "on: push\nsteps:\n  - run: x\n    if: \"[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, a+b+c+d > 0))))\"\n"
	w, err := Parse("w.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.StepRuns(0, StateSuccess, w.CondVars(CondEvent{}, nil))
	if err == nil {
		t.Fatal("a condition of 10^4 comparisons was decided; want the cost limit to stop it")
	}
}

func BenchmarkParseConditions(b *testing.B) {
	src := []byte("on: push\nsteps:\n  - {run: x, if: \"event.branch == 'main'\"}\n  - {run: y, if: failure()}\n  - {run: z, if: always()}\n")
	for b.Loop() {
		if _, err := Parse("w.yaml", src); err != nil {
			b.Fatal(err)
		}
	}
}

// The reference's examples of conditions are workflows validate takes
// (a block without on: is given on: push).
func TestReferenceConditionExamplesParse(t *testing.T) {
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
		if !strings.Contains(src, "if:") {
			continue
		}
		blocks++
		if !strings.HasPrefix(src, "on:") {
			src = "on: push\n" + src
		}
		if _, err := Parse("example.yaml", []byte(src)); err != nil {
			t.Errorf("yaml block %d of docs/reference/workflow.md: %v", i+1, err)
		}
	}
	if blocks < 2 {
		t.Errorf("%d examples with if: in docs/reference/workflow.md, want at least 2", blocks)
	}
}

func TestWorkflowIf(t *testing.T) {
	t.Parallel()
	// if before on: the inputs it reads are declared after it.
	w, err := Parse("w.yaml", []byte("if: event.branch == 'main' || inputs.force\non: {push: {}, dispatch: {inputs: {force: {type: boolean}}}}\nsteps:\n  - run: x\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ev   CondEvent
		vars []EnvVar
		want bool
	}{
		{CondEvent{Kind: "push", Ref: "refs/heads/main"}, nil, true},
		{CondEvent{Kind: "push", Ref: "refs/heads/dev"}, nil, false},
		{CondEvent{Kind: "dispatch", Ref: "refs/heads/dev"}, []EnvVar{{"force", "true"}}, true},
	} {
		got, err := w.Holds(c.ev, c.vars)
		if err != nil || got != c.want {
			t.Errorf("Holds(%+v, %v) = %v, %v; want %v", c.ev, c.vars, got, err, c.want)
		}
	}
	_, err = Parse("w.yaml", []byte("on: push\nif: success()\nsteps:\n  - run: x\n"))
	want := `w.yaml:2:12: if: unknown name "success()" (known: event.kind, event.ref, event.branch, event.tag, event.base, event.trusted)`
	if err == nil || err.Error() != want {
		t.Errorf("a step-state function at the workflow's if: %v, want %s", err, want)
	}
}
