package scheduler

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
)

// Enqueue puts j in the queue and supersedes the older runs of its
// group. When a worker is free, it starts j at once and j's check gets
// no queued record (its running record is its first); else Enqueue
// writes the queued check first: work that really waits shows it. It
// queues nothing, and returns false, when a job of the same check key
// is in hand already (a pre-flight and its pull share a check).
func (s *Scheduler) Enqueue(ctx context.Context, j *job.Job) (bool, error) {
	s.mu.Lock()
	if s.q.has(j.Key) {
		s.mu.Unlock()
		return false, nil
	}
	var t *task
	if s.p.Drivers != nil {
		// A replica writes no queued record: until its run's Job is made
		// (the fence), another replica may drive the run, and a record
		// written here would break that driver's chain of
		// compare-and-swaps. The first record is the running one,
		// written once the Job is this replica's (execute's Fence).
		c, _ := s.p.Checks.Unqueued(j.Key, j.Event, j.Workflow.Name)
		t = &task{Job: j, check: c, unwritten: true, seen: seen{queued: time.Now()}}
	} else if s.q.free() > 0 && !s.q.legsFull(j) && !s.q.groupBusy(j) && !s.q.needsHeld(j) {
		if c, ok := s.p.Checks.Unqueued(j.Key, j.Event, j.Workflow.Name); ok {
			// Its running record comes in a moment: a burst's running
			// records go as one commit.
			t = &task{Job: j, check: c, unwritten: true, seen: seen{queued: time.Now()}, expected: s.p.Checks.ExpectWrite(j.Key)}
		}
	}
	behind := 0
	if t == nil {
		behind = s.q.ahead()
		waits := s.q.waitsFor(j)
		s.q.reserved[j.Key] = true
		s.mu.Unlock()
		c, err := s.p.Checks.Queued(ctx, j.Key, j.Event, j.Workflow.Name, behind, waits)
		s.mu.Lock()
		delete(s.q.reserved, j.Key)
		if err != nil {
			s.mu.Unlock()
			return false, err
		}
		t = &task{Job: j, check: c, seen: seen{queued: time.Now()}}
	}
	cancelQueued, cancelRunning := s.q.add(t)
	for _, o := range cancelRunning {
		s.log.Info("superseded: cancelling the older run", "check", o.Key, "by", j.Event.URI.String())
		o.cancel()
	}
	s.mu.Unlock()
	for _, o := range cancelQueued {
		s.p.Checks.Superseded(ctx, o.end(j.Event.URI.String(), s.log))
		s.markDoneIfIdle(o.Event)
	}
	if s.p.Observer != nil {
		s.p.Observer.Queued(j)
	}
	s.log.Info("queued", "check", j.Key, "workflow", j.Workflow.Name, "event", j.Event.URI.String(), "commit", j.Event.Commit,
		"at_once", t.unwritten, "waiting_ahead", behind)
	return true, nil
}

// Start starts the workers and the adopted runs, and returns at once
// with the wait for them: they go on until the daemon stops claiming
// work (Drain) and every run has ended or been handed over. The
// adopted runs are running (in hand) when it returns. ctx is the
// daemon's; runCtx ends only when a stopping daemon gives up waiting
// for the runs.
func (s *Scheduler) Start(ctx, runCtx context.Context) (wait func()) {
	workers := &sync.WaitGroup{}
	s.mu.Lock()
	s.runCtx, s.workers = runCtx, workers
	adopted := s.adopted
	s.adopted = nil
	for _, t := range adopted {
		s.launch(t)
	}
	s.mu.Unlock()
	if len(adopted) > 0 {
		s.log.Info(fmt.Sprintf("adopted %d runs", len(adopted)), "runs", len(adopted))
	}
	// Start returns once every worker waits for a task (or took one): a
	// job queued after it finds them free.
	var ready sync.WaitGroup
	ready.Add(s.cfg.Concurrency)
	for range s.cfg.Concurrency {
		workers.Go(func() { s.worker(ctx, runCtx, ready.Done) })
	}
	ready.Wait()
	return workers.Wait
}

