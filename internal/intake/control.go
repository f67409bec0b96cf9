package intake

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/control"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
	"knotless.dev/run/internal/job"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/work"
	"knotless.dev/run/internal/workflow"
)

// Run control (docs/design/protocol.md, "Run control"): the owner, or a
// pull's author, acts on runs by writing cancel, rerun and dispatch
// records in their own repo; a reconcile lists them beside the pushes
// and pulls (ingest.Snapshot.Controls) and intake decides each with the
// pure rules of internal/control. A cancel goes to the scheduler; a
// re-run or a dispatch becomes an event that Consider takes like a push
// or a pull (the same caps, counted against the record's author, and
// the same error checks), its workflows named, each at its attempt.
// Verdicts: Refuse is logged (once a record), Fail is an error check,
// NotMine and Done say nothing.

// cancels acts on the cancel records listed. It runs before the events
// are considered, so that a check an earlier process left queued, and
// now cancelled, is not queued again.
func (in *Intake) cancels(ctx context.Context, snap *ingest.Snapshot) {
	runner := in.facts.Runner.String()
	for _, r := range snap.Controls.Cancels {
		uri := r.URI.String()
		var check *forge.Check
		if c, known := in.p.Checks.Get(r.Value.Check); known {
			check = &c
		}
		v, err := control.DecideCancel(runner, uri, r.Value, check)
		switch v {
		case control.Refuse:
			in.refuseOnce(uri, err)
		case control.Act:
			// A run stops, and writes its final check, some time after
			// its cancel: acted on once in this process.
			acted := "cancelled\x00" + uri + "\x00" + r.Value.Check
			if in.once.seen(acted) {
				continue
			}
			log := in.log.With("check", r.Value.Check, "cancel", uri)
			if !in.p.Scheduler.CancelCheck(ctx, r.Value.Check, uri, eventOf(*check, snap), *check) {
				log.Debug("cancel: the work is being queued; cancelled at the next reconcile")
				continue
			}
			in.once.first(acted)
			log.Info("cancel record: work cancelled", "workflow", check.Workflow, "was", check.Status)
		}
	}
}

// reruns acts on the rerun records listed: each selected workflow of
// the named check's event runs again as a new attempt, through
// Consider.
func (in *Intake) reruns(ctx context.Context, snap *ingest.Snapshot) {
	runner := in.facts.Runner.String()
	cutoff := time.Now().Add(-in.cfg.Retention)
	for _, r := range snap.Controls.Reruns {
		if ctx.Err() != nil {
			return
		}
		if olderThan(r.URI, cutoff) {
			continue // its checks may be forgotten: never work again
		}
		uri := r.URI.String()
		named, known := in.p.Checks.Get(r.Value.Check)
		if !known {
			continue
		}
		plan := control.PlanRerun(runner, uri, r.Value, &named, in.p.Checks.Work(named.Subject))
		switch plan.Verdict {
		case control.Refuse:
			in.refuseOnce(uri, plan.Err)
			continue
		case control.Act:
		default:
			continue
		}
		runs := map[string]int64{}
		for _, a := range plan.Runs {
			runs[a.Workflow] = a.Attempt
		}
		ev, err := in.controlEvent(snap, named.Subject, uri, runs, plan.Vars)
		if err != nil {
			in.refuseOnce(uri, err)
			continue
		}
		if in.once.first("rerun\x00" + uri) { // a deferred one is planned again at each reconcile
			in.log.Info("rerun record: running again", "rerun", uri, "check", r.Value.Check, "workflows", len(runs), "trusted", ev.Trusted)
		}
		if err := in.considerControl(ctx, ev); err != nil {
			in.log.Error("re-run not handled; tried again at the next reconcile", "rerun", uri, "err", err)
		}
	}
}

// controlEvent is the event that runs the work of subject s again for
// the run-control record cause: the workflows of runs, each at its
// attempt, with vars, and the trust of its kind (a pull's re-run is
// untrusted). A pull's re-run runs the pull's head merged onto its
// base's current commit, as the pull's own runs do; it needs the pull
// open, listed at any commit. A re-run of a dispatch runs with the
// dispatch record's inputs again (when it is still listed), the
// re-run's env on top.
func (in *Intake) controlEvent(snap *ingest.Snapshot, s forge.Subject, cause string, runs map[string]int64, vars []workflow.EnvVar) (work.Event, error) {
	i := slices.IndexFunc(snap.Repos, func(r forge.Record[forge.Repo]) bool { return r.URI.String() == s.Repo })
	if i < 0 {
		return work.Event{}, fmt.Errorf("repository %s is not served by this runner now", s.Repo)
	}
	ev := work.Event{Kind: s.Kind, URI: syntax.ATURI(s.Event), Repo: snap.Repos[i], Ref: s.Ref, Commit: s.Commit,
		Trusted: control.Trusted(s.Kind), Vars: vars,
		Control: work.Control{Cause: cause, Workflows: runs, Tick: s.Tick}}
	switch s.Kind {
	case forge.KindPull:
		j := slices.IndexFunc(snap.Events, func(e work.Event) bool { return e.Kind == forge.KindPull && e.URI == ev.URI })
		if j < 0 {
			return work.Event{}, fmt.Errorf("pull %s is not open", s.Event)
		}
		ev.Pull = snap.Events[j].Pull
	case forge.KindDispatch:
		ev.Inputs = []workflow.EnvVar{}
		if j := slices.IndexFunc(snap.Controls.Dispatches, func(d forge.Record[forge.Dispatch]) bool { return d.URI == ev.URI }); j >= 0 {
			ev.Inputs = append(ev.Inputs, control.Vars(snap.Controls.Dispatches[j].Value.Inputs)...)
		}
	}
	return ev, nil
}

