package run

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/tarstream"
	"knotless.dev/run/internal/rules/workflow"
)

// readScripts loads each step's script: its run text, or the shared step
// file it uses, read through an os.Root so a link in the checkout cannot
// make the runner read a file of its own host.
func (r *runState) readScripts() error {
	var root *os.Root
	for _, s := range r.req.Workflow.Steps {
		if s.Uses == "" {
			r.scripts = append(r.scripts, []byte(s.Run))
			continue
		}
		if root == nil {
			var err error
			if root, err = os.OpenRoot(r.req.Checkout); err != nil {
				return fmt.Errorf("read checkout: %w", err)
			}
			defer root.Close()
		}
		b, err := root.ReadFile(path.Join(workflow.StepsDir, s.Uses))
		if err != nil {
			return fmt.Errorf("step %s uses %s: %w", s.Name, s.Uses, err)
		}
		r.scripts = append(r.scripts, b)
	}
	return nil
}

// runSteps runs the steps in order, each whose condition holds (a step
// without one runs while no earlier step has failed), or until the run
// is detached. from, for an adopted run, says where to go on. After a
// cancel, the steps that still run (if: always() or cancelled()) have
// the engine's CleanupTimeout together; after the run's timeout, or a
// cancel whose cause is ErrStopped, none does.
func (r *runState) runSteps(ctx, runCtx context.Context, sess executor.Session, dirs executor.Dirs, from *Handover) {
	steps := r.req.Workflow.Steps
	first := 0
	if from != nil {
		first = from.Step
	}
	parent, cancelled := ctx, ctx.Err
	ev := r.req.Event
	ev.Trusted = r.req.Trusted
	vars := r.req.Workflow.CondVars(ev, r.req.Vars)
	r.req.Workflow.OutputVars(vars, r.outputs)
	afterCancel := false
	for i := first; i < len(steps); i++ {
		s := steps[i]
		sr := &r.res.Steps[i]
		at := stepStart{time: time.Now()}
		takenUp := from != nil && i == from.Step && from.Replay
		replayed := takenUp && from.Started
		if from != nil && i == from.Step && from.Started && !from.Replay {
			// Its header and the output up to Offset are in the log already.
			at = stepStart{time: from.StepStartedAt, started: true, offset: from.Offset}
		} else {
			if s.ReadsOutputs {
				// Its if or env reads an earlier step's outputs.
				if err := r.loadOutputs(ctx, sess, dirs, i); err != nil {
					sr.Status = Error
					r.fail(Error, s.Name, fmt.Errorf("step %s: %w", s.Name, err))
					continue
				}
				r.req.Workflow.OutputVars(vars, r.outputs)
			}
			state := r.stepState(cancelled() != nil, i)
			runs, err := r.req.Workflow.StepRuns(i, state, vars)
			switch {
			case err != nil:
				sr.Status = Error
				r.fail(Error, s.Name, fmt.Errorf("step %s: %w", s.Name, err))
				continue
			case !runs:
				r.skipStep(i, state)
				continue
			case serviceDied(runCtx) != nil && cancelled() == nil:
				r.logf("==> step %d/%d: %s: skipped: service %s ended", i+1, len(steps), s.Name, serviceDied(runCtx).Service)
				continue
			case runCtx.Err() != nil && cancelled() == nil:
				r.logf("==> step %d/%d: %s: skipped: the run's timeout has passed", i+1, len(steps), s.Name)
				continue
			case cancelled() != nil && errors.Is(context.Cause(parent), ErrStopped):
				r.logf("==> step %d/%d: %s: skipped: %s", i+1, len(steps), s.Name, ErrStopped)
				continue
			case cancelled() != nil && !afterCancel:
				var stop context.CancelFunc
				ctx, stop = context.WithTimeout(context.WithoutCancel(ctx), r.eng.cfg.CleanupTimeout)
				defer stop()
				runCtx, afterCancel = ctx, true
			}
			if replayed {
				// Started by a process that died: its header again, then
				// its output from the first byte, as that process logged
				// them (the log was cut back to before the header).
				at = stepStart{time: from.StepStartedAt, started: true, ledgerExit: r.ledgerExit}
			} else {
				if r.detached() {
					r.handOver(sess, Handover{Step: i})
					return
				}
				if err := r.checkpoint(sess, Handover{Step: i, StepStartedAt: at.time}); err != nil {
					r.fail(Error, "", fmt.Errorf("record where the run stands before step %d/%d, so that it can be taken up again: %w", i+1, len(steps), err))
					return
				}
			}
			r.mark(func(m StepMarker) { m.StepStarted(i+1, s.Name) })
			r.logf("==> step %d/%d: %s", i+1, len(steps), s.Name)
			r.log.Info("step started", "step", s.Name)
		}
		if r.req.Progress != nil {
			r.req.Progress(Progress{Step: i + 1, Steps: len(steps), Name: s.Name, Started: at.time})
		}
		exit, err := r.runStep(ctx, runCtx, sess, dirs, i, at)
		sr.Duration = time.Since(at.time)
		var d *detachedError
		if errors.As(err, &d) {
			// What the mask holds back may begin a secret that the
			// successor reads the rest of: not logged here, read again.
			d.offset -= int64(r.out.Discard())
		}
		r.out.Flush()
		r.lines.endLine()
		var stepErr error
		switch {
		case errors.As(err, &d):
			r.handOver(sess, Handover{Step: i, Started: true, Offset: d.offset, StepStartedAt: at.time})
			return
		case err == nil && exit.Code == 0:
			sr.Status = Success
			sr.ExitCode = &exit.Code
		case err == nil:
			sr.Status = Failure
			sr.ExitCode = &exit.Code
			stepErr = &StepError{Step: s.Name, ExitCode: &exit.Code, Tail: r.tail.String()}
		default:
			var se *StepError
			if errors.As(err, &se) {
				sr.TimedOut = se.TimedOut
				se.Tail = r.tail.String()
			}
			sr.Status = r.classify(ctx, err)
			stepErr = err
		}
		switch {
		case sr.Status == Failure && s.ContinueOnError:
			r.logf("knotless-run: step %s failed, and may (continue-on-error): %s", s.Name, stepErr)
		case stepErr != nil:
			r.fail(sr.Status, s.Name, stepErr)
		}
		code := "none"
		if sr.ExitCode != nil {
			code = strconv.Itoa(*sr.ExitCode)
		}
		r.mark(func(m StepMarker) { m.StepEnded(i+1, sr.Status) })
		r.logf("<== step %s: %s, exit %s, %s", s.Name, sr.Status, code, sr.Duration.Round(time.Millisecond))
		r.log.Info("step ended", "step", s.Name, "status", sr.Status, "exit", code, "duration", sr.Duration.Round(time.Millisecond))
		r.eng.cfg.Observer.StepEnded(string(sr.Status), sr.Duration)
		switch {
		case replayed && r.outputLost:
			// runStep said what was lost.
		case replayed:
			r.logf("knotless-run: step %d/%d was taken over by a new runner process after the one following it died; its output above was read again from the session", i+1, len(steps))
		case takenUp:
			r.logf("knotless-run: step %d/%d was started by a new runner process after the one running the run died before it", i+1, len(steps))
		}
	}
	if err := r.checkpoint(sess, Handover{Step: len(steps)}); err != nil {
		// The verdict stands; a process taking the run up from the
		// checkpoint before the last step reads that step's end from
		// the session's ledger.
		r.log.Warn("record that every step ended", "err", err)
	}
	if r.res.Status == "" {
		r.res.Status = Success
	}
}

