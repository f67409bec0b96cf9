package control

import (
	"slices"
	"sort"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/rules/workflow"
)

// Attempt is one check a re-run or dispatch makes.
type Attempt struct {
	Workflow string
	// Attempt is the new attempt's number (AttemptKey's).
	Attempt int64
	// Key is the new check's record key.
	Key string
	// Subject is the original's: the same work, so the same trust.
	Subject forge.Subject
	// Cause is the record that made it (the check's cause).
	Cause string
}

// RerunPlan is what a re-run record does on this runner.
type RerunPlan struct {
	Verdict Verdict
	// Err says why, for Refuse.
	Err error
	// Runs are the new attempts (Act), in workflow order.
	Runs []Attempt
	// Waiting are the selected workflows whose last attempt is still
	// queued or running (Wait): nothing runs until they have ended, then
	// the plan is made again.
	Waiting []string
	// Vars are the record's env, for every run (run.Request.Vars).
	Vars []workflow.EnvVar
	// Trusted is the original's trust (Trusted of the subject's kind).
	Trusted bool
}

// failed are the final statuses "only the failed ones" selects.
var failed = []string{"failure", "error", "cancelled"}

// PlanRerun decides the re-run record uri on this runner (its DID).
// named is the runner's check whose key the record names (nil when it
// has none); checks are the runner's checks of the same work (its
// subject), every attempt, including the ones it has queued and not yet
// written: what a plan is made against must be what the runner knows
// now, or two re-runs read in a row would both take the same attempt.
//
// The record selects, among the workflows of named's event, every one,
// only rec.Workflow, or (rec.Failed) those whose last attempt ended
// failure, error or cancelled. A workflow that already has a check
// caused by uri is served, and never run for it again, whatever
// restarts happen. While a selected workflow's last attempt is queued
// or running the plan is Wait. Otherwise each selected workflow runs as
// attempt (its highest attempt + 1), with the original's subject and
// trust and the record's env.
func PlanRerun(runner, uri string, rec forge.Rerun, named *forge.Check, checks []forge.Check) RerunPlan {
	r, err := readRecord(Rerun, uri)
	if err != nil {
		return RerunPlan{Verdict: Refuse, Err: err}
	}
	if v, err := forThisRunner(r, runner, rec.Runner, rec.Repo, named); v != Act {
		return RerunPlan{Verdict: v, Err: err}
	}
	if rec.Workflow != "" && rec.Failed {
		return RerunPlan{Verdict: Refuse, Err: r.refuse("it names a workflow (%s) and asks for the failed ones: one or the other", rec.Workflow)}
	}
	type history struct {
		last   forge.Check
		served bool
	}
	byWorkflow := map[string]*history{}
	for _, c := range append([]forge.Check{*named}, checks...) {
		if !sameWork(c.Subject, named.Subject) {
			continue
		}
		h := byWorkflow[c.Workflow]
		if h == nil {
			h = &history{last: c}
			byWorkflow[c.Workflow] = h
		}
		if c.AttemptNumber() > h.last.AttemptNumber() {
			h.last = c
		}
		h.served = h.served || c.Cause == uri
	}
	names := make([]string, 0, len(byWorkflow))
	for name := range byWorkflow {
		names = append(names, name)
	}
	sort.Strings(names)
	if rec.Workflow != "" {
		if byWorkflow[rec.Workflow] == nil {
			return RerunPlan{Verdict: Refuse, Err: r.refuse("the event has no check of workflow %s (it has %v)", rec.Workflow, names)}
		}
		names = []string{rec.Workflow}
	}
	plan := RerunPlan{Verdict: Done, Vars: Vars(rec.Env), Trusted: Trusted(named.Subject.Kind)}
	for _, name := range names {
		h := byWorkflow[name]
		switch {
		case h.served:
			continue
		case !h.last.Final():
			plan.Waiting = append(plan.Waiting, name)
			continue
		case rec.Failed && !slices.Contains(failed, h.last.Status):
			continue
		}
		n := h.last.AttemptNumber() + 1
		plan.Runs = append(plan.Runs, Attempt{
			Workflow: name, Attempt: n, Key: forge.AttemptKey(named.Subject, name, n),
			Subject: named.Subject, Cause: uri,
		})
	}
	switch {
	case len(plan.Waiting) > 0:
		plan.Verdict, plan.Runs = Wait, nil
	case len(plan.Runs) > 0:
		plan.Verdict = Act
	}
	return plan
}

// sameWork reports whether two subjects are the same work (the fields
// a check key is made of).
func sameWork(a, b forge.Subject) bool {
	return a.Kind == b.Kind && a.Event == b.Event && a.Commit == b.Commit && a.Repo == b.Repo && a.Tick == b.Tick
}
