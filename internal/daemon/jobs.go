package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"knotless.dev/run/internal/checks"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/run"
	"knotless.dev/run/internal/state"
	"knotless.dev/run/internal/workflow"
)

// job is one workflow to run for one event.
type job struct {
	key    string // the check's record key
	ev     ingest.Event
	wf     *workflow.Workflow
	repo   gitRepo
	tree   string // what to export: the pushed commit or the merge's tree
	runID  string
	check  forge.Check
	cancel context.CancelFunc
	// superseded names the newer event that cancelled this run.
	superseded string
	// released is set when a stopping daemon cancelled the run: its check
	// goes back to queued for the successor.
	released bool
	// adopt is where an earlier process handed the run over, and prior
	// that process's log; nil for a run this process starts.
	adopt *run.Handover
	prior []byte
}

// savedJob is what state.json keeps of a started run's job, so that a
// successor can adopt the run without listing.
type savedJob struct {
	Event ingest.Event `json:"event"`
	Tree  string       `json:"tree"`
	Check forge.Check  `json:"check"`
}

// group is what supersedes: the same workflow on the same ref (a push)
// or the same pull.
func (j *job) group() string {
	if j.ev.Kind == forge.KindPull || j.ev.Kind == forge.KindBatch {
		return "pull " + j.ev.URI.String() + " " + j.wf.Name
	}
	return "push " + j.ev.Repo.URI.String() + " " + j.ev.Ref + " " + j.wf.Name
}

// reconcile lists the work and queues what has no final check.
func (d *Daemon) reconcile(ctx context.Context) error {
	snap, err := d.lister.Reconcile(ctx)
	if err != nil {
		return err
	}
	d.noteRepos(snap)
	d.mu.Lock()
	d.hosts = snap.Hosts
	d.mu.Unlock()
	for _, ev := range snap.Events {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := d.consider(ctx, ev); err != nil {
			d.log.Error("event not handled; tried again at the next reconcile", "event", ev.URI.String(), "commit", ev.Commit, "err", err)
		}
	}
	if d.cfg.Queue {
		d.land(ctx, snap)
	}
	d.pruneAfter(snap)
	d.status()
	return nil
}

// noteRepos records repositories seen for the first time; of their
// pushes, only the newest per ref is work, the older ones are history.
func (d *Daemon) noteRepos(snap *ingest.Snapshot) {
	d.mu.Lock()
	if d.st.Repos == nil {
		d.st.Repos = map[string]time.Time{}
	}
	if d.st.Done == nil {
		d.st.Done = map[string]time.Time{}
	}
	now := time.Now().UTC()
	changed := false
	for _, r := range snap.Repos {
		uri := r.URI.String()
		if _, ok := d.st.Repos[uri]; ok {
			continue
		}
		d.st.Repos[uri] = now
		changed = true
		newest := map[string]string{}
		for _, ev := range snap.Events {
			if ev.Kind == forge.KindPush && ev.Repo.URI == r.URI {
				newest[ev.Ref] = ev.Key() // events come oldest first
			}
		}
		history := 0
		for _, ev := range snap.Events {
			if ev.Kind == forge.KindPush && ev.Repo.URI == r.URI && newest[ev.Ref] != ev.Key() {
				d.st.Done[ev.Key()] = now
				history++
			}
		}
		d.log.Info("watching repository", "repo", uri, "source", r.Value.Source, "older_pushes_skipped", history)
	}
	if !changed {
		d.mu.Unlock()
		return
	}
	saved := d.sf.snapshot(d.st)
	d.mu.Unlock()
	if err := d.sf.write(saved); err != nil {
		d.log.Error("save state", "err", err)
	}
}

