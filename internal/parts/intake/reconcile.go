package intake

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// Run reconciles at start, on every hint (Wake) and every Poll, until
// ctx ends.
func (in *Intake) Run(ctx context.Context) {
	tick := time.NewTicker(in.cfg.Poll)
	defer tick.Stop()
	for {
		if err := in.Reconcile(ctx); err != nil && ctx.Err() == nil {
			in.log.Error("reconcile", "err", err)
		}
		// A schedule's next tick wakes it too (run control's).
		due, stop := in.nextTick()
		select {
		case <-ctx.Done():
			stop()
			return
		case <-tick.C:
		case <-in.wake:
		case <-due:
		}
		stop()
	}
}

// nextTick is a channel that fires at run control's next schedule
// tick (nil: none), and the stop of its timer.
func (in *Intake) nextTick() (<-chan time.Time, func()) {
	next := in.p.Control.Next()
	if next.IsZero() {
		return nil, func() {}
	}
	t := time.NewTimer(time.Until(next))
	return t.C, func() { t.Stop() }
}

// Wake asks for a reconcile soon.
func (in *Intake) Wake() {
	select {
	case in.wake <- struct{}{}:
	default:
	}
}

// Reconcile lists the work and queues what has no final check, hands
// the listing to run control (its cancels first, the rest after the
// events) and to the lander, and forgets what is past the retention.
func (in *Intake) Reconcile(ctx context.Context) error {
	snap, err := in.p.Lister.Reconcile(ctx)
	if in.p.Observer != nil {
		n := 0
		if snap != nil {
			n = len(snap.Events)
		}
		in.p.Observer.Reconciled(n, err)
	}
	if err != nil {
		return err
	}
	in.noteRepos(snap)
	in.mu.Lock()
	in.hosts = snap.Hosts
	in.mu.Unlock()
	in.p.Control.Cancel(ctx, snap)
	// A burst of events to many repositories is considered side by side
	// (burst.go); the events of one repository one after another.
	eachLane(ctx, snap.Events, ConsiderAtOnce, in.p.Checks.Expect, func(ctx context.Context, ev work.Event) {
		if err := in.Consider(ctx, ev); err != nil && ctx.Err() == nil {
			in.log.Error("event not handled; tried again at the next reconcile", "event", ev.URI.String(), "commit", ev.Commit, "err", err)
		}
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	in.p.Control.Act(ctx, snap)
	if in.p.Lander != nil {
		in.p.Lander.Offer(snap)
	}
	in.warnWatchedImages(ctx, snap)
	in.pruneAfter(snap)
	in.p.Changed()
	return nil
}

// noteRepos records repositories seen for the first time; of their
// pushes, only the newest per ref is work, the older ones are history.
func (in *Intake) noteRepos(snap *ingest.Snapshot) {
	uris := make([]string, 0, len(snap.Repos))
	source := map[string]string{}
	for _, r := range snap.Repos {
		uris = append(uris, r.URI.String())
		source[r.URI.String()] = r.Value.Source
	}
	noted, err := in.p.State.NoteRepos(uris, func(uri string) []string {
		newest := map[string]string{}
		for _, ev := range snap.Events {
			if ev.Kind == forge.KindPush && ev.Repo.URI.String() == uri {
				newest[ev.Ref] = ev.Key() // events come oldest first
			}
		}
		var history []string
		for _, ev := range snap.Events {
			if ev.Kind == forge.KindPush && ev.Repo.URI.String() == uri && newest[ev.Ref] != ev.Key() {
				history = append(history, ev.Key())
			}
		}
		return history
	})
	for _, uri := range uris {
		if n, ok := noted[uri]; ok {
			in.log.Info("watching repository", "repo", uri, "source", source[uri], "older_pushes_skipped", n)
		}
	}
	if err != nil {
		in.log.Error("save state", "err", err)
	}
}

// RefusedCheck is the workflow name of the error check of an event the
// runner refuses before any workflow is known.
const RefusedCheck = "(refused)"

// Consider turns one event into queued jobs, or marks it done when all
// its checks are final. The lander hands it its pre-flights and
// batches, beside the reconcile.
func (in *Intake) Consider(ctx context.Context, ev work.Event) error {
	if in.p.State.Done(ev.Key()) || in.p.Scheduler.InHand(ev.Key()) || !in.fetchDue(ev) ||
		pastRetention(ev, time.Now().Add(-in.cfg.Retention)) {
		return nil
	}
	if in.p.Mine != nil && !in.p.Mine(ev.Key()) {
		return nil // another replica's: not done here, looked at again if it dies
	}
	log := in.log.With("event", ev.URI.String(), "commit", ev.Commit)
	if dec, first := in.capsSay(ev, need{}); dec.verdict == wait {
		// Before any fetch and any check write: a deferred event costs
		// neither git work nor PDS writes until its author's runs end
		// or its budget refills.
		in.deferEvent(log, ev, dec, first)
		return nil
	}
	repo, tree, base, conflict, err := in.prepare(ctx, ev)
	var wfs []*workflow.Workflow
	var bad []error
	if err == nil {
		in.fetched(ev)
		wfs, bad, err = repo.Workflows(ctx, tree)
	}
	if errors.Is(err, mirror.ErrRefused) {
		// The record names a source, ref or commit the runner does not
		// use, or workflows over a limit: an error check says why, and
		// the event (this record at this commit) is done.
		log.Warn("event refused", "reason", err)
		in.refused(ev, "source")
		in.p.Checks.Error(ctx, ev, RefusedCheck, err.Error())
		in.markDone(ev)
		return nil
	}
	var fe *fetchError
	if errors.As(err, &fe) {
		return in.fetchFailed(ctx, ev, fe.source, fe.err)
	}
	if err != nil {
		return err
	}
	in.warnUnacted(log, ev.Repo.URI.String(), wfs)
	in.warnImages(ctx, ev, wfs)
	p := in.plan(log, ev, repo, tree, wfs, bad, in.changes(ctx, log, ev, repo, base))
	if in.p.Mine != nil {
		// Another replica may have run some of it (it drove the event
		// before it died, or before the replicas changed): what its
		// checks say now is read, and what is final is not queued.
		if err := in.refresh(ctx, &p); err != nil {
			return err
		}
	}
	n := need{known: true, checks: len(p.jobs) + len(p.invalid) + len(p.notRun) + len(p.skipped), runs: len(p.todo), errors: len(p.invalid) + len(p.notRun)}
	if conflict != nil {
		n.runs, n.errors = 0, len(p.todo)+len(p.invalid)
	}
	// From the decision to the last job queued, alone among the author's
	// events: what the caps counted is still so when the jobs go in.
	if a := job.Author(ev, in.facts.LimitsAll); a != "" {
		defer in.admission.Lock(a)()
	}
	switch dec, first := in.capsSay(ev, n); dec.verdict {
	case refuse:
		// One error check for the event, not one per workflow.
		log.Warn("event refused", "reason", dec.why)
		in.refused(ev, dec.flag)
		in.p.Checks.Error(ctx, ev, RefusedCheck, dec.why)
		in.markDone(ev)
		return nil
	case wait:
		in.deferEvent(log, ev, dec, first)
		return nil
	}
	queued, err := in.act(ctx, ev, p, conflict)
	if err != nil {
		return err
	}
	log.Debug("event considered", "workflows", len(wfs), "queued", queued)
	return nil
}

// refresh reads the checks of p's jobs still to queue from the PDS and
// drops those another process of the runner ended.
func (in *Intake) refresh(ctx context.Context, p *plan) error {
	todo := p.todo[:0]
	for _, j := range p.todo {
		if in.p.Scheduler.Elsewhere(j.Key) {
			p.elsewhere++ // another live replica's run: left to it
			continue
		}
		if err := in.p.Checks.Refresh(ctx, j.Key); err != nil {
			return err
		}
		if in.p.Checks.Final(j.Key) {
			continue
		}
		if in.p.Checks.Going(j.Key) && in.p.Scheduler.TakeOver(ctx, j) {
			// Another process's run: taken over (in hand now), or left
			// to its live driver.
			p.elsewhere++
			continue
		}
		todo = append(todo, j)
	}
	p.todo = todo
	return nil
}

// plan is what an event's workflows come to: the jobs of the workflows
// that run for it on this runner, those of them still to queue (todo:
// none final, none in hand), the workflows a run-control event names
// that cannot run (notRun) and the workflow files that do not parse
// (invalid), each an error check instead.
type plan struct {
	jobs, todo []*job.Job
	notRun     []notRunnable
	invalid    []invalidFile
	// skipped are the workflows their path filters leave out, each a
	// skipped check saying why.
	skipped []notRunnable
	// elsewhere counts the jobs another live replica drives (or this
	// one took over): the event is not done here until their checks
	// say so.
	elsewhere int
}

// invalidFile is a workflow file that does not parse, by the name of
// its error check.
type invalidFile struct {
	name string
	err  error
}

// plan makes ev's plan from the workflows read at tree (wfs), the
// files that did not parse (bad) and the files the change touched, for
// the path filters (changed: known false when they cannot be said, and
// every workflow runs).
func (in *Intake) plan(log *slog.Logger, ev work.Event, repo job.Repo, tree string, wfs []*workflow.Workflow, bad []error, changed func() ([]string, bool)) plan {
	var p plan
	// Each leg of a matrix is a job of its own, named after its values.
	for _, wf := range workflow.Plan(wfs) {
		runs, ifErr := job.Runs(wf, ev)
		if (!runs && ifErr == nil) || !wf.AllowsRunner(in.facts.Runner.String()) {
			continue
		}
		if ifErr != nil {
			p.notRun = append(p.notRun, notRunnable{wf.Name, ifErr.Error()})
			continue
		}
		if t, ok := job.PathTrigger(ev); ok && wf.HasPathFilter(t) {
			if files, known := changed(); known {
				if admit, why := wf.PathsAdmit(t, files); !admit {
					p.skipped = append(p.skipped, notRunnable{wf.Name, why})
					continue
				}
			}
		}
		j := job.New(ev, wf, repo, tree)
		var err error
		if j.Vars, err = runVars(ev, wf); err != nil {
			p.notRun = append(p.notRun, notRunnable{wf.Name, err.Error()})
			continue
		}
		p.jobs = append(p.jobs, j)
		if in.p.Checks.Final(j.Key) {
			continue
		}
		if in.p.Scheduler.HasCheck(j.Key) {
			continue // a pre-flight and its pull share a check
		}
		p.todo = append(p.todo, j)
	}
	for _, e := range bad {
		// A workflow file that does not parse is an error check of its
		// own, named after the file, so the owner sees why nothing ran.
		name := workflow.FileName(e)
		if name == "" {
			log.Warn("workflow file unreadable", "err", e)
			continue
		}
		if _, named := ev.Workflows[name]; ev.Workflows != nil && !named {
			continue // not the run-control event's to report
		}
		p.invalid = append(p.invalid, invalidFile{name, e})
	}
	p.notRun = append(p.notRun, missingWorkflows(ev, p.jobs, p.notRun, func(name string) bool {
		return slices.ContainsFunc(p.invalid, func(f invalidFile) bool { return f.name == name })
	})...)
	return p
}

// act carries out an admitted plan: the error checks, then the jobs
// queued (none when the pull's merge conflicts: an error check each
// instead). It returns how many were queued; an event none of whose
// jobs was queued is done.
func (in *Intake) act(ctx context.Context, ev work.Event, p plan, conflict *mirror.ConflictError) (int, error) {
	for _, f := range p.invalid {
		in.p.Checks.Error(ctx, ev, f.name, "invalid workflow file:\n"+f.err.Error())
	}
	for _, f := range p.notRun {
		in.p.Checks.Error(ctx, ev, f.name, f.why)
	}
	for _, f := range p.skipped {
		in.p.Checks.Skipped(ctx, ev, f.name, f.why)
	}
	todo := p.todo
	if conflict != nil {
		for _, j := range todo {
			in.p.Checks.Error(ctx, ev, j.Workflow.Name, conflict.Error())
		}
		todo = nil
	}
	queued := 0
	for _, j := range todo {
		ok, err := in.p.Scheduler.Enqueue(ctx, j)
		if err != nil {
			return queued, err
		}
		if ok {
			queued++
		}
	}
	if queued == 0 && p.elsewhere == 0 {
		in.markDone(ev)
	}
	return queued, nil
}

// markDone marks the event done unless a job of it is in hand.
func (in *Intake) markDone(ev work.Event) {
	if in.p.Scheduler.InHand(ev.Key()) {
		return
	}
	if err := in.p.State.MarkDone(ev.Key()); err != nil {
		in.log.Error("save state", "err", err)
	}
}

func (in *Intake) refused(ev work.Event, reason string) {
	if in.p.Observer != nil {
		in.p.Observer.Refused(ev, reason)
	}
}

// Prepare fetches what the event needs into its mirror and returns the
// mirror, the tree to run (a push's commit, a pull's merge) and, for a
// pull that does not merge, the conflict. A fetch that fails for a
// reason other than a refusal is a *fetchError.
func (in *Intake) Prepare(ctx context.Context, ev work.Event) (job.Repo, string, *mirror.ConflictError, error) {
	repo, tree, _, conflict, err := in.prepare(ctx, ev)
	return repo, tree, conflict, err
}

// prepare is Prepare, and for a pull the head of its base branch it was
// merged onto (base).
func (in *Intake) prepare(ctx context.Context, ev work.Event) (repo job.Repo, tree, base string, _ *mirror.ConflictError, _ error) {
	repo, err := in.p.Mirrors.Open(ctx, job.MirrorKey(ev))
	if err != nil {
		return nil, "", "", nil, err
	}
	if ev.Kind == forge.KindBatch {
		// The lander squashed the batch into this mirror.
		return repo, ev.Commit, "", nil, nil
	}
	if ev.Kind != forge.KindPull {
		if err := repo.Fetch(ctx, job.OwnerSource, ev.Repo.Value.Source, ev.Ref, ev.Commit); err != nil {
			return nil, "", "", nil, fetchFailure(ev.Repo.Value.Source, err)
		}
		return repo, ev.Commit, "", nil, nil
	}
	if err := repo.Fetch(ctx, job.PullSource, ev.Pull.Head.Source, ev.Pull.Head.Ref, ev.Commit); err != nil {
		return nil, "", "", nil, fetchFailure(ev.Pull.Head.Source, err)
	}
	base, err = repo.Branch(ctx, ev.Repo.Value.Source, ev.Pull.Base)
	if err != nil {
		return nil, "", "", nil, err
	}
	merged, err := repo.Merge(ctx, base, ev.Commit)
	var ce *mirror.ConflictError
	switch {
	case errors.As(err, &ce):
		return repo, ev.Commit, base, ce, nil
	case err != nil:
		return nil, "", "", nil, err
	}
	return repo, merged, base, nil, nil
}

// changes returns what the event changed, for the path filters, asked
// of the mirror at the first call (job.ChangeRange: a push's
// before..after, a pull's merge base to its head). Where that cannot be
// said (a push that made its ref, a before the mirror lacks, a change
// of more paths than mirror.MaxChanged, a git error) known is false and
// every workflow runs: a filter never skips work on a guess.
func (in *Intake) changes(ctx context.Context, log *slog.Logger, ev work.Event, repo job.Repo, base string) func() ([]string, bool) {
	var files []string
	var known, asked bool
	return func() ([]string, bool) {
		if asked {
			return files, known
		}
		asked = true
		from, to, mergeBase, ok := job.ChangeRange(ev, base)
		if !ok || !repo.Has(ctx, from) {
			log.Info("the files the change touched are not known; the path filters let every workflow run", "from", from)
			return nil, false
		}
		var err error
		if files, err = repo.Changed(ctx, from, to, mergeBase); err != nil {
			log.Warn("the files the change touched are not known; the path filters let every workflow run", "err", err)
			return nil, false
		}
		known = true
		return files, true
	}
}

// fetchError is a fetch of the event's commit that failed for a reason
// other than a refusal: it is tried again, a bounded number of times
// (fetchFailed).
type fetchError struct {
	source string
	err    error
}

func (e *fetchError) Error() string { return "fetch from " + e.source + ": " + e.err.Error() }
func (e *fetchError) Unwrap() error { return e.err }

// fetchFailure wraps a failed fetch as a fetchError, leaving a refusal
// (mirror.ErrRefused) as it is: a refusal is final at once.
func fetchFailure(source string, err error) error {
	if errors.Is(err, mirror.ErrRefused) {
		return err
	}
	return &fetchError{source: source, err: err}
}

// warnUnacted logs, once per workflow and set of warnings, the fields a
// workflow sets that are not acted on yet, and a workflow that never
// runs.
func (in *Intake) warnUnacted(log *slog.Logger, repo string, wfs []*workflow.Workflow) {
	for _, wf := range wfs {
		if len(wf.Warnings) == 0 {
			continue
		}
		texts := make([]string, len(wf.Warnings))
		for i, w := range wf.Warnings {
			texts[i] = w.String()
		}
		key := repo + "\x00" + wf.File + "\x00" + strings.Join(texts, "\n")
		if !in.warned.First(key) {
			continue
		}
		for _, w := range wf.Warnings {
			log.Warn("workflow field not acted on", "repo", repo, "file", w.File, "line", w.Line, "field", w.Field, "warning", w.Msg)
		}
	}
}
