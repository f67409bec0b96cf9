package workflow

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseOutputs(t *testing.T) {
	t.Parallel()
	got, problems := ParseOutputs([]byte("a=1\r\n\nb-c=x=y\n=no key\n9x=bad\nd\nnul=a\x00b\na=2\n"))
	if diff := cmp.Diff(map[string]string{"a": "2", "b-c": "x=y"}, got); diff != "" {
		t.Errorf("outputs (-want +got):\n%s", diff)
	}
	want := []string{
		"line 4: not key=value with a key of letters, digits, _ and -",
		"line 5: not key=value with a key of letters, digits, _ and -",
		"line 6: not key=value with a key of letters, digits, _ and -",
		"line 7: nul: the value holds a NUL byte",
	}
	if diff := cmp.Diff(want, problems); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
	var b strings.Builder
	for i := range MaxOutputKeys + 2 {
		fmt.Fprintf(&b, "k%d=v\n", i)
	}
	got, problems = ParseOutputs([]byte(b.String()))
	if len(got) != MaxOutputKeys || len(problems) != 2 {
		t.Errorf("%d outputs, %d problems; want %d and 2", len(got), len(problems), MaxOutputKeys)
	}
}

func TestStepOutputsInIfAndEnv(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `on: push
matrix:
  os: [linux]
steps:
  - {name: make, run: x}
  - {run: y}
  - name: use
    if: steps.make.outputs.v == "1"
    env: {V: "${{ steps.make.outputs.v }}-${{ matrix.os }}", W: plain}
    run: z
`)
	if w.Steps[0].ReadsOutputs || !w.Steps[2].ReadsOutputs {
		t.Errorf("ReadsOutputs: %v %v %v", w.Steps[0].ReadsOutputs, w.Steps[1].ReadsOutputs, w.Steps[2].ReadsOutputs)
	}
	leg := w.Legs()[0]
	outs := Outputs{0: {"v": "1"}}
	if diff := cmp.Diff([]EnvVar{{"V", "1-linux"}, {"W", "plain"}}, leg.StepEnv(2, outs)); diff != "" {
		t.Errorf("StepEnv (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]EnvVar{{"V", "-linux"}, {"W", "plain"}}, leg.StepEnv(2, nil)); diff != "" {
		t.Errorf("StepEnv without outputs (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		outs Outputs
		want bool
	}{{outs, true}, {Outputs{0: {"v": "2"}}, false}} {
		vars := leg.CondVars(CondEvent{Kind: "push"}, nil)
		leg.OutputVars(vars, tc.outs)
		if got, err := leg.StepRuns(2, StateSuccess, vars); err != nil || got != tc.want {
			t.Errorf("StepRuns with %v = %v, %v; want %v", tc.outs, got, err, tc.want)
		}
	}
}

func TestStepOutputsErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src string
		want      []string
	}{
		{"a later step's outputs", "on: push\nsteps:\n  - {name: a, if: 'steps.b.outputs.x == \"1\"', run: x}\n  - {name: b, run: y}\n", []string{
			`w.yaml:3:19: steps[0].if: steps.b.outputs: "b" is not an earlier step`,
		}},
		{"its own outputs", "on: push\nsteps:\n  - {name: a, env: {X: '${{ steps.a.outputs.x }}'}, run: x}\n", []string{
			`w.yaml:3:24: steps[0].env.X: "${{ steps.a.outputs.x }}": "a" is not an earlier step`,
		}},
		{"no such step", "on: push\nsteps:\n  - {name: a, run: x}\n  - {name: b, if: 'steps.c.outputs.x == \"\"', run: y}\n", []string{
			`w.yaml:4:20: steps[1].if: unknown name "steps.c.outputs.x" (known: event.kind, event.ref, event.branch, event.tag, event.base, event.trusted, steps.a.outputs, steps.b.outputs, success(), failure(), cancelled(), always())`,
		}},
		{"bad env", "on: push\nsecrets: [T]\nsteps:\n  - {name: a, run: x}\n  - {name: b, env: {KNOTLESS_X: 1, T: 2, Y: '${{ steps.a }}'}, run: y}\n", []string{
			`w.yaml:5:21: steps[1].env: "KNOTLESS_X" is not a usable variable name (letters, digits, _; KNOTLESS_ is reserved)`,
			`w.yaml:5:36: steps[1].env: "T" is a secret the workflow grants`,
			`w.yaml:5:45: steps[1].env.Y: "${{ steps.a }}": want ${{ steps.NAME.outputs.KEY }}`,
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
