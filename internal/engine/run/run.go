// Package run is the run lifecycle: it takes a workflow and a checkout,
// runs the steps on an executor session, and produces a Result and a
// masked, capped log. It reads top to bottom in Engine.Run (run.go),
// whose parts each have a file: the secrets and the step payload
// (payload.go), the checkout and outputs transfers (transfer.go), the
// caches (cache.go), the steps (steps.go), the log (log.go), the
// verdict (finish.go) and the session's clean-up after it (cleanup.go).
package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"knotless.dev/run/internal/engine/cache"
	"knotless.dev/run/internal/engine/caplog"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/mask"
	"knotless.dev/run/internal/rules/class"
	"knotless.dev/run/internal/rules/workflow"
)

// Config configures an Engine.
type Config struct {
	Executor executor.Executor
	Logger   *slog.Logger
	// Runner is the runner's DID.
	Runner string
	// DefaultImage is used when a workflow names none.
	DefaultImage string
	// Checkout bounds the checkout put into a session, Outputs the
	// outputs brought back from it. A zero field is tarstream's default
	// (tarstream.Limits), never no bound.
	Checkout, Outputs Bound
	// CleanupTimeout bounds stopping a session after the run (and
	// killing a step, saving caches, collecting outputs), also after the
	// run's context has ended.
	CleanupTimeout time.Duration
	// Max bounds what a workflow may ask for (untrusted runs, or all).
	Max Maximums
	// Classes are the operator's resource classes; the zero Set holds
	// only the built-in default class.
	Classes class.Set
	// Caches is the store of workflow caches; nil keeps none.
	Caches Caches
	// Observer is told how steps end and what caches did; nil observes
	// nothing.
	Observer Observer
	// Cleaner, when set, takes each session's clean-up once the run's
	// Result is complete: Run returns the verdict without waiting for
	// the session to be removed, and the Cleaner's owner waits for it
	// (Cleaner.Wait). Nil: Run removes the session before it returns.
	// Either way a clean-up that fails leaves the Result as it is.
	Cleaner *Cleaner
}

// Engine runs workflows.
type Engine struct {
	cfg  Config
	caps executor.Capabilities // asked of the executor once, in New
}