// stepState is where the steps before step i stand: cancelled, failed
// (a step that failed and may, continue-on-error, does not count), or
// success.
func (r *runState) stepState(cancelled bool, i int) workflow.State {
	if cancelled {
		return workflow.StateCancelled
	}
	for j, sr := range r.res.Steps[:i] {
		switch {
		case sr.Status == Failure && r.req.Workflow.Steps[j].ContinueOnError:
		case sr.Status == Failure, sr.Status == Error, sr.Status == Cancelled:
			return workflow.StateFailure
		}
	}
	return workflow.StateSuccess
}

// skipStep notes in the log that step i does not run in state (its
// result stays Skipped).
func (r *runState) skipStep(i int, state workflow.State) {
	s := r.req.Workflow.Steps[i]
	var why string
	switch {
	case s.If != nil && (!s.If.Implicit || state == workflow.StateSuccess):
		why = "if: " + strings.TrimSpace(s.If.Text)
	case state == workflow.StateCancelled:
		why = "the run was cancelled"
	default:
		why = "an earlier step failed"
	}
	r.logf("==> step %d/%d: %s: skipped (%s)", i+1, len(r.req.Workflow.Steps), s.Name, why)
	r.log.Info("step skipped", "step", s.Name, "why", why)
}

// checkpoint tells Request.Checkpoint where the run stands: at h.Step,
// its header not logged yet (or, at the number of steps, every step
// has ended or been skipped).
func (r *runState) checkpoint(sess executor.Session, h Handover) error {
	if r.req.Checkpoint == nil {
		return nil
	}
	_ = r.out.Flush()
	r.lines.endLine()
	h.Replay = true
	r.snapshot(sess, &h)
	h.LogSize = r.buf.Total()
	return r.req.Checkpoint(h, r.buf.Bytes())
}

// snapshot fills in what every handover carries: the session, the run's
// and the session's starts, the step results so far and the caches'
// taint.
func (r *runState) snapshot(sess executor.Session, h *Handover) {
	h.Session = sess.Ref()
	h.StartedAt, h.SessionStartedAt = r.res.StartedAt, r.sessionStarted
	h.Steps = append([]StepResult(nil), r.res.Steps...)
	h.CachesClean = r.cachesClean(false)
	h.Status, h.FailedStep, h.Error = r.res.Status, r.res.FailedStep, r.res.Error
}

