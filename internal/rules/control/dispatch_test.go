package control

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/rules/workflow"
)

func TestPlanDispatch(t *testing.T) {
	t.Parallel()
	parse := func(name, src string) *workflow.Workflow {
		w, err := workflow.Parse(name+".yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	deploy := parse("deploy", `on:
  dispatch:
    inputs:
      target: {type: choice, options: [staging, production], default: staging}
      note: {required: true}
branches: [main, "release/*"]
steps: [{run: x}]
`)
	pushOnly := parse("build", "on: push\nsteps: [{run: x}]\n")
	elsewhere := parse("deploy", "on: dispatch\nrunners: ["+other+"]\nsteps: [{run: x}]\n")
	uri := "at://" + owner + "/dev.knotless.dispatch/3n3pa7x34wk22"
	rec := func(ref, wf string, inputs ...forge.Variable) forge.Dispatch {
		return forge.Dispatch{Repo: repo, Ref: ref, Workflow: wf, Inputs: inputs}
	}
	key := forge.CheckKey(forge.Subject{Kind: forge.KindDispatch, Event: uri}, "deploy")
	refused := func(uri, actor, reason string) error {
		return &Refused{Action: Dispatch, Actor: actor, Record: uri, Reason: reason}
	}
	tests := []struct {
		name string
		uri  string
		rec  forge.Dispatch
		wf   *workflow.Workflow
		want DispatchPlan
	}{
		{"runs with its inputs", uri, rec("refs/heads/main", "deploy", forge.Variable{Name: "note", Value: "hi"}), deploy, DispatchPlan{
			Verdict: Act, Key: key, Vars: []workflow.EnvVar{{Name: "target", Value: "staging"}, {Name: "note", Value: "hi"}},
		}},
		{"a branch the globs admit", uri, rec("refs/heads/release/1.0", "deploy", forge.Variable{Name: "note", Value: ""}), deploy, DispatchPlan{
			Verdict: Act, Key: key, Vars: []workflow.EnvVar{{Name: "target", Value: "staging"}, {Name: "note", Value: ""}},
		}},
		{"a missing required input", uri, rec("refs/heads/main", "deploy"), deploy, DispatchPlan{
			Verdict: Fail, Key: key, Err: &workflow.InputError{Workflow: "deploy", Name: "note", Reason: "required, and not given"},
		}},
		{"a branch the workflow does not run for", uri, rec("refs/heads/dev", "deploy", forge.Variable{Name: "note", Value: "x"}), deploy, DispatchPlan{
			Verdict: Fail, Key: key, Err: refused(uri, owner, "workflow deploy does not run for branch dev (branches: main, release/*)"),
		}},
		{"not a branch", uri, rec("refs/tags/v1", "deploy"), deploy, DispatchPlan{
			Verdict: Fail, Key: key, Err: refused(uri, owner, `ref "refs/tags/v1" is not a branch (refs/heads/…)`),
		}},
		{"no such workflow at the ref", uri, rec("refs/heads/main", "deploy"), nil, DispatchPlan{
			Verdict: Fail, Key: key, Err: refused(uri, owner, "refs/heads/main has no workflow deploy"),
		}},
		{"a workflow without on: dispatch", uri, rec("refs/heads/main", "build"), pushOnly, DispatchPlan{
			Verdict: Fail, Key: forge.CheckKey(forge.Subject{Kind: forge.KindDispatch, Event: uri}, "build"),
			Err: refused(uri, owner, "workflow build does not run on dispatch (its on has no dispatch)"),
		}},
		{"a workflow for other runners", uri, rec("refs/heads/main", "deploy"), elsewhere, DispatchPlan{Verdict: NotMine}},
		{"another runner named", uri, forge.Dispatch{Repo: repo, Ref: "refs/heads/main", Workflow: "deploy", Runner: other}, deploy, DispatchPlan{Verdict: NotMine}},
		{"the pull's author may not", "at://" + author + "/dev.knotless.dispatch/3n3pa7x34wk22", rec("refs/heads/main", "deploy"), deploy, DispatchPlan{
			Verdict: Refuse, Err: refused("at://"+author+"/dev.knotless.dispatch/3n3pa7x34wk22", author, "only the repository's owner ("+owner+") dispatches its workflows"),
		}},
		{"a stranger may not", "at://" + stranger + "/dev.knotless.dispatch/x", rec("refs/heads/main", "deploy"), deploy, DispatchPlan{
			Verdict: Refuse, Err: refused("at://"+stranger+"/dev.knotless.dispatch/x", stranger, "only the repository's owner ("+owner+") dispatches its workflows"),
		}},
		{"not a dispatch record", rerunURI(owner), rec("refs/heads/main", "deploy"), deploy, DispatchPlan{
			Verdict: Refuse, Err: refused(rerunURI(owner), owner, "a dev.knotless.rerun record, not dev.knotless.dispatch"),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := PlanDispatch(runner, tt.uri, tt.rec, tt.wf)
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b error) bool {
				return (a == nil) == (b == nil) && (a == nil || a.Error() == b.Error())
			})); diff != "" {
				t.Errorf("PlanDispatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDispatchSubject(t *testing.T) {
	t.Parallel()
	uri := "at://" + owner + "/dev.knotless.dispatch/3n3pa7x34wk22"
	got := DispatchSubject(uri, forge.Dispatch{Repo: repo, Ref: "refs/heads/main", Workflow: "deploy"}, commit)
	want := forge.Subject{Repo: repo, Commit: commit, Ref: "refs/heads/main", Event: uri, Kind: forge.KindDispatch}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Error(diff)
	}
	for ref, want := range map[string]string{"refs/heads/main": "main", "refs/heads/a/b": "a/b", "refs/heads/": "", "main": "", "refs/tags/v1": ""} {
		if got := Branch(ref); got != want {
			t.Errorf("Branch(%q) = %q, want %q", ref, got, want)
		}
	}
}
