package runctl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/rules/control"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// Run control (docs/design/protocol.md, "Run control"): the owner, or a
// pull's author, acts on runs by writing cancel, rerun and dispatch
// records in their own repo; a reconcile lists them beside the pushes
// and pulls (ingest.Snapshot.Controls) and run control decides each
// with the pure rules of internal/rules/control. A cancel goes to the
// scheduler; a re-run or a dispatch becomes an event that intake
// considers like a push or a pull (Intake.ConsiderControl: the same
// caps, counted against the record's author, and the same error
// checks), its workflows named, each at its attempt.
// Verdicts: Refuse is logged (once a record), Fail is an error check,
// NotMine and Done say nothing.

// cancels acts on the cancel records listed. It runs before the events
// are considered, so that a check an earlier process left queued, and
// now cancelled, is not queued again.
func (p *Part) cancels(ctx context.Context, snap *ingest.Snapshot) {
	for _, r := range snap.Controls.Cancels {
		uri := r.URI.String()
		var check *forge.Check
		if c, known := p.p.Checks.Get(r.Value.Check); known {
			check = &c
		}
		v, err := control.DecideCancel(p.runner, uri, r.Value, check)
		switch v {
		case control.Refuse:
			p.refuseOnce(uri, err)
		case control.Act:
			// A run stops, and writes its final check, some time after
			// its cancel: acted on once in this process.
			acted := "cancelled\x00" + uri + "\x00" + r.Value.Check
			if p.once.Seen(acted) {
				continue
			}
			log := p.log.With("check", r.Value.Check, "cancel", uri)
			if !p.p.Scheduler.CancelCheck(ctx, r.Value.Check, uri, eventOf(*check, snap), *check) {
				log.Debug("cancel: not acted on here now (the work is being queued, or another replica drives the run); looked at again at the next reconcile")
				continue
			}
			p.once.First(acted)
			log.Info("cancel record: work cancelled", "workflow", check.Workflow, "was", check.Status)
		}
	}
}

