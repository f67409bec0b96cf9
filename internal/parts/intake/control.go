package intake

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// The events run control makes (internal/parts/runctl: re-runs, dispatches,
// schedules' ticks) are considered like pushes and pulls, within their
// author's caps; they name their workflows, each at its attempt
// (work.Control), and a re-run of a dispatch carries its inputs.

// ConsiderControl considers an event run control made (Consider): a
// re-run, a dispatch or a schedule's tick. It is noted as work of this
// reconcile: no listed event stands for it, and a deferral of it is
// remembered (pruneAfter) so it is logged once.
func (in *Intake) ConsiderControl(ctx context.Context, ev work.Event) error {
	in.noteControl(ev)
	return in.Consider(ctx, ev)
}

func (in *Intake) noteControl(ev work.Event) {
	in.mu.Lock()
	in.controlled[ev.Key()] = true
	in.mu.Unlock()
}

// ControlError writes the error check of workflow wf of an event run
// control made, within its author's caps: an author whose budget is
// spent waits, as for its runs.
func (in *Intake) ControlError(ctx context.Context, ev work.Event, wf, msg string) {
	log := in.log.With("event", ev.URI.String(), "commit", ev.Commit)
	in.noteControl(ev)
	if a := job.Author(ev, in.facts.LimitsAll); a != "" {
		defer in.admission.Lock(a)()
	}
	if dec, first := in.capsSay(ev, need{known: true, checks: 1, errors: 1}); dec.verdict == wait {
		in.deferEvent(log, ev, dec, first)
		return
	}
	log.Warn("run-control record cannot run; error check written", "workflow", wf, "reason", msg)
	in.p.Checks.Error(ctx, ev, wf, msg)
}

// notRunnable is a workflow a run-control event names that cannot run,
// and why: its error check's text.
type notRunnable struct {
	name, why string
}

// runVars are the run variables of workflow wf for ev: its Vars, or for
// a re-run of a dispatch, the dispatch's inputs checked against wf
// (with their defaults) and the re-run's env on top.
func runVars(ev work.Event, wf *workflow.Workflow) ([]workflow.EnvVar, error) {
	if ev.Inputs == nil {
		return ev.Vars, nil
	}
	inputs, err := wf.DispatchVars(ev.Inputs)
	if err != nil {
		return nil, err
	}
	vars := slices.DeleteFunc(inputs, func(in workflow.EnvVar) bool {
		return slices.ContainsFunc(ev.Vars, func(v workflow.EnvVar) bool { return v.Name == in.Name })
	})
	return append(vars, ev.Vars...), nil
}

// missingWorkflows are the workflows a run-control event names that
// neither became jobs nor are already said (notRun, invalid): not at
// the commit any more, or not for this runner. Each gets an error
// check, so that every attempt a record plans has one and the record
// is served.
func missingWorkflows(ev work.Event, jobs []*job.Job, notRun []notRunnable, invalid func(string) bool) []notRunnable {
	var out []notRunnable
	for _, name := range slices.Sorted(maps.Keys(ev.Workflows)) {
		if slices.ContainsFunc(jobs, func(j *job.Job) bool {
			return j.Workflow.Name == name || (j.Workflow.Leg != nil && j.Workflow.Leg.Base == name)
		}) ||
			slices.ContainsFunc(notRun, func(n notRunnable) bool { return n.name == name }) || invalid(name) {
			continue
		}
		out = append(out, notRunnable{name, fmt.Sprintf("workflow %s does not run at %s on this runner (no such workflow for it there)", name, ev.Commit)})
	}
	return out
}