// dispatches acts on the dispatch records listed: the workflow runs on
// the ref's head, trusted, once per record (its check's key is the
// record's).
func (in *Intake) dispatches(ctx context.Context, snap *ingest.Snapshot) {
	runner := in.facts.Runner.String()
	cutoff := time.Now().Add(-in.cfg.Retention)
	for _, r := range snap.Controls.Dispatches {
		if ctx.Err() != nil {
			return
		}
		uri, rec := r.URI.String(), r.Value
		key := forge.CheckKey(control.DispatchSubject(uri, rec, ""), rec.Workflow)
		if olderThan(r.URI, cutoff) || in.p.Checks.Final(key) || in.p.Scheduler.HasCheck(key) {
			continue // served, or past the retention
		}
		// Who may, before any git work.
		switch plan := control.PlanDispatch(runner, uri, rec, nil); plan.Verdict {
		case control.NotMine:
			continue
		case control.Refuse:
			in.refuseOnce(uri, plan.Err)
			continue
		}
		branch := control.Branch(rec.Ref)
		if branch == "" {
			// No commit to write a check on: said in the log.
			in.refuseOnce(uri, fmt.Errorf("dispatch %s: ref %q is not a branch (refs/heads/…)", uri, rec.Ref))
			continue
		}
		if err := in.dispatch(ctx, snap, r, branch); err != nil {
			// Logged once (a branch the source lacks fails at every
			// reconcile); tried again at each.
			if in.once.first("dispatch\x00" + uri + "\x00" + err.Error()) {
				in.log.Warn("dispatch not handled; tried again at each reconcile", "dispatch", uri, "err", err)
			}
		}
	}
}

// dispatch resolves the dispatched branch's head, reads the workflow
// there and runs it (or writes its error check).
func (in *Intake) dispatch(ctx context.Context, snap *ingest.Snapshot, r forge.Record[forge.Dispatch], branch string) error {
	uri, rec := r.URI.String(), r.Value
	i := slices.IndexFunc(snap.Repos, func(repo forge.Record[forge.Repo]) bool { return repo.URI.String() == rec.Repo })
	if i < 0 {
		return nil // the lister lists only the repositories served
	}
	repo := snap.Repos[i]
	ev := work.Event{Kind: forge.KindDispatch, URI: r.URI, Repo: repo, Ref: rec.Ref, Trusted: true,
		Control: work.Control{Cause: uri, Workflows: map[string]int64{rec.Workflow: 1}}}
	m, err := in.p.Mirrors.Open(ctx, job.MirrorKey(ev))
	if err != nil {
		return err
	}
	if ev.Commit, err = m.Branch(ctx, repo.Value.Source, branch); err != nil {
		if errors.Is(err, mirror.ErrRefused) {
			in.refuseOnce(uri, fmt.Errorf("dispatch %s: %w", uri, err))
			return nil
		}
		return err
	}
	wfs, bad, err := m.Workflows(ctx, ev.Commit)
	if err != nil {
		return err
	}
	var wf *workflow.Workflow
	if j := slices.IndexFunc(wfs, func(w *workflow.Workflow) bool { return w.Name == rec.Workflow }); j >= 0 {
		wf = wfs[j]
	}
	plan := control.PlanDispatch(in.facts.Runner.String(), uri, rec, wf)
	switch plan.Verdict {
	case control.Act:
		ev.Vars = plan.Vars
		if in.once.first("dispatch\x00" + uri) { // a deferred one is read again at each reconcile
			in.log.Info("dispatch record: running", "dispatch", uri, "workflow", rec.Workflow, "commit", ev.Commit)
		}
		return in.considerControl(ctx, ev)
	case control.Fail:
		msg := plan.Err.Error()
		for _, e := range bad {
			if wf == nil && workflowName(e) == rec.Workflow {
				msg = "invalid workflow file:\n" + e.Error()
			}
		}
		in.controlError(ctx, ev, rec.Workflow, msg)
	case control.Refuse:
		in.refuseOnce(uri, plan.Err)
	}
	return nil
}

// considerControl considers a run-control event (Consider), noting it
// as work of this reconcile: no listed event stands for it, and a
// deferral of it is remembered (pruneAfter) so it is logged once.
func (in *Intake) considerControl(ctx context.Context, ev work.Event) error {
	in.noteControl(ev)
	return in.Consider(ctx, ev)
}

