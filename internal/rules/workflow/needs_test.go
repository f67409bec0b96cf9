package workflow

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func parseAs(t *testing.T, file, src string) *Workflow {
	t.Helper()
	w, err := Parse(file, []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestNeedsParseErrors: each misuse within one file is an error at its
// place.
func TestNeedsParseErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ src, want string }{
		{"on: push\nneeds: [build, '']\nsteps: [{run: x}]\n", "w.yaml:2:16: needs: want a workflow's name (its file's name without .yaml), got none"},
		{"on: push\nneeds: [w]\nsteps: [{run: x}]\n", `w.yaml:2:9: needs: "w" is this workflow: a workflow cannot need itself`},
		{"on: push\nneeds: [a, a]\nsteps: [{run: x}]\n", `w.yaml:2:12: needs: "a" is named twice`},
		{"on: push\nneeds: [../a]\nsteps: [{run: x}]\n", `w.yaml:2:9: needs: "../a": want a workflow's name (its file's name without .yaml), not a path`},
		{"on: push\nneeds: {a: 1}\nsteps: [{run: x}]\n", "w.yaml:2:8: needs: want a string, got a mapping"},
	} {
		_, err := Parse("w.yaml", []byte(tt.src))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want %s", tt.src, err, tt.want)
		}
	}
}

// TestCheckNeeds: a name that is no workflow, a need that does not run
// on the needer's events, and a cycle (naming its workflows, at each
// of them) are errors at the need's place; a need on a file that does
// not parse is left to that file's own errors.
func TestCheckNeeds(t *testing.T) {
	t.Parallel()
	wfs := []*Workflow{
		parseAs(t, "d/build.yaml", "on: [push, pull]\nsteps: [{run: x}]\n"),
		parseAs(t, "d/test.yaml", "on: [push, pull]\nneeds: [build, broken]\nsteps: [{run: x}]\n"),
		parseAs(t, "d/deploy.yaml", "on: push\nneeds:\n  - test\n  - nosuch\nsteps: [{run: x}]\n"),
		parseAs(t, "d/pr.yaml", "on: [push, pull]\nneeds: deploy\nsteps: [{run: x}]\n"),
		parseAs(t, "d/pre.yaml", "on: pull\nqueue: first\nneeds: test\nsteps: [{run: x}]\n"),
		parseAs(t, "d/a.yaml", "on: push\nneeds: b\nsteps: [{run: x}]\n"),
		parseAs(t, "d/b.yaml", "on: push\nneeds: [c]\nsteps: [{run: x}]\n"),
		parseAs(t, "d/c.yaml", "on: push\nneeds: [a]\nsteps: [{run: x}]\n"),
	}
	got := map[string][]string{}
	for name, errs := range CheckNeeds(wfs, "broken") {
		for _, e := range errs {
			got[name] = append(got[name], e.Error())
		}
	}
	want := map[string][]string{
		"deploy": {`d/deploy.yaml:4:5: needs: "nosuch": no workflow of that name in d (known: a, b, build, c, deploy, pr, pre, test)`},
		"pr":     {`d/pr.yaml:2:8: needs: "deploy" does not run on pull, which pr runs on: a needed workflow runs on every event of the one that needs it`},
		"pre":    {`d/pre.yaml:3:8: needs: "test" is not queue: first, which pre is: a pre-flight runs only the queue: first workflows`},
		"a":      {`d/a.yaml:2:8: needs: "b" makes a cycle: a → b → c → a`},
		"b":      {`d/b.yaml:2:9: needs: "c" makes a cycle: a → b → c → a`},
		"c":      {`d/c.yaml:2:9: needs: "a" makes a cycle: a → b → c → a`},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
}

// TestPlanNeeds: Plan puts a workflow after those it needs, names the
// runs of each need (a matrix's legs), marks the needed ones, and
// leaves the workflows it was given as they were.
func TestPlanNeeds(t *testing.T) {
	t.Parallel()
	deploy := parseAs(t, "deploy.yaml", "on: push\nneeds: [test]\nsteps: [{run: x}]\n")
	test := parseAs(t, "test.yaml", "on: push\nneeds: [build]\nmatrix: {go: ['1', '2']}\nsteps: [{run: x}]\n")
	build := parseAs(t, "build.yaml", "on: push\nartifacts: [bin/*]\nsteps: [{run: x}]\n")
	other := parseAs(t, "other.yaml", "on: push\nsteps: [{run: x}]\n")
	plan := Plan([]*Workflow{deploy, other, test, build})
	var names []string
	for _, w := range plan {
		names = append(names, w.Name)
	}
	if diff := cmp.Diff([]string{"other", "build", "test (go=1)", "test (go=2)", "deploy"}, names); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	if !plan[1].Needed || plan[0].Needed || plan[4].Needed || !plan[2].Needed {
		t.Errorf("needed: other %v build %v test %v deploy %v; want build and test", plan[0].Needed, plan[1].Needed, plan[2].Needed, plan[4].Needed)
	}
	if diff := cmp.Diff([]string{"test (go=1)", "test (go=2)"}, plan[4].Needs[0].Runs); diff != "" {
		t.Errorf("deploy's need's runs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"build"}, plan[2].Needs[0].Runs); diff != "" {
		t.Errorf("a leg's need's runs (-want +got):\n%s", diff)
	}
	if deploy.Needs[0].Runs != nil || build.Needed {
		t.Errorf("Plan changed the workflows it was given")
	}
}