// consider turns one event into queued jobs, or marks it done when all
// its checks are final.
func (d *Daemon) consider(ctx context.Context, ev ingest.Event) error {
	d.mu.Lock()
	_, done := d.st.Done[ev.Key()]
	inHand := d.q.inHand(ev.Key())
	d.mu.Unlock()
	if done || inHand || !d.fetchDue(ev) || pastRetention(ev, time.Now().Add(-d.cfg.Retention)) {
		return nil
	}
	log := d.log.With("event", ev.URI.String(), "commit", ev.Commit)
	if dec, first := d.capsSay(ev, need{}); dec.verdict == wait {
		// Before any fetch and any check write: a deferred event costs
		// neither git work nor PDS writes until its author's runs end
		// or its budget refills.
		d.deferred(log, ev, dec, first)
		return nil
	}
	repo, tree, conflict, err := d.prepare(ctx, ev)
	var wfs []*workflow.Workflow
	var bad []error
	if err == nil {
		d.fetched(ev)
		wfs, bad, err = repo.Workflows(ctx, tree)
	}
	if errors.Is(err, mirror.ErrRefused) {
		// The record names a source, ref or commit the runner does not
		// use, or workflows over a limit: an error check says why, and
		// the event (this record at this commit) is done.
		log.Warn("event refused", "reason", err)
		d.finalError(ctx, ev, refusedCheck, err.Error())
		d.markDone(ev)
		return nil
	}
	var fe *fetchError
	if errors.As(err, &fe) {
		return d.fetchFailed(ctx, ev, fe.source, fe.err)
	}
	if err != nil {
		return err
	}
	d.warnUnacted(log, ev.Repo.URI.String(), wfs)
	var jobs, todo []*job
	for _, wf := range wfs {
		if !runsFor(wf, ev) || !wf.AllowsRunner(d.cfg.Runner.String()) {
			continue
		}
		j := &job{key: forge.CheckKey(ev.Subject(), wf.Name), ev: ev, wf: wf, repo: repo, tree: tree}
		jobs = append(jobs, j)
		if c, known := d.rec.Get(j.key); known && c.Final() {
			continue
		}
		if d.checkInHand(j.key) {
			continue // a pre-flight and its pull share a check
		}
		todo = append(todo, j)
	}
	type invalidFile struct {
		name string
		err  error
	}
	var invalid []invalidFile
	for _, e := range bad {
		// A workflow file that does not parse is an error check of its
		// own, named after the file, so the owner sees why nothing ran.
		name := workflowName(e)
		if name == "" {
			log.Warn("workflow file unreadable", "err", e)
			continue
		}
		invalid = append(invalid, invalidFile{name, e})
	}
	n := need{known: true, checks: len(jobs) + len(invalid), runs: len(todo), errors: len(invalid)}
	if conflict != nil {
		n.runs, n.errors = 0, len(todo)+len(invalid)
	}
	switch dec, first := d.capsSay(ev, n); dec.verdict {
	case refuse:
		// One error check for the event, not one per workflow.
		log.Warn("event refused", "reason", dec.why)
		d.finalError(ctx, ev, refusedCheck, dec.why)
		d.markDone(ev)
		return nil
	case wait:
		d.deferred(log, ev, dec, first)
		return nil
	}
	for _, f := range invalid {
		d.finalError(ctx, ev, f.name, "invalid workflow file:\n"+f.err.Error())
	}
	if conflict != nil {
		for _, j := range todo {
			d.finalError(ctx, ev, j.wf.Name, conflict.Error())
		}
		todo = nil
	}
	queued := 0
	for _, j := range todo {
		if err := d.enqueue(ctx, j); err != nil {
			return err
		}
		queued++
	}
	if queued == 0 {
		d.markDone(ev)
	}
	log.Debug("event considered", "workflows", len(wfs), "queued", queued)
	return nil
}

// refusedCheck is the workflow name of the error check of an event the
// runner refuses before any workflow is known.
const refusedCheck = "(refused)"