// New returns an Engine.
func New(cfg Config) *Engine {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CleanupTimeout == 0 {
		cfg.CleanupTimeout = 2 * time.Minute
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	return &Engine{cfg: cfg, caps: executor.CapabilitiesOf(cfg.Executor)}
}

// Request is one run to do.
type Request struct {
	RunID    string
	Workflow *workflow.Workflow
	// Checkout is the directory put at the session's work directory.
	Checkout string
	// Outputs receives what the steps wrote to their outputs directory;
	// empty means the outputs are not collected.
	Outputs string
	// Secrets holds the values this runner has, by name; the workflow
	// and its steps decide which are granted.
	Secrets map[string]string
	// Vars are run variables given from outside the workflow file (a
	// re-run's env, a dispatch's inputs): every step gets them in its
	// environment through the payload, after the workflow's env (a name
	// in both takes this value). They are not secret and not masked.
	// Checked by workflow.CheckRunVars against the secrets the workflow
	// grants: a refused one ends the run error, naming it, before any
	// session starts.
	Vars []workflow.EnvVar
	// Trusted runs (pushes by the owner) get secrets; untrusted ones
	// (pulls, batches from others) never do.
	Trusted bool
	// Event is what the steps' conditions (if:) read of the run's
	// event; event.trusted is the request's Trusted, whatever its own.
	Event workflow.CondEvent
	Keep  bool
	// Live receives the masked log as it is written (a terminal, the
	// run's output stream): the bytes of Result.Log, in order, before
	// any cut. A Live that is a StepMarker also learns where the steps'
	// header and footer lines begin. Its Write must not block: the run
	// waits for it.
	Live        io.Writer
	Annotations map[string]string
	// Cache says whose caches the run restores and saves.
	Cache CacheScope
	// Detach, when closed, hands the run over instead of finishing it:
	// the engine stops following, leaves the step and the session going,
	// and returns status Detached with the Handover a successor Adopts.
	// A step that has not started yet is left for the successor to
	// start; once the last step has ended the run finishes here. Only an
	// executor that resumes sessions (executor.Resumer) detaches; with
	// any other, Detach is ignored.
	Detach <-chan struct{}
	// Progress, when set, is told each step as it starts (for an adopted
	// run, the step it goes on with, with its first start), for whoever
	// shows what the run is doing. It must not block.
	Progress func(Progress)
	// Checkpoint, when set, is told where the run stands at each step's
	// boundary, before the step's header is logged and before it can
	// start, and once the last step has ended: the Handover a process
	// that takes the run over after this one died (kill -9, OOM) adopts
	// (Replay set), and the log so far (Result.Log up to h.LogSize). The
	// caller keeps the newest on disk; the run waits for it, so that no
	// step starts before the point it could be taken up again from is
	// recorded. An error before a step ends the run error without
	// starting it: a run that cannot be taken up again must not go on.
	Checkpoint func(h Handover, log []byte) error
	// Fence, when set, is asked once the run's session has started and
	// before anything of the run goes into it: an error wrapping
	// executor.ErrRunExists says another process ran the run or runs
	// it (with replicas: one that ended it and removed its session
	// while this one decided to start it). The session, just made, is
	// stopped and the run is fenced: it writes nothing. Any other error
	// ends the run error.
	Fence func(ctx context.Context) error
	// HoldSession, when set, keeps the run's session after the run
	// until it is closed (or the Cleaner's owner cuts its clean-ups
	// short): with replicas, the session outlives the run's final
	// check, so that a run whose check says running always has its
	// session for a survivor to claim. Only the Cleaner waits for it (a
	// clean-up before Run returns cannot).
	HoldSession <-chan struct{}
}

// Progress is the step a run is at.
type Progress struct {
	Step, Steps int // from 1
	Name        string
	Started     time.Time
}

// StepMarker is implemented by a Request.Live that takes the run's step
// boundaries. The engine calls StepStarted just before it writes a step's
// header line ("==> step N/M: NAME"), or, in a run adopted during the
// step, the line saying so; StepEnded just before the step's footer line
// ("<== step NAME: STATUS, ..."). Everything before the line has been
// written to Live then, so the mark's place is where the line begins.
// Steps count from 1. A step's own output cannot make a mark.
type StepMarker interface {
	StepStarted(step int, name string)
	StepEnded(step int, status Status)
}

// Run runs req to the end and returns its result. It never returns
// without a final status: every fault becomes Error, a cancelled ctx
// becomes Cancelled. The result is complete once the outputs and caches
// are back; the session is removed after it (Config.Cleaner), and a
// Capabilities are what the engine's executor can do beyond the core,
// as it was asked once, in New: the one answer the daemon hands on.
func (e *Engine) Capabilities() executor.Capabilities { return e.caps }

// removal that fails never changes it.
func (e *Engine) Run(ctx context.Context, req Request) *Result {
	r := e.newRunState(req)
	r.execute(ctx, nil)
	r.finish()
	e.cleanUp(ctx, r)
	return r.res
}

// Adopt goes on with a run another process detached: it resumes the
// session, follows the step that was going from where the log stopped
// (or starts the step that was next), runs the remaining steps, collects
// the outputs and stops the session as Run does. priorLog is the earlier
// process's log (Result.Log of the detached run); the result's log
// continues it. req must be the request the run was started with; its
// secrets are granted again for the remaining steps.
func (e *Engine) Adopt(ctx context.Context, req Request, h Handover, priorLog []byte) *Result {
	r := e.newRunState(req)
	r.res.StartedAt = h.StartedAt
	for i := range r.res.Steps {
		if i < len(h.Steps) && h.Steps[i].Name == r.res.Steps[i].Name {
			r.res.Steps[i] = h.Steps[i]
		}
	}
	r.resumeLog(priorLog, h.LogSize)
	r.adopt(ctx, h)
	r.finish()
	e.cleanUp(ctx, r)
	return r.res
}

func (e *Engine) newRunState(req Request) *runState {
	if !e.caps.Detaches() {
		req.Detach = nil
	}
	r := &runState{
		eng: e,
		req: req,
		log: e.cfg.Logger.With("run", req.RunID, "workflow", req.Workflow.Name),
		res: &Result{
			RunID:     req.RunID,
			Workflow:  req.Workflow.Name,
			Executor:  e.cfg.Executor.Name(),
			StartedAt: time.Now().UTC(),
		},
		buf: caplog.New(caplog.DefaultMax),
	}
	for _, s := range req.Workflow.Steps {
		r.res.Steps = append(r.res.Steps, StepResult{Name: s.Name, Status: Skipped})
	}
	return r
}

type runState struct {
	eng     *Engine
	req     Request
	log     *slog.Logger
	res     *Result
	buf     *caplog.Buffer
	mask    *mask.Set    // the granted values: the log's, and the published files'
	out     *mask.Writer // everything written to the run log goes through it
	lines   lineTracker
	tail    tailBuffer // the current step's output, masked
	granted map[string]string
	scripts [][]byte
	// restored are the cache layers the run restored; their taint
	// passes to the layers it saves. restoreUnrecorded says an adopted
	// run cannot tell what the first process restored.
	restored          []cache.Layer
	restoreUnrecorded bool
	// sessionStarted is when the session was there: the workflow's
	// timeout counts from it, not from a wait for a node.
	sessionStarted time.Time
	// sess is the run's session once started or resumed: removed after
	// the result is complete (Engine.cleanUp).
	sess executor.Session
	// ledgerExit is, in a run taken up after its process died, the exit
	// code the session's ledger has of the step the checkpoint stopped
	// before, if it ended; outputLost says its output was gone with the
	// process that read it.
	ledgerExit *int
	outputLost bool
	// outputs are the steps' outputs read from the session so far (for
	// the steps that read them); outputsSaid, the steps whose outputs'
	// problems the log has said.
	outputs     workflow.Outputs
	outputsSaid map[int]bool
}

// execute runs the run from its start: the session started here, or by
// Engine.Begin (st) while the caller got the checkout and the secrets
// ready.
func (r *runState) execute(ctx context.Context, st *Start) {
	if err := r.prepare(); err != nil {
		if st != nil {
			st.stop()
		}
		r.fail(Error, "", err)
		return
	}
	r.logf("knotless-run: workflow %s, run %s, executor %s", r.req.Workflow.Name, r.req.RunID, r.eng.cfg.Executor.Name())
	sess, err := r.startSession(ctx, st)
	if err != nil {
		if errors.Is(err, executor.ErrRunExists) {
			r.fenced(err)
			return
		}
		if ctx.Err() == nil && r.detached() {
			r.releaseUnstarted(err)
			return
		}
		// The workflow named: a check is of one workflow, but `run`'s
		// error and the daemon's log lines are read without it.
		r.fail(r.faultStatus(ctx), "", fmt.Errorf("start session of workflow %s: %w", r.req.Workflow.Name, err))
		return
	}
	r.sess = sess
	if f := r.req.Fence; f != nil {
		if err := f(ctx); errors.Is(err, executor.ErrRunExists) {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.eng.cfg.CleanupTimeout)
			if serr := sess.Stop(sctx); serr != nil {
				r.log.Error("stop the session of a run another process ran; the next sweep removes it", "session", sess.Ref().String(), "err", serr)
			}
			cancel()
			r.fenced(err)
			return
		} else if err != nil {
			r.fail(Error, "", err)
			return
		}
	}
	r.steps(ctx, sess, nil)
}

