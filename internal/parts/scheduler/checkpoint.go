package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/atomicfile"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/job"
)

// checkpointFile is, in a run's directory, where the run stood at its
// newest step boundary (run.Request.Checkpoint): one line of JSON, the
// Handover a successor adopts after this process died, then the log so
// far. It is this file's one writer; Adopt reads it at the next start.
const checkpointFile = "checkpoint"

// writeCheckpoint replaces the run's checkpoint, atomically: a reader
// finds the old one or the new one. With replicas it is kept beside the
// run's session too (Drivers), for a survivor.
func (s *Scheduler) writeCheckpoint(ctx context.Context, runID string, h run.Handover, log []byte) error {
	b, err := encodeCheckpoint(h, log)
	if err != nil {
		return err
	}
	dir := s.runDir(runID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, checkpointFile), b, 0o600); err != nil {
		return err
	}
	if s.p.Drivers != nil {
		// Beside the run's session, whatever becomes of the run's own
		// context: a checkpoint is what a survivor goes on from.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return s.p.Drivers.Save(sctx, runID, b)
	}
	return nil
}

func encodeCheckpoint(h run.Handover, log []byte) ([]byte, error) {
	head, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	b := make([]byte, 0, len(head)+1+len(log))
	return append(append(append(b, head...), '\n'), log...), nil
}

// readCheckpoint reads a run's checkpoint; ok is false when it has none
// (the process that ran it died before its first step could start).
func (s *Scheduler) readCheckpoint(runID string) (h run.Handover, log []byte, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(s.runDir(runID), checkpointFile))
	if errors.Is(err, fs.ErrNotExist) {
		return h, nil, false, nil
	}
	if err != nil {
		return h, nil, false, fmt.Errorf("read checkpoint: %w", err)
	}
	h, log, err = decodeCheckpoint(b)
	return h, log, err == nil, err
}

func decodeCheckpoint(b []byte) (h run.Handover, log []byte, err error) {
	head, log, found := bytes.Cut(b, []byte("\n"))
	if !found {
		return h, nil, errors.New("checkpoint has no log line")
	}
	dec := json.NewDecoder(bytes.NewReader(head))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return h, nil, fmt.Errorf("checkpoint is corrupt: %w", err)
	}
	if !h.Replay || int64(len(log)) > h.LogSize {
		return h, nil, errors.New("checkpoint is corrupt: not a replay, or more log than it counts")
	}
	return h, log, nil
}

// orphaned is a run an earlier process was running when it died
// (kill -9, OOM, its host's power): in state.json, not handed over.
type orphaned struct {
	key string
	r   state.Run
	h   run.Handover
	log []byte
}

// takeUp decides, for each run an earlier process died running, whether
// this process adopts it where it stands (its checkpoint and its
// session are there, and this executor resumes sessions), ends it error
// (a step may have started, and it cannot go on: so that no step runs
// twice, it is not run again), or leaves it to run again from the start
// (no checkpoint: no step had started). A run whose check is already
// final (the process died after writing it) is left alone.
func (s *Scheduler) takeUp(ctx context.Context) []orphaned {
	var adopt []orphaned
	for key, r := range s.p.State.Runs() {
		if r.Handover != nil || s.p.Checks.Final(key) {
			continue
		}
		log := s.log.With("check", key, "run", r.RunID)
		h, prior, ok, err := s.readCheckpoint(r.RunID)
		if err != nil {
			// Where it stood is unknown: a step may have started.
			log.Warn("a run of a process that died cannot be taken up", "err", err)
			s.endOrphan(ctx, key, r, prior, fmt.Sprintf("the runner process running it died and where it stood cannot be read (%v): not run again, so that no step runs twice", err), log)
			s.inherited("ended")
			continue
		}
		if !ok {
			log.Info("a run of a process that died had started no step; its work runs again")
			s.inherited("again")
			continue
		}
		// The checkpoint is taken before a step can start: the step may
		// have started.
		where := fmt.Sprintf("during step %d/%d", h.Step+1, len(h.Steps))
		if h.Step >= len(h.Steps) {
			where = "after the run's last step"
		}
		switch why := s.cannotAdopt(ctx, h); why {
		case "":
			if s.p.Drivers != nil {
				// A replica: another may have taken the run meanwhile.
				ckpt, claimed, _, err := s.p.Drivers.Claim(ctx, r.RunID)
				if err != nil || !claimed {
					log.Info("a run of this replica's earlier process is driven by another replica now, or cannot be claimed; left to it", "err", err)
					s.inherited("elsewhere")
					continue
				}
				if ckpt == nil {
					if err := s.startAgain(ctx, key, r.RunID); err != nil {
						log.Warn("a run of this replica's earlier process had recorded no checkpoint in the cluster, and cannot start again now; tried again at the next reconcile", "err", err)
						continue
					}
					log.Info("a run of this replica's earlier process had recorded no checkpoint in the cluster; its work runs again")
					s.inherited("again")
					continue
				}
				if h, prior, err = decodeCheckpoint(ckpt); err != nil {
					log.Warn("the cluster's checkpoint of a run of this replica's earlier process does not read; its local one is used", "err", err)
					h, prior, _, _ = s.readCheckpoint(r.RunID)
				}
			}
			log.Info("a run of a process that died is taken up where it stands", "where", where, "session", h.Session.String())
			adopt = append(adopt, orphaned{key: key, r: r, h: h, log: prior})
		default:
			if h.Session.Executor != s.facts.ExecutorName && s.p.StopForeign != nil {
				// Another executor's session: this one's sweep cannot
				// see it, so it is stopped here, or it goes on alone.
				sctx, cancel := context.WithTimeout(ctx, foreignStopTimeout)
				if err := s.p.StopForeign(sctx, h.Session); err != nil {
					why += fmt.Sprintf("; stopping it failed (%v), so it may go on until its deadline", err)
				}
				cancel()
			}
			if h.Step >= len(h.Steps) {
				// Every step had ended: nothing is left to run, and the
				// checkpoint says how the run stands.
				log.Warn("a run of a process that died after its last step ends as its steps did; its outputs went with its session", "why", why)
				s.endAfterLastStep(ctx, key, r, h, prior, why, log)
				s.inherited("checkpoint")
				continue
			}
			log.Warn("a run of a process that died cannot go on; its check ends error", "where", where, "why", why)
			s.endOrphan(ctx, key, r, prior, fmt.Sprintf("runner restarted %s (the process running it died), and %s: not run again, so that no step runs twice", where, why), log)
			s.inherited("ended")
		}
	}
	return adopt
}

