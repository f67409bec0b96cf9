package control

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/rules/workflow"
)

func check(s forge.Subject, wf, status string, attempt int64, cause string) forge.Check {
	return forge.Check{Subject: s, Workflow: wf, Status: status, Attempt: attempt, Cause: cause}
}

func attempt(s forge.Subject, wf string, n int64, cause string) Attempt {
	return Attempt{Workflow: wf, Attempt: n, Key: forge.AttemptKey(s, wf, n), Subject: s, Cause: cause}
}

func TestPlanRerun(t *testing.T) {
	t.Parallel()
	r := rerunURI(owner)
	ar := rerunURI(author)
	otherCommit := pushSubject
	otherCommit.Commit = "b" + commit[1:]
	// The push's checks: build failed, lint passed, test was cancelled.
	build := check(pushSubject, "build", "failure", 0, "")
	pushChecks := []forge.Check{
		build,
		check(pushSubject, "lint", "success", 0, ""),
		check(pushSubject, "test", "cancelled", 1, ""),
		// Another commit's checks are another event's work.
		check(otherCommit, "deploy", "failure", 0, ""),
	}
	env := []forge.Variable{{Name: "DEBUG", Value: "1"}}
	tests := []struct {
		name   string
		uri    string
		rec    forge.Rerun
		named  *forge.Check
		checks []forge.Check
		want   RerunPlan
	}{
		{"all, by the owner", r, forge.Rerun{Check: "k", Env: env}, &build, pushChecks, RerunPlan{
			Verdict: Act, Trusted: true, Vars: []workflow.EnvVar{{Name: "DEBUG", Value: "1"}},
			Runs: []Attempt{attempt(pushSubject, "build", 2, r), attempt(pushSubject, "lint", 2, r), attempt(pushSubject, "test", 2, r)},
		}},
		{"one by name", r, forge.Rerun{Check: "k", Workflow: "lint"}, &build, pushChecks, RerunPlan{
			Verdict: Act, Trusted: true, Runs: []Attempt{attempt(pushSubject, "lint", 2, r)},
		}},
		{"only the failed: failure, error and cancelled", r, forge.Rerun{Check: "k", Failed: true}, &build, pushChecks, RerunPlan{
			Verdict: Act, Trusted: true, Runs: []Attempt{attempt(pushSubject, "build", 2, r), attempt(pushSubject, "test", 2, r)},
		}},
		{"the next attempt is after the highest", r, forge.Rerun{Check: "k", Workflow: "build"}, &build,
			append(pushChecks, check(pushSubject, "build", "error", 3, rerunURI(owner)+"x"), check(pushSubject, "build", "success", 2, "")), RerunPlan{
				Verdict: Act, Trusted: true, Runs: []Attempt{attempt(pushSubject, "build", 4, r)},
			}},
		{"served: a check caused by the record exists", r, forge.Rerun{Check: "k"}, &build,
			append(pushChecks, check(pushSubject, "build", "success", 2, r), check(pushSubject, "lint", "running", 2, r), check(pushSubject, "test", "queued", 2, r)),
			RerunPlan{Verdict: Done, Trusted: true}},
		{"served, and a later re-run made the last attempt", r, forge.Rerun{Check: "k", Failed: true}, &build,
			append(pushChecks, check(pushSubject, "build", "failure", 2, r), check(pushSubject, "build", "failure", 3, r+"x"), check(pushSubject, "test", "failure", 2, r)),
			RerunPlan{Verdict: Done, Trusted: true}},
		{"nothing failed", r, forge.Rerun{Check: "k", Failed: true}, &build,
			[]forge.Check{check(pushSubject, "build", "success", 2, "")}, RerunPlan{Verdict: Done, Trusted: true}},
		{"waits while a selected workflow runs", r, forge.Rerun{Check: "k"}, &build,
			append(pushChecks, check(pushSubject, "lint", "running", 2, r+"x"), check(pushSubject, "test", "queued", 2, "")), RerunPlan{
				Verdict: Wait, Trusted: true, Waiting: []string{"lint", "test"},
			}},
		{"only the failed waits for a running one", r, forge.Rerun{Check: "k", Failed: true}, &build,
			append(pushChecks, check(pushSubject, "lint", "running", 2, "")), RerunPlan{
				Verdict: Wait, Trusted: true, Waiting: []string{"lint"},
			}},
		{"one by name does not wait for the others", r, forge.Rerun{Check: "k", Workflow: "build"}, &build,
			append(pushChecks, check(pushSubject, "lint", "running", 2, "")), RerunPlan{
				Verdict: Act, Trusted: true, Runs: []Attempt{attempt(pushSubject, "build", 2, r)},
			}},
		{"a pull's re-run stays untrusted, by its author", ar, forge.Rerun{Check: "k"}, ptr(check(pullSubject, "build", "failure", 0, "")), nil, RerunPlan{
			Verdict: Act, Trusted: false, Runs: []Attempt{attempt(pullSubject, "build", 2, ar)},
		}},
		{"a stranger", rerunURI(stranger), forge.Rerun{Check: "k"}, ptr(check(pullSubject, "build", "failure", 0, "")), nil, RerunPlan{
			Verdict: Refuse, Err: &Refused{Action: Rerun, Actor: stranger, Record: rerunURI(stranger),
				Reason: "neither the repository's owner (" + owner + ") nor the pull's author (" + author + ")"},
		}},
		{"the pull's author on a push", ar, forge.Rerun{Check: "k"}, &build, pushChecks, RerunPlan{
			Verdict: Refuse, Err: &Refused{Action: Rerun, Actor: author, Record: ar,
				Reason: "not the repository's owner (" + owner + "): a push check is the owner's to rerun"},
		}},
		{"workflow and failed", r, forge.Rerun{Check: "k", Workflow: "build", Failed: true}, &build, pushChecks, RerunPlan{
			Verdict: Refuse, Err: &Refused{Action: Rerun, Actor: owner, Record: r,
				Reason: "it names a workflow (build) and asks for the failed ones: one or the other"},
		}},
		{"a workflow the event has no check of", r, forge.Rerun{Check: "k", Workflow: "deploy"}, &build, pushChecks, RerunPlan{
			Verdict: Refuse, Err: &Refused{Action: Rerun, Actor: owner, Record: r,
				Reason: "the event has no check of workflow deploy (it has [build lint test])"},
		}},
		{"no such check here", r, forge.Rerun{Check: "k"}, nil, pushChecks, RerunPlan{Verdict: NotMine}},
		{"another runner's", r, forge.Rerun{Check: "k", Runner: other}, &build, pushChecks, RerunPlan{Verdict: NotMine}},
		{"not a rerun record", cancelURI(owner), forge.Rerun{Check: "k"}, &build, pushChecks, RerunPlan{
			Verdict: Refuse, Err: &Refused{Action: Rerun, Actor: owner, Record: cancelURI(owner),
				Reason: "a dev.knotless.cancel record, not dev.knotless.rerun"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := PlanRerun(runner, tt.uri, tt.rec, tt.named, tt.checks)
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b error) bool {
				return (a == nil) == (b == nil) && (a == nil || a.Error() == b.Error())
			})); diff != "" {
				t.Errorf("PlanRerun (-want +got):\n%s", diff)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestVars(t *testing.T) {
	t.Parallel()
	if Vars(nil) != nil {
		t.Error("Vars(nil) is not nil")
	}
}