// stepStart is where a step's run begins: now, or (adopted) a step an
// earlier process started, of which offset output bytes are logged.
// ledgerExit is its exit code as the session's ledger has it, when it
// ended before a process that died read all of it.
type stepStart struct {
	time       time.Time
	started    bool
	offset     int64
	ledgerExit *int
}

// detachedError ends following a step whose run was detached.
type detachedError struct{ offset int64 }

func (e *detachedError) Error() string { return "run detached" }

func (r *runState) detached() bool {
	select {
	case <-r.req.Detach:
		return true
	default:
		return false
	}
}

// handOver ends the run here as Detached, leaving the session going.
func (r *runState) handOver(sess executor.Session, h Handover) {
	r.snapshot(sess, &h)
	r.res.Status, r.res.Handover = Detached, &h
	if h.Started {
		r.logf("knotless-run: runner stopping: step %d/%d goes on, handed over to the next runner process", h.Step+1, len(r.req.Workflow.Steps))
	} else {
		r.logf("knotless-run: runner stopping: step %d/%d is left to the next runner process", h.Step+1, len(r.req.Workflow.Steps))
	}
	h.LogSize = r.buf.Total()
	r.log.Info("run detached", "session", h.Session.String(), "step", h.Step+1, "started", h.Started, "offset", h.Offset)
}

// runStep starts one step (unless at says it was started) and follows
// it to its end, killing it at its timeout, at the run's timeout, or
// when the run is cancelled. Detaching stops the following only.
func (r *runState) runStep(ctx, runCtx context.Context, sess executor.Session, dirs executor.Dirs, i int, at stepStart) (executor.Exit, error) {
	s := r.req.Workflow.Steps[i]
	stepCtx := runCtx
	if s.Timeout > 0 {
		var cancel context.CancelFunc
		stepCtx, cancel = context.WithDeadline(runCtx, at.time.Add(s.Timeout))
		defer cancel()
	}
	id := strconv.Itoa(i + 1)
	var err error
	if !at.started {
		text, perr := r.payload(dirs, i)
		if perr != nil {
			return executor.Exit{}, fmt.Errorf("step %s: %w", s.Name, perr)
		}
		err = sess.StartStep(stepCtx, id, []byte(text))
	}
	exit := executor.Exit{}
	if err == nil {
		r.tail.reset()
		followCtx, stopFollow := r.followContext(stepCtx, sess)
		out := &tarstream.CountingWriter{W: r.out}
		exit, err = sess.FollowStep(followCtx, id, at.offset, out)
		stopFollow()
		if err == nil {
			// Also when detached meanwhile: the step ended here.
			return exit, nil
		}
		if errors.Is(err, executor.ErrExitUnknown) && at.ledgerExit != nil {
			// The process that died had read the step to its end, and
			// the session let go of its output: the ledger's code holds.
			r.logf("knotless-run: the output of step %s went with the runner process that read it; its exit code %d is from the session's ledger", s.Name, *at.ledgerExit)
			r.outputLost = true
			return executor.Exit{Code: *at.ledgerExit}, nil
		}
		if stepCtx.Err() == nil && r.detached() {
			return executor.Exit{}, &detachedError{offset: at.offset + out.N}
		}
	} else if stepCtx.Err() == nil {
		return executor.Exit{}, fmt.Errorf("start step %s: %w", s.Name, err)
	}
	if stepCtx.Err() != nil {
		killCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.eng.cfg.CleanupTimeout)
		defer cancel()
		if kerr := sess.KillStep(killCtx, id); kerr != nil {
			r.log.Error("kill step", "step", s.Name, "err", kerr)
		}
		switch {
		case ctx.Err() != nil:
			return executor.Exit{}, fmt.Errorf("step %s: run cancelled", s.Name)
		case serviceDied(runCtx) != nil:
			return executor.Exit{}, fmt.Errorf("step %s: %w", s.Name, serviceDied(runCtx))
		case runCtx.Err() != nil:
			return executor.Exit{}, &StepError{Step: s.Name, TimedOut: true, Timeout: r.eng.cfg.Max.timeout(r.req)}
		default:
			return executor.Exit{}, &StepError{Step: s.Name, TimedOut: true, Timeout: s.Timeout}
		}
	}
	return executor.Exit{}, fmt.Errorf("follow step %s: %w", s.Name, err)
}

// followContext is the context a step is followed under. Detaching the
// run releases the session (its streams end, the step goes on, nothing is
// acknowledged, so a successor follows from here), else ends the
// following. The returned stop waits for the watcher to end.
func (r *runState) followContext(stepCtx context.Context, sess executor.Session) (context.Context, func()) {
	ctx, cancel := context.WithCancel(stepCtx)
	if r.req.Detach == nil {
		return ctx, cancel
	}
	watcher := make(chan struct{})
	go func() {
		defer close(watcher)
		select {
		case <-r.req.Detach:
			executor.Release(sess)
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(); <-watcher }
}
