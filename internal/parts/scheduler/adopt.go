package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/workflow"
)

// goneProbeTimeout bounds the probe of one handed-over session;
// foreignStopTimeout the stop of one this executor cannot adopt.
const (
	goneProbeTimeout   = 30 * time.Second
	foreignStopTimeout = 3 * time.Minute
)

// Adopt takes up, before READY=1, the runs an earlier process left
// going; Start starts them.
//   - Handed over at a stop: those on another executor are stopped
//     first, or end error (stopForeign); those this executor can go on
//     with whose sessions are still there (toAdopt) are adopted, and
//     their handovers taken out of state.json at once (a handover is
//     good once: the run's checkpoints take over from it).
//   - Left by a process that died (kill -9, OOM): takeUp adopts each
//     where its checkpoint says it stood, ends it error when a step
//     may have started and it cannot go on, or leaves it to run again
//     when no step had started.
//
// Sweep forgets the runs not adopted whose checks are not final, and
// the reconciliation runs them again under the same check key. It
// returns how many runs it adopts.
func (s *Scheduler) Adopt(ctx context.Context) int {
	s.stopForeign(ctx)
	var tasks []*task
	for _, o := range s.takeUp(ctx) {
		h := o.h
		t, err := s.rebuild(ctx, o.key, o.r, &h, o.log)
		if err != nil {
			log := s.log.With("check", o.key, "run", o.r.RunID)
			log.Warn("a run of a process that died cannot be taken up; its check ends error", "err", err)
			s.endOrphan(ctx, o.key, o.r, o.log, fmt.Sprintf("the runner process running it died and it cannot be taken up (%v): not run again, so that no step runs twice", err), log)
			s.inherited("ended")
			continue
		}
		s.inherited("checkpoint")
		t.seen.started = o.r.StartedAt
		tasks = append(tasks, t)
	}
	if s.detach != nil {
		tasks = append(tasks, s.handedOver(ctx)...)
	}
	s.mu.Lock()
	s.adopted = tasks
	s.mu.Unlock()
	return len(tasks)
}

// handedOver rebuilds the runs handed over at a stop that this process
// adopts, and takes their handovers out of state.json.
func (s *Scheduler) handedOver(ctx context.Context) []*task {
	var tasks []*task
	var keys []string
	for _, key := range s.toAdopt(ctx) {
		r, _ := s.p.State.Run(key)
		if s.p.Drivers != nil {
			// A replica: while it was down, another may have claimed
			// the run it handed over (its Lease was given back at the
			// stop). One claim wins; a run another won is its.
			_, claimed, _, err := s.p.Drivers.Claim(ctx, r.RunID)
			if err != nil || !claimed {
				s.log.Info("a run this replica handed over is driven by another replica now, or cannot be claimed; left to it", "check", key, "run", r.RunID, "err", err)
				s.inherited("elsewhere")
				continue
			}
		}
		prior, err := os.ReadFile(filepath.Join(s.runDir(r.RunID), handoverLog))
		var t *task
		if err == nil {
			t, err = s.rebuild(ctx, key, r, r.Handover, prior)
		} else {
			err = fmt.Errorf("read the run's log so far: %w", err)
		}
		if err != nil {
			s.log.Warn("cannot adopt a handed-over run; its work runs again", "check", key, "run", r.RunID, "err", err)
			s.inherited("again")
			continue
		}
		s.inherited("handover")
		t.seen.started = r.StartedAt
		tasks = append(tasks, t)
		keys = append(keys, key)
	}
	// If this process dies while it goes on with them, the next one
	// takes them up from their checkpoints (takeUp), never from a
	// handover the run has passed. A stop hands them over afresh
	// (detachRun).
	if err := s.p.State.ClaimHandovers(keys); err != nil {
		s.log.Error("record the adopted runs as taken; a crash before they end would adopt them again from their old handover", "err", err)
	}
	return tasks
}