// launch starts an adopted run beside the workers (it takes none of
// their slots: its session is there already). s.mu is held.
func (s *Scheduler) launch(t *task) {
	var jctx context.Context
	jctx, t.cancel = context.WithCancel(s.runCtx)
	s.q.start(t)
	s.workers.Go(func() {
		s.runJob(jctx, t)
		s.jobEnded(t)
	})
}

// next waits for a task and gives it a context under runCtx; nil means
// the daemon is stopping.
func (s *Scheduler) next(ctx, runCtx context.Context, ready func()) (*task, context.Context) {
	waited := false
	defer ready()
	for {
		s.mu.Lock()
		if waited {
			s.q.idle--
			waited = false
		}
		if s.q.draining || ctx.Err() != nil {
			s.mu.Unlock()
			return nil, nil
		}
		if t := s.q.claim(); t != nil {
			jctx, cancel := context.WithCancel(runCtx)
			// The run's id from its claim on (a sweep keeps its session),
			// made from its check key, never from this process: a second
			// create of its session fails (the fence).
			t.cancel, t.runID = cancel, run.IDFor(s.facts.Runner.String(), t.Key)
			s.mu.Unlock()
			return t, jctx
		}
		wait := s.q.wait()
		s.q.idle++
		waited = true
		s.mu.Unlock()
		ready()
		select {
		case <-ctx.Done():
		case <-wait:
		}
	}
}

// worker runs tasks until the daemon stops claiming work. ready is
// called once it first waits for a task or took one.
func (s *Scheduler) worker(ctx, runCtx context.Context, ready func()) {
	ready = sync.OnceFunc(ready)
	for {
		t, jctx := s.next(ctx, runCtx, ready)
		if t == nil {
			return
		}
		// Claimed: one fewer waiting, one more going. Said now, as a
		// replica's run says nothing more until its pod is Ready.
		s.p.Changed()
		s.runJob(jctx, t)
		s.jobEnded(t)
	}
}

// jobEnded takes a task that ran (or was handed over) out of the
// running set.
func (s *Scheduler) jobEnded(t *task) {
	t.cancel()
	t.expectedDone()
	s.mu.Lock()
	s.q.end(t)
	notHere := t.fenced || t.givenBack
	s.mu.Unlock()
	if !notHere {
		// A fenced run's work is another process's, a released one's
		// the successor's: the event is done when its check says so,
		// not here (a released run may have no record at all: with
		// replicas, or before its first write).
		s.markDoneIfIdle(t.Event)
	}
	s.p.Changed()
	if !t.Event.Trusted || job.Author(t.Event, s.facts.LimitsAll) != "" {
		// A slot of its author's cap is free: a deferred event may go
		// (and the lander may go on with its pre-flight or batch).
		s.p.Wake()
	}
}