// reruns acts on the rerun records listed: each selected workflow of
// the named check's event runs again as a new attempt, through
// intake.
func (p *Part) reruns(ctx context.Context, snap *ingest.Snapshot) {
	cutoff := time.Now().Add(-p.cfg.Retention)
	for _, r := range snap.Controls.Reruns {
		if ctx.Err() != nil {
			return
		}
		if olderThan(r.URI, cutoff) {
			continue // its checks may be forgotten: never work again
		}
		uri := r.URI.String()
		named, known := p.p.Checks.Get(r.Value.Check)
		if !known {
			continue
		}
		plan := control.PlanRerun(p.runner, uri, r.Value, &named, p.p.Checks.Work(named.Subject))
		switch plan.Verdict {
		case control.Refuse:
			p.refuseOnce(uri, plan.Err)
			continue
		case control.Act:
		default:
			continue
		}
		runs := map[string]int64{}
		for _, a := range plan.Runs {
			runs[a.Workflow] = a.Attempt
		}
		ev, err := p.controlEvent(snap, named.Subject, uri, runs, plan.Vars)
		if err != nil {
			p.refuseOnce(uri, err)
			continue
		}
		if p.once.First("rerun\x00" + uri) { // a deferred one is planned again at each reconcile
			p.log.Info("rerun record: running again", "rerun", uri, "check", r.Value.Check, "workflows", len(runs), "trusted", ev.Trusted)
		}
		if err := p.p.Intake.ConsiderControl(ctx, ev); err != nil {
			p.log.Error("re-run not handled; tried again at the next reconcile", "rerun", uri, "err", err)
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
func (p *Part) controlEvent(snap *ingest.Snapshot, s forge.Subject, cause string, runs map[string]int64, vars []workflow.EnvVar) (work.Event, error) {
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
func (p *Part) dispatches(ctx context.Context, snap *ingest.Snapshot) {
	cutoff := time.Now().Add(-p.cfg.Retention)
	for _, r := range snap.Controls.Dispatches {
		if ctx.Err() != nil {
			return
		}
		uri, rec := r.URI.String(), r.Value
		key := forge.CheckKey(control.DispatchSubject(uri, rec, ""), rec.Workflow)
		if olderThan(r.URI, cutoff) || p.p.Checks.Final(key) || p.p.Scheduler.HasCheck(key) || p.legsServed(uri) {
			continue // served, or past the retention
		}
		// Who may, before any git work.
		switch plan := control.PlanDispatch(p.runner, uri, rec, nil); plan.Verdict {
		case control.NotMine:
			continue
		case control.Refuse:
			p.refuseOnce(uri, plan.Err)
			continue
		}
		branch := control.Branch(rec.Ref)
		if branch == "" {
			// No commit to write a check on: said in the log.
			p.refuseOnce(uri, fmt.Errorf("dispatch %s: ref %q is not a branch (refs/heads/…)", uri, rec.Ref))
			continue
		}
		if err := p.dispatch(ctx, snap, r, branch); err != nil {
			// Logged once (a source that does not answer fails at
			// every reconcile); tried again at each.
			if p.once.First("dispatch\x00" + uri + "\x00" + err.Error()) {
				p.log.Warn("dispatch not handled; tried again at each reconcile", "dispatch", uri, "err", err)
			}
		}
	}
}

// noteLegs remembers the check keys of the legs of wf, a matrix
// workflow the dispatch record uri runs (its subject's key takes no
// commit), so that a served one is known without reading git again.
func (p *Part) noteLegs(uri string, rec forge.Dispatch, wf *workflow.Workflow) {
	if wf.Matrix == nil {
		return
	}
	s := control.DispatchSubject(uri, rec, "")
	var keys []string
	for _, leg := range wf.Legs() {
		keys = append(keys, forge.CheckKey(s, leg.Name))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.legKeys) >= maxLegKeys {
		clear(p.legKeys)
	}
	p.legKeys[uri] = keys
}

// legsServed reports whether the dispatch record uri ran a matrix whose
// every leg's check is final or in hand.
func (p *Part) legsServed(uri string) bool {
	p.mu.Lock()
	keys := p.legKeys[uri]
	p.mu.Unlock()
	if len(keys) == 0 {
		return false
	}
	for _, k := range keys {
		if !p.p.Checks.Final(k) && !p.p.Scheduler.HasCheck(k) {
			return false
		}
	}
	return true
}

// noCommit is the subject commit of a dispatch's error check when its
// branch does not exist: all zeroes, as a refUpdate's deleted ref.
const noCommit = "0000000000000000000000000000000000000000"

// dispatch resolves the dispatched branch's head, reads the workflow
// there and runs it (or writes its error check, also for a branch the
// source does not have).
func (p *Part) dispatch(ctx context.Context, snap *ingest.Snapshot, r forge.Record[forge.Dispatch], branch string) error {
	uri, rec := r.URI.String(), r.Value
	i := slices.IndexFunc(snap.Repos, func(repo forge.Record[forge.Repo]) bool { return repo.URI.String() == rec.Repo })
	if i < 0 {
		return nil // the lister lists only the repositories served
	}
	repo := snap.Repos[i]
	ev := work.Event{Kind: forge.KindDispatch, URI: r.URI, Repo: repo, Ref: rec.Ref, Trusted: true,
		Control: work.Control{Cause: uri, Workflows: map[string]int64{rec.Workflow: 1}}}
	m, err := p.p.Mirrors.Open(ctx, job.MirrorKey(ev))
	if err != nil {
		return err
	}
	if ev.Commit, err = m.Branch(ctx, repo.Value.Source, branch); err != nil {
		switch {
		case errors.Is(err, mirror.ErrRefused):
			p.refuseOnce(uri, fmt.Errorf("dispatch %s: %w", uri, err))
			return nil
		case errors.Is(err, mirror.ErrNoBranch):
			// The owner's answer is a check: an error on the all-zeroes
			// commit (as a deleted ref's), which serves the record.
			ev.Commit = noCommit
			p.p.Intake.ControlError(ctx, ev, rec.Workflow, fmt.Sprintf("branch %q does not exist at %s", branch, repo.Value.Source))
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
	plan := control.PlanDispatch(p.runner, uri, rec, wf)
	switch plan.Verdict {
	case control.Act:
		ev.Vars = plan.Vars
		p.noteLegs(uri, rec, wf)
		if p.once.First("dispatch\x00" + uri) { // a deferred one is read again at each reconcile
			p.log.Info("dispatch record: running", "dispatch", uri, "workflow", rec.Workflow, "commit", ev.Commit)
		}
		return p.p.Intake.ConsiderControl(ctx, ev)
	case control.Fail:
		msg := plan.Err.Error()
		for _, e := range bad {
			if wf == nil && workflow.FileName(e) == rec.Workflow {
				msg = "invalid workflow file:\n" + e.Error()
			}
		}
		p.p.Intake.ControlError(ctx, ev, rec.Workflow, msg)
	case control.Refuse:
		p.refuseOnce(uri, plan.Err)
	}
	return nil
}

// resume takes up the run-control work an earlier process left queued
// or running (its check not final, not in hand): a re-run's attempt
// whose record is still listed, or a schedule's tick. (A push's or a
// pull's is found again by its listed event, a dispatch's by its
// listed record.)
func (p *Part) resume(ctx context.Context, snap *ingest.Snapshot) {
	for key, c := range p.p.Checks.Unfinished() {
		if ctx.Err() != nil {
			return
		}
		if p.p.Scheduler.HasCheck(key) {
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
			ev, err = p.controlEvent(snap, c.Subject, c.Cause, runs, control.Vars(snap.Controls.Reruns[j].Value.Env))
		case c.Cause == "" && c.Subject.Kind == forge.KindSchedule:
			ev, err = p.controlEvent(snap, c.Subject, "", runs, nil)
		default:
			continue
		}
		if err != nil {
			continue
		}
		if p.once.First("resume\x00" + key) {
			p.log.Info("run-control work of an earlier process queued again", "check", key, "workflow", c.Workflow)
		}
		if err := p.p.Intake.ConsiderControl(ctx, ev); err != nil {
			p.log.Error("event not handled; tried again at the next reconcile", "check", key, "err", err)
			continue
		}
		if c.Subject.Kind == forge.KindSchedule && p.p.Scheduler.HasCheck(key) {
			p.noteQueuedTick(c.Subject.Repo, c.Workflow, queuedTick{key: key, tick: c.Subject.Tick})
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
func (p *Part) refuseOnce(uri string, err error) {
	if !p.once.First("control\x00" + uri + "\x00" + err.Error()) {
		return
	}
	if p.refusals.Add(1) > maxRefusalsLogged {
		return // counted, said at the reconcile's end (sayRefusals)
	}
	p.log.Warn("run-control record refused; nothing written", "record", uri, "reason", err)
}

// maxRefusalsLogged is how many run-control records refused a reconcile
// logs one by one; the others are counted in one line (sayRefusals).
const maxRefusalsLogged = 100

// sayRefusals logs how many refused records the reconcile did not log
// one by one, and starts the count again.
func (p *Part) sayRefusals() {
	if n := p.refusals.Swap(0) - maxRefusalsLogged; n > 0 {
		p.log.Warn("more run-control records refused; nothing written, not logged one by one", "more", n)
	}
}

// olderThan reports whether a record whose key is a TID was made before
// cutoff.
func olderThan(uri syntax.ATURI, cutoff time.Time) bool {
	tid, err := syntax.ParseTID(uri.RecordKey().String())
	return err == nil && tid.Time().Before(cutoff)
}