// toAdopt returns the check keys of the runs an earlier process handed
// over whose sessions are still there. A run whose session is gone (its
// Job deleted, ended or its pod lost while no process watched) is not
// adopted: adopting it could only end in an error check. When the
// executor cannot tell, or the probe fails, the run is adopted.
func (s *Scheduler) toAdopt(ctx context.Context) []string {
	g := s.facts.Executor.Gone
	var keys []string
	for key, r := range s.p.State.Runs() {
		if r.Handover == nil || s.foreign(r.Handover) {
			continue
		}
		if g != nil {
			pctx, cancel := context.WithTimeout(ctx, goneProbeTimeout)
			gone, err := g.Gone(pctx, r.Handover.Session)
			cancel()
			switch {
			case err != nil:
				s.log.Warn("cannot tell whether a handed-over session is still there; adopting it", "check", key, "run", r.RunID, "session", r.Handover.Session.String(), "err", err)
			case gone:
				s.log.Info("the session of a handed-over run is gone; its work runs again", "check", key, "run", r.RunID, "session", r.Handover.Session.String())
				s.inherited("again")
				continue
			}
		}
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys
}

// foreign reports whether a handover is one this executor cannot
// adopt: its session is another executor's, or this one resumes none.
func (s *Scheduler) foreign(h *run.Handover) bool {
	return h.Session.Executor != s.facts.ExecutorName || s.facts.Executor.Resumer == nil
}

// stopForeign deals with the runs an earlier process handed over on
// another executor (a runner moved from Kubernetes to Docker): this
// process cannot adopt them, and their sessions go on without it. So
// that their work never runs twice at once, each session is stopped
// (Ports.StopForeign) and only then is the run left to the sweep,
// which forgets it, so that the reconciliation runs its work again
// here under the same check key. A session this process cannot stop
// ends its run's check error, naming the executor change, and the work
// is not run here while it may still go on there.
func (s *Scheduler) stopForeign(ctx context.Context) {
	for key, r := range s.p.State.Runs() {
		h := r.Handover
		if h == nil || !s.foreign(h) {
			continue
		}
		log := s.log.With("check", key, "run", r.RunID, "session", h.Session.String(), "from", h.Session.Executor, "executor", s.facts.ExecutorName)
		err := errors.New("no way to reach it from this runner")
		if s.p.StopForeign != nil {
			sctx, cancel := context.WithTimeout(ctx, foreignStopTimeout)
			err = s.p.StopForeign(sctx, h.Session)
			cancel()
		}
		if err == nil {
			log.Info("stopped the session of a run handed over on another executor; its work runs again on this one")
			continue
		}
		why := fmt.Sprintf("handed over by a runner on executor %s; this runner's executor %s cannot adopt it and could not stop its session %s (%v): "+
			"not run again here, so that it never runs twice at once", h.Session.Executor, s.facts.ExecutorName, h.Session, err)
		log.Warn("a run handed over on another executor cannot be stopped; its check ends error", "err", err)
		prior, _ := os.ReadFile(filepath.Join(s.runDir(r.RunID), handoverLog))
		s.endOrphan(ctx, key, r, prior, why, log)
	}
}

// endOrphan writes the final error check of a run an earlier process
// left that this one cannot go on with (handed over on another
// executor and not stopped, or died running it), with the log the
// earlier process kept (prior). The session, if any, is the sweep's.
func (s *Scheduler) endOrphan(ctx context.Context, key string, r state.Run, prior []byte, why string, log *slog.Logger) {
	now := time.Now().UTC()
	res := &run.Result{RunID: r.RunID, Workflow: r.Workflow, Executor: s.facts.ExecutorName, Status: run.Error, Error: why,
		StartedAt: r.StartedAt, FinishedAt: now, Log: append(prior, "knotless-run: error: "+why+"\n"...)}
	s.endOrphanWith(ctx, key, r, res, log)
}

// endOrphanWith writes res as the final check of a run an earlier
// process left, and removes its run directory.
func (s *Scheduler) endOrphanWith(ctx context.Context, key string, r state.Run, res *run.Result, log *slog.Logger) {
	saved, err := job.Decode(r.Job)
	if err != nil {
		log.Error("a run an earlier process left has no job to end; its work runs again", "err", err)
		return
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	s.p.Checks.Finished(wctx, checks.End{Key: key, Event: saved.Event, Check: saved.Check, Result: res, Log: log})
	_ = os.RemoveAll(s.runDir(r.RunID))
}

// rebuild makes the task of a run to adopt from what state.json keeps,
// where it stands (h) and its log so far (prior).
func (s *Scheduler) rebuild(ctx context.Context, key string, r state.Run, h *run.Handover, prior []byte) (*task, error) {
	saved, err := job.Decode(r.Job)
	if err != nil {
		return nil, err
	}
	repo, err := s.p.Mirrors.Open(ctx, job.MirrorKey(saved.Event))
	if err != nil {
		return nil, err
	}
	wfs, _, err := repo.Workflows(ctx, saved.Tree)
	if err != nil {
		return nil, err
	}
	// As planned (workflow.Plan): a needed run's artifacts are kept
	// for the runs that need it, also when it ends here.
	var wf *workflow.Workflow
	for _, p := range workflow.Plan(wfs) {
		if p.Name == r.Workflow {
			wf = p
			break
		}
	}
	if wf == nil {
		return nil, fmt.Errorf("workflow %s not found at %s", r.Workflow, saved.Tree)
	}
	j := &job.Job{Key: key, Event: saved.Event, Workflow: wf, Repo: repo, Tree: saved.Tree, Vars: saved.Vars}
	return &task{Job: j, runID: r.RunID, check: saved.Check, adopt: h, prior: prior}, nil
}

// Sweep removes the sessions no run owns any more: all but those of the
// runs Adopt took up. The other runs an earlier process left are
// forgotten here; their checks are not final, so reconciliation runs
// them again.
func (s *Scheduler) Sweep(ctx context.Context) error {
	s.mu.Lock()
	keep := make([]string, 0, len(s.adopted))
	keys := make([]string, 0, len(s.adopted))
	for _, t := range s.adopted {
		keep = append(keep, t.runID)
		keys = append(keys, t.Key)
	}
	s.mu.Unlock()
	if err := s.sweep(ctx, keep); err != nil {
		return err
	}
	left, err := s.p.State.KeepRuns(keys)
	if left > 0 {
		s.log.Info("runs of an earlier process will run again", "runs", left)
	}
	return err
}

// Resweep sweeps again: the start-up sweep tried again (the executor
// was degraded), the periodic sweep, and the one after a clean-up
// failed (Sweeps). It keeps the sessions of every run this process
// holds (those it runs, from their claim on, and the adopted ones) and
// of every run state.json records (handed over, or adopted), and
// leaves state.json alone. Nothing is claimed while it lists, so no run
// starts a session it could take for an orphan.
func (s *Scheduler) Resweep(ctx context.Context) error {
	s.mu.Lock()
	s.q.paused++
	keep := make([]string, 0, len(s.q.running)+len(s.adopted))
	for _, t := range s.q.running {
		keep = append(keep, t.runID)
	}
	for _, t := range s.adopted {
		keep = append(keep, t.runID)
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.q.paused--
		s.q.signal()
		s.mu.Unlock()
	}()
	return s.sweep(ctx, append(keep, s.p.State.RunIDs()...))
}

// Sweep timing: the periodic sweep, how often clean-up failures are
// looked for, and the bound on one sweep (claims wait for it).
const (
	SweepEvery   = 10 * time.Minute
	failureCheck = 10 * time.Second
	sweepTimeout = 30 * time.Second
)

// Sweeps sweeps again every SweepEvery, and soon after a session's
// clean-up failed (failures, the engine's run.Cleaner.Failures, grew),
// until ctx ends: what a clean-up after a run's verdict left is removed
// without waiting for the next start. A sweep that fails is logged and
// tried at the next turn; none is tried while the executor is down
// (its health loop sweeps then).
func (s *Scheduler) Sweeps(ctx context.Context, failures func() int64) {
	tick := time.NewTicker(failureCheck)
	defer tick.Stop()
	next, seen := time.Now().Add(SweepEvery), failures()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		failed := failures()
		if (failed == seen && time.Now().Before(next)) || s.p.Down() != nil {
			continue
		}
		seen = failed
		sctx, cancel := context.WithTimeout(ctx, sweepTimeout)
		err := s.Resweep(sctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.Warn("sweep after the runs' clean-ups failed; tried again in a minute", "cleanup_failures", failed, "err", err)
			next = time.Now().Add(time.Minute)
			continue
		}
		next = time.Now().Add(SweepEvery)
	}
}

func (s *Scheduler) sweep(ctx context.Context, keep []string) error {
	removed, err := s.p.Sweeper.Sweep(ctx, keep)
	if err != nil {
		return fmt.Errorf("sweep orphaned sessions: %w", err)
	}
	for _, r := range removed {
		s.log.Info("swept orphaned session", "session", r.String())
	}
	return nil
}
