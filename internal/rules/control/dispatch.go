package control

import (
	"slices"
	"strings"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/rules/workflow"
)

// DispatchPlan is what a dispatch record does on this runner.
type DispatchPlan struct {
	Verdict Verdict
	// Err says why, for Refuse (log it) and Fail (the check's error).
	Err error
	// Key is the dispatch's check key (a dispatch runs once per record:
	// a check of this key that exists already means it was served).
	Key string
	// Vars are the inputs the run gets (run.Request.Vars), defaults
	// filled in.
	Vars []workflow.EnvVar
}

// Branch is the branch of a dispatch's ref (refs/heads/NAME), or "" when
// the ref is not a branch.
func Branch(ref string) string {
	b, ok := strings.CutPrefix(ref, "refs/heads/")
	if !ok || b == "" {
		return ""
	}
	return b
}

// PlanDispatch decides the dispatch record uri on this runner (its DID):
// wf is the workflow rec.Workflow as the ref's head has it (nil when the
// head has no such workflow). Only the repository's owner dispatches;
// the workflow must run on dispatch, on this runner, for the ref's
// branch; the inputs are checked against the workflow's
// (Workflow.DispatchVars). The run is trusted, at the ref's head,
// subject DispatchSubject.
func PlanDispatch(runner, uri string, rec forge.Dispatch, wf *workflow.Workflow) DispatchPlan {
	r, err := readRecord(Dispatch, uri)
	if err != nil {
		return DispatchPlan{Verdict: Refuse, Err: err}
	}
	if rec.Runner != "" && rec.Runner != runner {
		return DispatchPlan{Verdict: NotMine}
	}
	if err := r.may(forge.Subject{Repo: rec.Repo}); err != nil {
		return DispatchPlan{Verdict: Refuse, Err: err}
	}
	plan := DispatchPlan{Key: forge.CheckKey(DispatchSubject(uri, rec, ""), rec.Workflow)}
	fail := func(format string, args ...any) DispatchPlan {
		plan.Verdict, plan.Err = Fail, r.refuse(format, args...)
		return plan
	}
	branch := Branch(rec.Ref)
	switch {
	case branch == "":
		return fail("ref %q is not a branch (refs/heads/…)", rec.Ref)
	case wf == nil:
		return fail("%s has no workflow %s", rec.Ref, rec.Workflow)
	case !wf.AllowsRunner(runner):
		return DispatchPlan{Verdict: NotMine}
	case !slices.Contains(wf.On, workflow.Dispatch):
		return fail("workflow %s does not run on dispatch (its on has no dispatch)", wf.Name)
	case !wf.Matches(workflow.Dispatch, branch):
		return fail("workflow %s does not run for branch %s (branches: %s)", wf.Name, branch, strings.Join(wf.Branches, ", "))
	}
	vars, err := wf.DispatchVars(Vars(rec.Inputs))
	if err != nil {
		plan.Verdict, plan.Err = Fail, err
		return plan
	}
	plan.Verdict, plan.Vars = Act, vars
	return plan
}

// DispatchSubject is the check subject of the dispatch record uri run
// at commit (the ref's head when the runner read the record).
func DispatchSubject(uri string, rec forge.Dispatch, commit string) forge.Subject {
	return forge.Subject{Repo: rec.Repo, Commit: commit, Ref: rec.Ref, Event: uri, Kind: forge.KindDispatch}
}