// prepare does what a run needs before its session: the run variables
// checked and the secrets granted, the log opened (whatever else
// fails), the operator's maximums checked and the step scripts read.
func (r *runState) prepare() error {
	grantErr := r.grantSecrets()
	r.openLog(true)
	if grantErr != nil {
		return grantErr
	}
	if err := r.eng.cfg.Max.check(r.req); err != nil {
		return err
	}
	c, err := r.eng.cfg.Classes.Pick(r.req.Workflow.Class, r.req.Trusted)
	if err != nil {
		return err
	}
	_, _, lowered := c.Clamp(r.req.Workflow.Resources.CPU, r.req.Workflow.Resources.Memory)
	for _, l := range lowered {
		r.logf("knotless-run: %s", l)
	}
	return r.readScripts()
}

// startSession starts the run's session on the executor, or (st) waits
// for the one Engine.Begin is starting, and notes when it was there.
func (r *runState) startSession(ctx context.Context, st *Start) (executor.Session, error) {
	if st != nil {
		sess, started, err := st.wait()
		r.sessionStarted = started
		return sess, err
	}
	// Waiting for a node is bounded by the executor (a scale-up may take
	// minutes); the workflow's timeout starts once the session is there.
	startCtx, stopStart := r.startContext(ctx)
	sess, err := r.eng.cfg.Executor.Start(startCtx, r.spec())
	stopStart()
	r.sessionStarted = time.Now()
	if err == nil {
		r.log.Info("session started", "session", sess.Ref().String())
	}
	return sess, err
}