// runJob runs one task (or goes on with an adopted one) and writes its
// running and final checks. A run detached by a stopping daemon gets no
// final check: it is recorded for the successor.
func (s *Scheduler) runJob(ctx context.Context, t *task) {
	log := s.log.With("check", t.Key, "workflow", t.Workflow.Name, "event", t.Event.URI.String())
	if s.p.Drivers != nil {
		defer func() { s.p.Drivers.Forget(t.runID) }()
		// Once the check says how the run ended (or the run is
		// another's, or handed over), its session may go.
		defer s.releaseSession(t)
	}
	if s.needsSkip(ctx, t) {
		return
	}
	s.openLive(t)
	dir := s.runDir(t.runID)
	if t.adopt == nil {
		// What an earlier process left of the same run (it died before
		// any step started: the run goes again) is not this run's.
		_ = os.RemoveAll(dir)
	}
	res, dir := s.tries(ctx, t, dir, log)
	if res.Fenced && s.takeOver(ctx, t, log) {
		// Its driver is gone: this replica drives it now.
		res, dir = s.tries(ctx, t, dir, log)
	}
	if res.Fenced {
		s.mu.Lock()
		t.fenced = true
		s.mu.Unlock()
		if s.p.Drivers != nil {
			s.drivenElsewhere(t.Key)
		}
		// Another process drives the run: nothing of it is written
		// from here. The check is that driver's; if none writes it, it
		// is not final, and the next reconciliation queues the work.
		log.Warn("run fenced: its session exists already; not run twice", "run", t.runID, "err", res.Error)
		if err := s.p.State.EndRun(t.Key); err != nil {
			log.Error("save state", "err", err)
		}
		_ = os.RemoveAll(dir)
		return
	}
	// Detached before its session started (a pod still Pending): nothing
	// goes on, so nothing is handed over; the work is released, its
	// check back to queued, for the successor.
	unstarted := res.Status == run.Detached && res.Handover == nil
	if unstarted {
		log.Info("run released: its session had not started", "run", t.runID)
	}
	if res.Status == run.Detached && !unstarted {
		if err := s.detachRun(t, res); err != nil {
			log.Error("record the handover; the successor runs the work again", "run", t.runID, "err", err)
		} else {
			log.Info("run handed over", "run", t.runID, "step", res.Handover.Step+1, "offset", res.Handover.Offset)
		}
		return
	}
	defer os.RemoveAll(dir)
	if s.p.Observer != nil {
		s.p.Observer.Ended(t.Job, res)
	}

	s.mu.Lock()
	cancelled := res.Status == run.Cancelled
	released := unstarted || (t.released && cancelled)
	t.givenBack = released
	superseded, why, cancelledAt := t.superseded, t.cancelled, t.cancelledAt
	s.mu.Unlock()
	// The run leaves state.json once its check says how it ended (a
	// crash before that runs the work again; after it, the check is
	// final and the run's record is forgotten at the next start).
	defer func() {
		if err := s.p.State.EndRun(t.Key); err != nil {
			log.Error("save state", "err", err)
		}
	}()

	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	outDir := filepath.Join(dir, "outputs")
	if !released {
		s.endLive(t, res, outDir)
	}
	end := t.end("", log)
	end.Result, end.OutDir = res, outDir
	var final forge.Check
	switch {
	case released:
		// Not final: the successor runs the work; nothing is owed. A
		// replica writes nothing: the run's Job is gone, and the next
		// driver's records follow whatever stands.
		if s.p.Drivers == nil {
			s.p.Checks.Released(wctx, end)
		}
		return
	case superseded != "" && cancelled:
		end.By = superseded
		final = s.p.Checks.Superseded(wctx, end)
	case why != "" && cancelled:
		// The cancel's figure: from the record read to the run stopped.
		log.Info("run stopped by a cancel record", "run", t.runID, "by", why, "stopped_in", time.Since(cancelledAt))
		end.By = why
		final = s.p.Checks.Cancelled(wctx, end)
	default:
		final = s.p.Checks.Finished(wctx, end)
	}
	log.Info("run finished", "run", t.runID, "status", final.Status, "failed_step", res.FailedStep)
	s.keepArtifacts(t, res, outDir)
	s.legEnded(wctx, t, final.Status)
}

// start writes the running check and records the run in state.json.
func (s *Scheduler) start(ctx context.Context, t *task, log *slog.Logger) error {
	started := time.Now().UTC()
	s.mu.Lock()
	t.seen.started = started
	s.mu.Unlock()
	if t.try <= 1 {
		// A retry's check is running already (retry.go).
		t.check = s.p.Checks.Running(ctx, t.Key, t.check, started, log)
	}
	t.expectedDone()
	saved, err := job.Encode(t.Job, t.check)
	if err != nil {
		return err
	}
	return s.p.State.StartRun(t.Key, state.Run{CheckKey: t.Key, RunID: t.runID, Workflow: t.Workflow.Name, Event: t.Event.URI.String(),
		Commit: t.Event.Commit, StartedAt: started, Job: saved})
}

// handoverLog is the log so far of a detached run, in its run directory.
const handoverLog = "handover.log"