// inherited tells the observer what was done with a run an earlier
// process left going.
func (s *Scheduler) inherited(how string) {
	if s.p.Observer != nil {
		s.p.Observer.Inherited(how)
	}
}

// cannotAdopt says why the run of a checkpoint cannot go on here, or "".
func (s *Scheduler) cannotAdopt(ctx context.Context, h run.Handover) string {
	switch {
	case h.Session.Executor != s.facts.ExecutorName:
		return fmt.Sprintf("its session is on executor %s, which this runner (executor %s) cannot take over", h.Session.Executor, s.facts.ExecutorName)
	case s.facts.Executor.Resumer == nil:
		return fmt.Sprintf("the %s executor cannot take a run over from a process that died", s.facts.ExecutorName)
	}
	if g := s.facts.Executor.Gone; g != nil {
		pctx, cancel := context.WithTimeout(ctx, goneProbeTimeout)
		gone, err := g.Gone(pctx, h.Session)
		cancel()
		if err == nil && gone {
			return fmt.Sprintf("its session %s is gone", h.Session)
		}
		if err != nil {
			s.log.Warn("cannot tell whether the session of a run of a process that died is there; taking it up", "session", h.Session.String(), "err", err)
		}
	}
	return ""
}

// endAfterLastStep writes the final check of a run whose process died
// after its last step (its checkpoint at the end), where the run cannot
// be taken up (why: its session is gone, or its executor resumes none):
// the steps' results and the run's status are the checkpoint's, and the
// log says the outputs and caches, which the run collects from its
// session after its steps, went with it.
func (s *Scheduler) endAfterLastStep(ctx context.Context, key string, r state.Run, h run.Handover, prior []byte, why string, log *slog.Logger) {
	status := h.Status
	if status == "" {
		status = run.Success
	}
	line := fmt.Sprintf("knotless-run: the runner restarted after the run's last step (the process running it died), and %s: the run ends as its steps did; its outputs and caches were not collected\n", why)
	now := time.Now().UTC()
	res := &run.Result{RunID: r.RunID, Workflow: r.Workflow, Executor: s.facts.ExecutorName, Status: status, FailedStep: h.FailedStep, Error: h.Error,
		Steps: h.Steps, StartedAt: r.StartedAt, FinishedAt: now, Log: append(prior, line...)}
	s.endOrphanWith(ctx, key, r, res, log)
}

// takeOver is asked when a run's start met its session there already
// (the fence) with replicas: when the session's driver is gone (a
// replica that died, or this replica's earlier process), this process
// claims the run (Drivers.Claim) and goes on with it from its
// checkpoint, or starts it again when none was recorded (its session
// was deleted: no step had started). It reports whether the run is to
// be tried again here; false leaves it to its live driver.
func (s *Scheduler) takeOver(ctx context.Context, t *task, log *slog.Logger) bool {
	if s.p.Drivers == nil || t.adopt != nil {
		return false
	}
	ckpt, claimed, lastSeen, err := s.p.Drivers.Claim(ctx, t.runID)
	if err != nil {
		log.Warn("the run's session is there and it cannot be claimed; left to its driver", "run", t.runID, "err", err)
		return false
	}
	if !claimed {
		return false
	}
	if ckpt == nil {
		if err := s.startAgain(ctx, t.Key, t.runID); err != nil {
			log.Warn("took over a run whose driver is gone and had started no step, and cannot start it again now; tried again at the next reconcile", "run", t.runID, "err", err)
			return false
		}
		log.Info("took over a run whose driver is gone and had started no step: it starts again", "run", t.runID)
		return true
	}
	h, prior, err := decodeCheckpoint(ckpt)
	if err == nil {
		// Here first: if this process dies too, its successor takes
		// the run up from it.
		err = s.writeCheckpoint(ctx, t.runID, h, prior)
	}
	if err != nil {
		log.Error("took over a run whose driver is gone, and its checkpoint does not read or keep; not run here, so that no step runs twice", "run", t.runID, "err", err)
		return false
	}
	log.Info("took over a run whose driver is gone, where it stands", "run", t.runID, "step", h.Step+1, "steps", len(h.Steps))
	if s.p.Observer != nil {
		s.p.Observer.Inherited("replica")
	}
	s.mu.Lock()
	t.adopt, t.prior, t.driverSeen = &h, prior, lastSeen
	s.mu.Unlock()
	return true
}