// startContext is ctx, also ended when the run is detached: a session
// still waiting for its pod (Pending) has nothing to hand over, so a
// stopping daemon does not wait for it.
func (r *runState) startContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if r.req.Detach == nil {
		return ctx, func() {}
	}
	sctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-r.req.Detach:
			cancel()
		case <-sctx.Done():
		}
	}()
	return sctx, cancel
}

// fenced ends a run whose session exists already (the fence: its
// objects are named from its id): another process drives it. Nothing
// ran here and nothing of the run's may be written from here.
func (r *runState) fenced(err error) {
	r.res.Status, r.res.Handover, r.res.Fenced, r.res.Error = Detached, nil, true, err.Error()
	r.log.Warn("the run's session exists already: another process drives it; not run twice", "err", err)
}

// releaseUnstarted ends a run detached before its session was there:
// the executor removed what it had made (a failed Start leaves nothing),
// no step ran, and the work is left to the next process as it was.
func (r *runState) releaseUnstarted(err error) {
	r.res.Status, r.res.Handover = Detached, nil
	r.logf("knotless-run: runner stopping before the session started: the run is left to the next runner process")
	r.log.Info("run released before its session started", "start_err", err)
}

// adopt is execute for a run an earlier process detached: the session
// and the checkout are there already. The session is resumed first, so
// that whatever ends the run here also stops it.
func (r *runState) adopt(ctx context.Context, h Handover) {
	grantErr := r.grantSecrets()
	r.restoreUnrecorded = !h.CachesClean
	r.openLog(false)
	resumer := r.eng.caps.Resumer
	if resumer == nil {
		r.fail(Error, "", fmt.Errorf("adopt run %s: the %s executor cannot resume sessions", r.req.RunID, r.eng.cfg.Executor.Name()))
		return
	}
	n := len(r.req.Workflow.Steps)
	if !h.Replay {
		// A handover: the log ends where the earlier process stopped.
		// A replay goes on byte for byte instead and says so later
		// (runSteps).
		if h.Started && h.Step >= 0 && h.Step < n {
			r.mark(func(m StepMarker) { m.StepStarted(h.Step+1, r.req.Workflow.Steps[h.Step].Name) })
		}
		r.logf("knotless-run: adopted by a new runner process at step %d/%d", h.Step+1, n)
	}
	sess, err := resumer.Resume(ctx, h.Session)
	if err != nil {
		r.fail(r.faultStatus(ctx), "", fmt.Errorf("resume session %s: %w", h.Session, err))
		return
	}
	r.sessionStarted, r.sess = h.SessionStartedAt, sess
	last := n - 1
	if h.Replay {
		last = n // the checkpoint after the last step
	}
	if h.Status != "" {
		// A step failed before the handover, and later ones ran on.
		r.res.Status, r.res.FailedStep, r.res.Error = h.Status, h.FailedStep, h.Error
	}
	switch {
	case grantErr != nil:
		r.fail(Error, "", grantErr)
	case h.Step < 0 || h.Step > last:
		r.fail(Error, "", fmt.Errorf("adopt run %s: step %d of a workflow of %d steps", r.req.RunID, h.Step+1, n))
	default:
		if h.Replay {
			if err := r.settleReplay(ctx, sess, &h); err != nil {
				r.fail(r.faultStatus(ctx), "", err)
				return
			}
		}
		r.log.Info("session resumed", "session", sess.Ref().String(), "step", h.Step+1, "started", h.Started, "offset", h.Offset, "replay", h.Replay)
		r.steps(ctx, sess, &h)
		if h.Replay && h.Step == n {
			r.logf("knotless-run: taken over after its last step by a new runner process after the one running it died")
		}
	}
}