// mirrorKey names the mirror an event's objects go into: a push's is
// its repository's; a pull has one of its own, so that nothing it
// fetched is in a mirror a push (or another pull) runs from.
func mirrorKey(ev ingest.Event) string {
	if ev.Kind == forge.KindBatch {
		return batchMirrorKey(ev.Repo.URI.String())
	}
	if ev.Kind == forge.KindPull {
		return "pull " + ev.URI.String()
	}
	return ev.Repo.URI.String()
}

// prepare fetches what the event needs into its mirror and returns the
// mirror, the tree to run (a push's commit, a pull's merge) and, for a
// pull that does not merge, the conflict.
func (d *Daemon) prepare(ctx context.Context, ev ingest.Event) (gitRepo, string, *mirror.ConflictError, error) {
	repo, err := d.mirrors.Open(ctx, mirrorKey(ev))
	if err != nil {
		return nil, "", nil, err
	}
	if ev.Kind == forge.KindBatch {
		// The lander squashed the batch into this mirror (lander.go).
		return repo, ev.Commit, nil, nil
	}
	if ev.Kind != forge.KindPull {
		if err := repo.Fetch(ctx, mirror.Owner, ev.Repo.Value.Source, ev.Ref, ev.Commit); err != nil {
			return nil, "", nil, fetchFailure(ev.Repo.Value.Source, err)
		}
		return repo, ev.Commit, nil, nil
	}
	if err := repo.Fetch(ctx, mirror.Pull, ev.Pull.Head.Source, ev.Pull.Head.Ref, ev.Commit); err != nil {
		return nil, "", nil, fetchFailure(ev.Pull.Head.Source, err)
	}
	base, err := repo.Branch(ctx, ev.Repo.Value.Source, ev.Pull.Base)
	if err != nil {
		return nil, "", nil, err
	}
	merged, err := repo.Merge(ctx, base, ev.Commit)
	var ce *mirror.ConflictError
	switch {
	case errors.As(err, &ce):
		return repo, ev.Commit, ce, nil
	case err != nil:
		return nil, "", nil, err
	}
	return repo, merged, nil, nil
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

func workflowName(err error) string {
	var wes workflow.Errors
	if errors.As(err, &wes) && len(wes) > 0 {
		base := filepath.Base(wes[0].File)
		return strings.TrimSuffix(strings.TrimSuffix(base, ".yaml"), ".yml")
	}
	return ""
}

func (d *Daemon) markDone(ev ingest.Event) {
	d.mu.Lock()
	if d.q.inHand(ev.Key()) {
		d.mu.Unlock()
		return
	}
	d.st.Done[ev.Key()] = time.Now().UTC()
	snap := d.sf.snapshot(d.st)
	d.mu.Unlock()
	if err := d.sf.write(snap); err != nil {
		d.log.Error("save state", "err", err)
	}
}

// enqueue writes the queued check, supersedes older runs of the same
// group and puts the job in the queue.
func (d *Daemon) enqueue(ctx context.Context, j *job) error {
	now := forge.Now()
	j.check = forge.Check{Type: forge.CollectionCheck, Subject: j.ev.Subject(), Workflow: j.wf.Name, Status: forge.StatusQueued, CreatedAt: now}
	prev, known := d.rec.Get(j.key)
	if known {
		j.check.CreatedAt = prev.CreatedAt
	}
	if !known || prev.Status != forge.StatusQueued {
		if err := d.rec.Write(ctx, checks.Queue, j.key, j.check); err != nil {
			return err
		}
	}
	d.mu.Lock()
	cancelQueued, cancelRunning := d.q.add(j)
	for _, o := range cancelRunning {
		d.log.Info("superseded: cancelling the older run", "check", o.key, "by", j.ev.URI.String())
		o.cancel()
	}
	d.mu.Unlock()
	for _, o := range cancelQueued {
		c := o.check
		c.Status, c.Error, c.FinishedAt = string(run.Cancelled), "superseded by "+j.ev.URI.String(), forge.Now()
		d.putFinal(ctx, checks.Supersede, o.key, o.ev, c, d.log)
		d.markDoneIfIdle(o.ev)
	}
	d.log.Info("queued", "check", j.key, "workflow", j.wf.Name, "event", j.ev.URI.String(), "commit", j.ev.Commit)
	return nil
}

// older reports whether a's event came before b's (record keys of both
// kinds are TIDs, which sort by time).
func older(a, b *job) bool {
	if a.ev.URI == b.ev.URI {
		return a.ev.Commit != b.ev.Commit && a.ev.Pull != nil && b.ev.Pull != nil
	}
	return a.ev.URI.RecordKey().String() < b.ev.URI.RecordKey().String()
}

// next waits for a job and gives it a context under runCtx; nil means
// the daemon is stopping.
func (d *Daemon) next(ctx, runCtx context.Context) (*job, context.Context) {
	for {
		d.mu.Lock()
		if d.q.draining || ctx.Err() != nil {
			d.mu.Unlock()
			return nil, nil
		}
		if j := d.q.claim(); j != nil {
			jctx := claimCtx(runCtx, j)
			d.mu.Unlock()
			return j, jctx
		}
		wait := d.q.wait()
		d.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-wait:
		}
	}
}