// startAgain starts again the run of the check of key, claimed from a
// dead driver that had started no step: its check is queued again
// first, then its session (runID's) goes. In that order, a check that
// says running always has its session, which the next survivor claims
// if this one dies too; a session gone with its check still running
// would be claimed by nobody.
func (s *Scheduler) startAgain(ctx context.Context, key, runID string) error {
	if err := s.p.Checks.Requeued(ctx, key, "its runner process stopped before the run's first step: it runs again"); err != nil {
		return fmt.Errorf("queue its check again: %w", err)
	}
	return s.p.Drivers.Drop(ctx, runID)
}

// TakeOver is asked by intake, with replicas, for a job whose check
// another process of the runner left running: when the run's driver
// is gone, this replica claims the run and goes on with it where it
// stands at once, beside the workers (no slot of theirs is waited
// for: the run's session is there and its step may be going). It
// reports whether the job is handled: taken over, in hand, driven by a
// live replica (left to it), or not claimable now (tried again at a
// later reconcile). false: its driver had started no step and its Job
// is gone; the job is queued as any.
func (s *Scheduler) TakeOver(ctx context.Context, j *job.Job) bool {
	if s.p.Drivers == nil {
		return false
	}
	s.mu.Lock()
	started := s.workers != nil && !s.q.draining
	s.mu.Unlock()
	if !started || s.Elsewhere(j.Key) || s.HasCheck(j.Key) || s.InHand(j.Event.Key()) {
		return true
	}
	// A retried run's later tries are runs of their own (TryKey): the
	// one whose Job is there is the one going.
	tries := 1
	if j.Workflow.Retry != nil {
		tries += j.Workflow.Retry.Max
	}
	var (
		runID, try = "", 0
		ckpt       []byte
		claimed    bool
		lastSeen   time.Time
		err        error
	)
	for try = 1; try <= tries; try++ {
		runID = run.IDFor(s.facts.Runner.String(), TryKey(j.Key, try))
		ckpt, claimed, lastSeen, err = s.p.Drivers.Claim(ctx, runID)
		if !errors.Is(err, executor.ErrSessionGone) {
			break
		}
	}
	log := s.log.With("check", j.Key, "workflow", j.Workflow.Name, "event", j.Event.URI.String(), "run", runID)
	switch {
	case errors.Is(err, executor.ErrSessionGone):
		// No try's Job is there: a live driver is between two tries.
		// (A dead driver's run whose Job someone else deleted stays
		// running: nothing here can tell whether its steps ran.)
		s.drivenElsewhere(j.Key)
		return true
	case err != nil:
		log.Warn("a run left running by another process cannot be claimed now; tried again at the next reconcile", "err", err)
		return true
	case !claimed:
		s.drivenElsewhere(j.Key)
		return true
	case ckpt == nil:
		if err := s.startAgain(ctx, j.Key, runID); err != nil {
			log.Warn("took over a run whose driver is gone and had started no step, and cannot queue it again now; tried again at the next reconcile", "err", err)
			return true
		}
		log.Info("took over a run whose driver is gone and had started no step: it is queued again")
		return false
	}
	h, prior, err := decodeCheckpoint(ckpt)
	if err == nil {
		err = s.writeCheckpoint(ctx, runID, h, prior)
	}
	c, _ := s.p.Checks.Unqueued(j.Key, j.Event, j.Workflow.Name)
	t := &task{Job: j, runID: runID, try: try, check: c, adopt: &h, prior: prior, driverSeen: lastSeen, seen: seen{queued: time.Now(), started: time.Now()}}
	if err == nil {
		var saved []byte
		if saved, err = job.Encode(j, c); err == nil {
			err = s.p.State.StartRun(j.Key, state.Run{CheckKey: j.Key, RunID: runID, Workflow: j.Workflow.Name, Event: j.Event.URI.String(),
				Commit: j.Event.Commit, StartedAt: h.StartedAt, Job: saved})
		}
	}
	if err != nil {
		log.Error("took over a run whose driver is gone, and cannot keep where it stands; not run here, so that no step runs twice", "err", err)
		return true
	}
	log.Info("took over a run whose driver is gone, where it stands", "step", h.Step+1, "steps", len(h.Steps))
	if s.p.Observer != nil {
		s.p.Observer.Inherited("replica")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.q.draining || s.q.has(j.Key) {
		return true
	}
	s.launch(t)
	return true
}