// detachRun records a detached run for the successor: where it stopped
// in state.json, its log beside its run directory.
func (s *Scheduler) detachRun(t *task, res *run.Result) error {
	s.mu.Lock()
	s.detached++
	s.mu.Unlock()
	r, ok := s.p.State.Run(t.Key)
	if !ok || r.Job == nil {
		return fmt.Errorf("run %s is not in state.json", t.runID)
	}
	// The log first: a handover in state.json needs it (rebuild).
	if err := writePrivate(filepath.Join(s.runDir(t.runID), handoverLog), res.Log); err != nil {
		return err
	}
	return s.p.State.DetachRun(t.Key, res.Handover)
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

// execute runs the workflow on the engine, or goes on with an adopted
// run. A run's session is begun first (on Kubernetes its Job is created
// as soon as its spec is known: the workflow, the run's trust), and
// what needs the checkout or the secrets waits for them; meanwhile, as
// the session starts, the running check is written, the run recorded
// in state.json, the tree exported and the secrets gathered.
func (s *Scheduler) execute(ctx context.Context, t *task, dir string, log *slog.Logger) *run.Result {
	fail := func(err error) *run.Result {
		if t.adopt != nil {
			s.abandon(ctx, t)
		}
		now := time.Now().UTC()
		if t.adopt == nil && s.stopping() {
			// Failed before its session started while the daemon stops
			// (a signal to the whole unit ends git too): released, for
			// the successor to try, not a final error.
			s.log.Info("a run failed before its session started while stopping; released", "check", t.Key, "err", err)
			return &run.Result{RunID: t.runID, Workflow: t.Workflow.Name, Status: run.Detached, StartedAt: now, FinishedAt: now}
		}
		status := run.Error
		if ctx.Err() != nil {
			// Cancelled while it got ready (superseded, a cancel
			// record): the run was cancelled, as the engine says of a
			// run cancelled later.
			status = run.Cancelled
		}
		line := "knotless-run: " + string(status) + ": " + err.Error() + "\n"
		if t.live != nil {
			_, _ = io.WriteString(t.live, line) // the stream is the log
		}
		return &run.Result{RunID: t.runID, Workflow: t.Workflow.Name, Status: status, Error: err.Error(), StartedAt: now, FinishedAt: now,
			Log: append(t.prior, line...)}
	}
	checkout := filepath.Join(dir, "checkout")
	req := run.Request{
		RunID:    t.runID,
		Workflow: t.Workflow,
		Checkout: checkout,
		Outputs:  filepath.Join(dir, "outputs"),
		Vars:     t.Vars,
		Trusted:  t.Event.Trusted,
		Event:    t.Event.CondEvent(),
		Annotations: map[string]string{
			"knotless.dev/check": t.Key,
			"knotless.dev/event": t.Event.URI.String(),
		},
		Detach: s.detach,
		// A push's record key is a TID: the later push orders higher.
		Cache: run.CacheScope{Repo: t.Event.Repo.URI.String(), Order: t.Event.Order()},
	}
	if t.live != nil {
		req.Live = t.live
	}
	req.Progress = func(p run.Progress) { s.setProgress(t, p) }
	req.Checkpoint = func(h run.Handover, log []byte) error { return s.writeCheckpoint(ctx, t.runID, h, log) }
	replica := s.p.Drivers != nil
	if replica {
		// The session outlives the final check: a check that says
		// running always has its Job, for a survivor to claim.
		s.releaseSession(t)
		hold := make(chan struct{})
		s.mu.Lock()
		t.hold = hold
		s.mu.Unlock()
		req.HoldSession = hold
		// The running record and the run's record in state.json wait
		// for the Job: only the run's driver writes its check.
		req.Fence = func(ctx context.Context) error {
			if err := s.endedElsewhere(ctx, t); err != nil {
				return err
			}
			if err := s.start(ctx, t, log); err != nil {
				log.Error("record the run", "err", err)
			}
			s.p.Changed()
			log.Info("run started", "run", t.runID)
			s.started(t)
			return nil
		}
	}
	if t.adopt != nil {
		s.started(t)
		if s.p.Observer != nil {
			// From the dead driver's last sign of life when a replica
			// took the run over, else from this process's start.
			from := s.born
			if !t.driverSeen.IsZero() {
				from = t.driverSeen
			}
			s.p.Observer.TakenOver(time.Since(from))
		}
		secrets, err := s.runSecrets(ctx, t)
		if err != nil {
			return fail(err)
		}
		req.Secrets = secrets
		return s.p.Engine.Adopt(ctx, req, *t.adopt, t.prior)
	}
	down := s.p.Down()
	var st *run.Start
	if down == nil {
		st = s.p.Engine.Begin(ctx, req)
	}
	// Beside the session's start: the running check and the run's
	// record (on disk before the run can be handed over).
	recorded := make(chan struct{})
	if replica {
		close(recorded)
	} else {
		go func() {
			defer close(recorded)
			if err := s.start(ctx, t, log); err != nil {
				log.Error("record the run", "err", err)
			}
			s.p.Changed()
			log.Info("run started", "run", t.runID)
			s.started(t)
		}()
	}
	defer func() { <-recorded }()
	prepare := func() (map[string]string, error) {
		if down != nil {
			return nil, down
		}
		if err := t.Repo.Export(ctx, t.Tree, checkout); err != nil {
			return nil, err
		}
		if err := s.placeArtifacts(t, checkout); err != nil {
			return nil, err
		}
		return s.runSecrets(ctx, t)
	}
	secrets, err := prepare()
	if err != nil {
		if st != nil {
			st.Discard(ctx)
		}
		<-recorded
		return fail(err)
	}
	<-recorded
	return st.Run(ctx, checkout, secrets)
}

// releaseSession lets the session of t's last try go (HoldSession).
func (s *Scheduler) releaseSession(t *task) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.hold != nil {
		close(t.hold)
		t.hold = nil
	}
}