// worker runs jobs until the daemon stops claiming work. ctx is the
// daemon's; runCtx ends only when a stopping daemon gives up waiting.
func (d *Daemon) worker(ctx, runCtx context.Context) {
	for {
		j, jctx := d.next(ctx, runCtx)
		if j == nil {
			return
		}
		d.runJob(jctx, j)
		d.jobEnded(j)
	}
}

// jobEnded takes a job that ran (or was handed over) out of the running
// set.
func (d *Daemon) jobEnded(j *job) {
	j.cancel()
	d.mu.Lock()
	d.q.end(j)
	d.mu.Unlock()
	d.markDoneIfIdle(j.ev)
	d.status()
	if !j.ev.Trusted || author(j.ev, d.cfg.Max.All) != "" {
		// A slot of its author's cap is free: a deferred event may go
		// (and the lander may go on with its pre-flight or batch).
		d.Wake()
	}
}

func (d *Daemon) markDoneIfIdle(ev ingest.Event) {
	d.mu.Lock()
	if d.q.inHand(ev.Key()) {
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	// Done only when every check of the event is final; the next
	// reconcile otherwise picks it up again.
	if d.rec.Pending(ev.URI.String(), ev.Commit) {
		return
	}
	d.mu.Lock()
	d.st.Done[ev.Key()] = time.Now().UTC()
	snap := d.sf.snapshot(d.st)
	d.mu.Unlock()
	if err := d.sf.write(snap); err != nil {
		d.log.Error("save state", "err", err)
	}
}

// runJob runs one job (or goes on with an adopted one) and writes its
// running and final checks. A run detached by a stopping daemon gets no
// final check: it is recorded for the successor.
func (d *Daemon) runJob(ctx context.Context, j *job) {
	log := d.log.With("check", j.key, "workflow", j.wf.Name, "event", j.ev.URI.String())
	if j.adopt == nil {
		j.runID = run.NewID()
		if err := d.startJob(ctx, j, log); err != nil {
			log.Error("record the run", "err", err)
		}
		d.status()
		log.Info("run started", "run", j.runID)
	}

	dir := d.runDir(j.runID)
	res := d.execute(ctx, j, dir)
	if res.Status == run.Detached && res.Handover == nil {
		// Detached before its session started (a pod still Pending):
		// nothing goes on, so nothing is handed over; the work is
		// released, its check back to queued, for the successor.
		d.mu.Lock()
		j.released = true
		d.mu.Unlock()
		res.Status = run.Cancelled
		log.Info("run released: its session had not started", "run", j.runID)
	}
	if res.Status == run.Detached {
		if err := d.detachJob(j, res); err != nil {
			log.Error("record the handover; the successor runs the work again", "run", j.runID, "err", err)
		} else {
			log.Info("run handed over", "run", j.runID, "step", res.Handover.Step+1, "offset", res.Handover.Offset)
		}
		return
	}
	defer os.RemoveAll(dir)

	d.mu.Lock()
	delete(d.st.Runs, j.key)
	released := j.released && res.Status == run.Cancelled
	superseded := j.superseded
	snap := d.sf.snapshot(d.st)
	d.mu.Unlock()
	if err := d.sf.write(snap); err != nil {
		log.Error("save state", "err", err)
	}

	final := d.finalCheck(context.WithoutCancel(ctx), j, res, log)
	switch {
	case released:
		final.Status, final.Error = forge.StatusQueued, "released by a stopping runner: runs again on its successor"
		final.FinishedAt = ""
	case superseded != "" && res.Status == run.Cancelled:
		final.Error = "superseded by " + superseded
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if released {
		// Not final: the successor runs the work; nothing is owed.
		if err := d.rec.Write(wctx, checks.Release, j.key, final); err != nil {
			log.Error("write released check", "err", err)
		}
		return
	}
	by := checks.Finish
	if superseded != "" && res.Status == run.Cancelled {
		by = checks.Supersede
	}
	d.putFinal(wctx, by, j.key, j.ev, final, log)
	log.Info("run finished", "run", j.runID, "status", final.Status, "failed_step", res.FailedStep)
}

// startJob writes the running check and records the run in state.json.
func (d *Daemon) startJob(ctx context.Context, j *job, log *slog.Logger) error {
	started := time.Now().UTC()
	j.check.Status, j.check.StartedAt = forge.StatusRunning, forge.Datetime(started)
	if err := d.rec.Write(ctx, checks.Start, j.key, j.check); err != nil {
		log.Error("write running check", "err", err)
	}
	saved, err := json.Marshal(savedJob{Event: j.ev, Tree: j.tree, Check: j.check})
	if err != nil {
		return fmt.Errorf("encode job %s: %w", j.key, err)
	}
	d.mu.Lock()
	if d.st.Runs == nil {
		d.st.Runs = map[string]state.Run{}
	}
	d.st.Runs[j.key] = state.Run{CheckKey: j.key, RunID: j.runID, Workflow: j.wf.Name, Event: j.ev.URI.String(), Commit: j.ev.Commit, StartedAt: started, Job: saved}
	snap := d.sf.snapshot(d.st)
	d.mu.Unlock()
	return d.sf.write(snap)
}

// detachJob records a detached run for the successor: where it stopped
// in state.json, its log beside its run directory.
func (d *Daemon) detachJob(j *job, res *run.Result) error {
	d.mu.Lock()
	d.detached++
	r, ok := d.st.Runs[j.key]
	d.mu.Unlock()
	if !ok || r.Job == nil {
		return fmt.Errorf("run %s is not in state.json", j.runID)
	}
	// The log first: a handover in state.json needs it (rebuild).
	if err := writePrivate(filepath.Join(d.runDir(j.runID), handoverLog), res.Log); err != nil {
		return err
	}
	d.mu.Lock()
	r.Handover = res.Handover
	d.st.Runs[j.key] = r
	snap := d.sf.snapshot(d.st)
	d.mu.Unlock()
	return d.sf.write(snap)
}

// handoverLog is the log so far of a detached run, in its run directory.
const handoverLog = "handover.log"

func (d *Daemon) runDir(runID string) string {
	return filepath.Join(d.cfg.CacheDir, "runs", runID)
}

func writePrivate(name string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(name, data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// execute exports the tree and runs the workflow on the engine, or
// goes on with an adopted run.
func (d *Daemon) execute(ctx context.Context, j *job, dir string) *run.Result {
	fail := func(err error) *run.Result {
		if j.adopt != nil {
			d.abandon(ctx, j)
		}
		now := time.Now().UTC()
		if j.adopt == nil && d.stopping() {
			// Failed before its session started while the daemon stops
			// (a signal to the whole unit ends git too): released, for
			// the successor to try, not a final error.
			d.log.Info("a run failed before its session started while stopping; released", "check", j.key, "err", err)
			return &run.Result{RunID: j.runID, Workflow: j.wf.Name, Status: run.Detached, StartedAt: now, FinishedAt: now}
		}
		return &run.Result{RunID: j.runID, Workflow: j.wf.Name, Status: run.Error, Error: err.Error(), StartedAt: now, FinishedAt: now,
			Log: append(j.prior, "knotless-run: error: "+err.Error()+"\n"...)}
	}
	if err := d.executorDown(); err != nil {
		return fail(err)
	}
	checkout := filepath.Join(dir, "checkout")
	if j.adopt == nil {
		if err := j.repo.Export(ctx, j.tree, checkout); err != nil {
			return fail(err)
		}
	}
	secrets := map[string]string{}
	if j.ev.Trusted {
		var err error
		if secrets, err = d.secrets(ctx, j); err != nil {
			return fail(err)
		}
	}
	req := run.Request{
		RunID:    j.runID,
		Workflow: j.wf,
		Checkout: checkout,
		Outputs:  filepath.Join(dir, "outputs"),
		Secrets:  secrets,
		Trusted:  j.ev.Trusted,
		Annotations: map[string]string{
			"knotless.dev/check": j.key,
			"knotless.dev/event": j.ev.URI.String(),
		},
		Detach: d.detach,
		// A push's record key is a TID: the later push orders higher.
		Cache: run.CacheScope{Repo: j.ev.Repo.URI.String(), Order: j.ev.URI.RecordKey().String()},
	}
	if j.adopt != nil {
		return d.engine.Adopt(ctx, req, *j.adopt, j.prior)
	}
	return d.engine.Run(ctx, req)
}

// abandon stops the session of an adopted run that cannot go on here,
// so that its Job does not outlive the run's final check.
func (d *Daemon) abandon(ctx context.Context, j *job) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	resumer, ok := d.cfg.Executor.(executor.Resumer)
	if !ok {
		return
	}
	sess, err := resumer.Resume(ctx, j.adopt.Session)
	if err == nil {
		err = sess.Stop(ctx)
	}
	if err != nil {
		d.log.Error("stop the session of a run that cannot go on; the next start sweeps it", "session", j.adopt.Session.String(), "err", err)
	}
}

// finalError writes a final error check for a workflow that cannot run.
func (d *Daemon) finalError(ctx context.Context, ev ingest.Event, wfName, msg string) {
	key := forge.CheckKey(ev.Subject(), wfName)
	if c, known := d.rec.Get(key); known && c.Final() {
		return
	}
	now := forge.Now()
	check := forge.Check{Type: forge.CollectionCheck, Subject: ev.Subject(), Workflow: wfName, Status: string(run.Error),
		Error: checks.Truncate(msg, checks.MaxError), CreatedAt: now, FinishedAt: now}
	d.putFinal(ctx, checks.Finish, key, ev, check, d.log)
}

// warnUnacted logs, once per workflow and set of warnings, the fields a
// workflow sets that are not acted on yet, and a workflow that never
// runs.
func (d *Daemon) warnUnacted(log *slog.Logger, repo string, wfs []*workflow.Workflow) {
	for _, wf := range wfs {
		if len(wf.Warnings) == 0 {
			continue
		}
		texts := make([]string, len(wf.Warnings))
		for i, w := range wf.Warnings {
			texts[i] = w.String()
		}
		key := repo + "\x00" + wf.File + "\x00" + strings.Join(texts, "\n")
		if _, seen := d.warned.LoadOrStore(key, true); seen {
			continue
		}
		for _, w := range wf.Warnings {
			log.Warn("workflow field not acted on", "repo", repo, "file", w.File, "line", w.Line, "field", w.Field, "warning", w.Msg)
		}
	}
}