// settleReplay asks the session's ledger whether the step a checkpoint
// stopped before has started, and how it ended if it did. A session
// without a ledger cannot tell: the step is taken as started and
// followed, never started a second time.
func (r *runState) settleReplay(ctx context.Context, sess executor.Session, h *Handover) error {
	if h.Step == len(r.req.Workflow.Steps) {
		return nil
	}
	l, ok := sess.(executor.StepLedger)
	if !ok {
		h.Started = true
		return nil
	}
	steps, err := l.Ledger(ctx)
	if err != nil {
		return fmt.Errorf("adopt run %s: %w", r.req.RunID, err)
	}
	rec, started := steps[strconv.Itoa(h.Step+1)]
	h.Started, r.ledgerExit = started, rec.Exit
	return nil
}

// steps puts the checkout (unless the run is adopted: from is set), runs
// the steps and collects the outputs, within the workflow's timeout.
func (r *runState) steps(ctx context.Context, sess executor.Session, from *Handover) {
	runCtx, cancel := r.runContext(ctx)
	defer cancel()
	runCtx, stopWatch := r.watchServices(runCtx, sess)
	defer stopWatch()
	dirs := sess.Dirs()
	if from == nil {
		if err := r.putCheckout(runCtx, sess, dirs); err != nil {
			r.fail(r.faultStatus(ctx), "", err)
			return
		}
		r.restoreCaches(runCtx, sess, dirs)
	}
	r.runSteps(ctx, runCtx, sess, dirs, from)
	stopWatch()
	if se := serviceDied(runCtx); se != nil {
		r.fail(Error, "", se)
	}
	r.saveCaches(ctx, sess, dirs)
	if err := r.collectOutputs(ctx, sess, dirs); err != nil && r.res.Status == Success {
		r.fail(Error, "", err)
	}
	if r.res.Status != Detached {
		logCtx, cancelLog := context.WithTimeout(context.WithoutCancel(ctx), r.eng.cfg.CleanupTimeout)
		r.logServices(logCtx, sess)
		cancelLog()
	}
}

// runContext bounds the run by the workflow's timeout, counted from the
// session's start (for an adopted run, the first process's session).
func (r *runState) runContext(ctx context.Context) (context.Context, context.CancelFunc) {
	timeout := r.eng.cfg.Max.timeout(r.req)
	if timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, r.sessionStarted.Add(timeout))
}

func (r *runState) spec() executor.Spec {
	wf := r.req.Workflow
	image := wf.Image
	if image == "" {
		image = r.eng.cfg.DefaultImage
	}
	// A class the run may not name never reaches here (prepare, Begin).
	c, _ := r.eng.cfg.Classes.Pick(wf.Class, r.req.Trusted)
	cpu, memory, _ := c.Clamp(wf.Resources.CPU, wf.Resources.Memory)
	return executor.Spec{
		RunID:       r.req.RunID,
		Runner:      r.eng.cfg.Runner,
		Image:       image,
		Resources:   executor.Resources{CPU: cpu, Memory: memory},
		Class:       c,
		Timeout:     r.eng.cfg.Max.timeout(r.req),
		Keep:        r.req.Keep,
		Trusted:     r.req.Trusted,
		Annotations: r.req.Annotations,
		Caches:      sessionCaches(wf.Cache),
		Services:    r.serviceSpecs(),
		StepImages:  r.stepImages(),
	}
}

// SessionSpec is what the engine would start req's session from (for a
// dry run that shows the executor's objects).
func (e *Engine) SessionSpec(req Request) executor.Spec {
	return (&runState{eng: e, req: req}).spec()
}