func (in *Intake) noteControl(ev work.Event) {
	in.mu.Lock()
	in.controlled[ev.Key()] = true
	in.mu.Unlock()
}

// controlError writes the error check of workflow wf of a run-control
// event, within its author's caps: an author whose budget is spent
// waits, as for its runs.
func (in *Intake) controlError(ctx context.Context, ev work.Event, wf, msg string) {
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

// resume takes up the run-control work an earlier process left queued
// or running (its check not final, not in hand): a re-run's attempt
// whose record is still listed, or a schedule's tick. (A push's or a
// pull's is found again by its listed event, a dispatch's by its
// listed record.)
func (in *Intake) resume(ctx context.Context, snap *ingest.Snapshot) {
	for key, c := range in.p.Checks.Unfinished() {
		if ctx.Err() != nil {
			return
		}
		if in.p.Scheduler.HasCheck(key) {
			continue
		}
		runs := map[string]int64{c.Workflow: c.AttemptNumber()}
		var ev work.Event
		var err error
		switch {
		case c.Cause != "" && syntax.ATURI(c.Cause).Collection().String() == forge.CollectionRerun:
			j := slices.IndexFunc(snap.Controls.Reruns, func(r forge.Record[forge.Rerun]) bool { return r.URI.String() == c.Cause })
			if j < 0 {
				continue
			}
			ev, err = in.controlEvent(snap, c.Subject, c.Cause, runs, control.Vars(snap.Controls.Reruns[j].Value.Env))
		case c.Cause == "" && c.Subject.Kind == forge.KindSchedule:
			ev, err = in.controlEvent(snap, c.Subject, "", runs, nil)
		default:
			continue
		}
		if err != nil {
			continue
		}
		if in.once.first("resume\x00" + key) {
			in.log.Info("run-control work of an earlier process queued again", "check", key, "workflow", c.Workflow)
		}
		if err := in.considerControl(ctx, ev); err != nil {
			in.log.Error("event not handled; tried again at the next reconcile", "check", key, "err", err)
			continue
		}
		if c.Subject.Kind == forge.KindSchedule && in.p.Scheduler.HasCheck(key) {
			in.noteQueuedTick(c.Subject.Repo, c.Workflow, queuedTick{key: key, tick: c.Subject.Tick})
		}
	}
}

// eventOf is the event of check c, as its subject and cause say: what
// its final check is owed under, when the PDS does not take it.
func eventOf(c forge.Check, snap *ingest.Snapshot) work.Event {
	s := c.Subject
	ev := work.Event{Kind: s.Kind, URI: syntax.ATURI(s.Event), Ref: s.Ref, Commit: s.Commit, Trusted: control.Trusted(s.Kind),
		Control: work.Control{Cause: c.Cause, Workflows: map[string]int64{c.Workflow: c.AttemptNumber()}, Tick: s.Tick}}
	ev.Repo.URI = syntax.ATURI(s.Repo)
	if i := slices.IndexFunc(snap.Repos, func(r forge.Record[forge.Repo]) bool { return r.URI == ev.Repo.URI }); i >= 0 {
		ev.Repo = snap.Repos[i]
	}
	return ev
}

// refuseOnce logs a run-control record that may not act (or cannot act
// here), once per record and reason: it is listed again at every
// reconcile. The memory of it is bounded (onceSet): a stranger's flood
// of records costs no more than DefaultRemembered of them.
func (in *Intake) refuseOnce(uri string, err error) {
	if !in.once.first("control\x00" + uri + "\x00" + err.Error()) {
		return
	}
	if in.refusals.Add(1) > maxRefusalsLogged {
		return // counted, said at the reconcile's end (sayRefusals)
	}
	in.log.Warn("run-control record refused; nothing written", "record", uri, "reason", err)
}

// maxRefusalsLogged is how many run-control records refused a reconcile
// logs one by one; the others are counted in one line (sayRefusals).
const maxRefusalsLogged = 100

// sayRefusals logs how many refused records the reconcile did not log
// one by one, and starts the count again.
func (in *Intake) sayRefusals() {
	if n := in.refusals.Swap(0) - maxRefusalsLogged; n > 0 {
		in.log.Warn("more run-control records refused; nothing written, not logged one by one", "more", n)
	}
}

// olderThan reports whether a record whose key is a TID was made before
// cutoff.
func olderThan(uri syntax.ATURI, cutoff time.Time) bool {
	tid, err := syntax.ParseTID(uri.RecordKey().String())
	return err == nil && tid.Time().Before(cutoff)
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
		if slices.ContainsFunc(jobs, func(j *job.Job) bool { return j.Workflow.Name == name }) ||
			slices.ContainsFunc(notRun, func(n notRunnable) bool { return n.name == name }) || invalid(name) {
			continue
		}
		out = append(out, notRunnable{name, fmt.Sprintf("workflow %s does not run at %s on this runner (no such workflow for it there)", name, ev.Commit)})
	}
	return out
}