// endedElsewhere is a replica's last look before a run it started goes
// into its new session: another replica may have ended the run and
// removed its session (the fence's object) after this one read the
// check and before it made the session. Read now, a final check says
// so, and the run is fenced.
func (s *Scheduler) endedElsewhere(ctx context.Context, t *task) error {
	if err := s.p.Checks.Refresh(ctx, t.Key); err != nil {
		return fmt.Errorf("read the run's check before its first step: %w", err)
	}
	if s.p.Checks.Final(t.Key) {
		return fmt.Errorf("%w: its check is final, written by another process of the runner", executor.ErrRunExists)
	}
	return nil
}

// started tells the observer a run started (or an adopted one goes on).
func (s *Scheduler) started(t *task) {
	if s.p.Observer != nil && t.try <= 1 { // a retry was picked up already
		s.p.Observer.Started(t.Job, t.runID, t.seen.queued)
	}
}

// runSecrets are the secrets a run may be granted: none for an
// untrusted one.
func (s *Scheduler) runSecrets(ctx context.Context, t *task) (map[string]string, error) {
	if !t.Event.Trusted {
		return map[string]string{}, nil
	}
	return s.secrets(ctx, t.Job)
}

// abandon stops the session of an adopted run that cannot go on here,
// so that its Job does not outlive the run's final check.
func (s *Scheduler) abandon(ctx context.Context, t *task) {
	resumer := s.facts.Executor.Resumer
	if resumer == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	sess, err := resumer.Resume(ctx, t.adopt.Session)
	if err == nil {
		err = sess.Stop(ctx)
	}
	if err != nil {
		s.log.Error("stop the session of a run that cannot go on; the next start sweeps it", "session", t.adopt.Session.String(), "err", err)
	}
}

// markDoneIfIdle marks the event done when nothing of it is in hand and
// every check of it is final; the next reconcile otherwise picks it up
// again.
func (s *Scheduler) markDoneIfIdle(ev work.Event) {
	if s.InHand(ev.Key()) || s.p.Checks.Pending(ev) {
		return
	}
	if err := s.p.State.MarkDone(ev.Key()); err != nil {
		s.log.Error("save state", "err", err)
	}
}
