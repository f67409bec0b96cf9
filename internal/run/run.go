// Package run is the run lifecycle: it takes a workflow and a checkout,
// runs the steps on an executor session, and produces a Result and a
// masked, capped log. It reads top to bottom in Engine.Run.
package run

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"time"

	"knotless.dev/run/internal/cache"
	"knotless.dev/run/internal/caplog"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/mask"
	"knotless.dev/run/internal/payload"
	"knotless.dev/run/internal/tarstream"
	"knotless.dev/run/internal/workflow"
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
	Keep    bool
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

// resumeLog makes the log go on from the earlier process's: its kept
// bytes and, when they were cut in the middle, its size, so the cut
// marker of the final log counts every byte cut in either process.
func (r *runState) resumeLog(prior []byte, size int64) {
	if size > int64(len(prior)) {
		buf, err := caplog.Resume(caplog.DefaultMax, prior, size)
		if err == nil {
			r.buf = buf
			return
		}
		r.log.Warn("the handed-over log does not resume; it goes on as it was kept", "err", err)
	}
	_, _ = r.buf.Write(prior)
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
}

// execute runs the run from its start: the session started here, or by
// Engine.Begin (st) while the caller got the checkout and the secrets
// ready.
func (r *runState) execute(ctx context.Context, st *Start) {
	wf := r.req.Workflow
	refuse := func(err error) {
		if st != nil {
			st.stop()
		}
		r.fail(Error, "", err)
	}
	grantErr := r.grantSecrets()
	r.openLog(true)
	if grantErr != nil {
		refuse(grantErr)
		return
	}
	if err := r.eng.cfg.Max.check(r.req); err != nil {
		refuse(err)
		return
	}
	if err := r.readScripts(); err != nil {
		refuse(err)
		return
	}

	r.logf("knotless-run: workflow %s, run %s, executor %s", wf.Name, r.req.RunID, r.eng.cfg.Executor.Name())
	var sess executor.Session
	var err error
	if st == nil {
		// Waiting for a node is bounded by the executor (a scale-up may
		// take minutes); the workflow's timeout starts once the session
		// is there.
		startCtx, stopStart := r.startContext(ctx)
		sess, err = r.eng.cfg.Executor.Start(startCtx, r.spec())
		stopStart()
		r.sessionStarted = time.Now()
		if err == nil {
			r.log.Info("session started", "session", sess.Ref().String())
		}
	} else {
		sess, r.sessionStarted, err = st.wait()
	}
	if err != nil {
		if ctx.Err() == nil && r.detached() {
			r.releaseUnstarted(err)
			return
		}
		// The workflow named: a check is of one workflow, but `run`'s
		// error and the daemon's log lines are read without it.
		r.fail(r.faultStatus(ctx), "", fmt.Errorf("start session of workflow %s: %w", wf.Name, err))
		return
	}
	r.sess = sess

	r.steps(ctx, sess, nil)
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
	if h.Started && h.Step >= 0 && h.Step < len(r.req.Workflow.Steps) {
		r.mark(func(m StepMarker) { m.StepStarted(h.Step+1, r.req.Workflow.Steps[h.Step].Name) })
	}
	r.logf("knotless-run: adopted by a new runner process at step %d/%d", h.Step+1, len(r.req.Workflow.Steps))
	sess, err := resumer.Resume(ctx, h.Session)
	if err != nil {
		r.fail(r.faultStatus(ctx), "", fmt.Errorf("resume session %s: %w", h.Session, err))
		return
	}
	r.log.Info("session resumed", "session", sess.Ref().String(), "step", h.Step+1, "offset", h.Offset)
	r.sessionStarted, r.sess = h.SessionStartedAt, sess
	switch {
	case grantErr != nil:
		r.fail(Error, "", grantErr)
	case h.Step < 0 || h.Step >= len(r.req.Workflow.Steps):
		r.fail(Error, "", fmt.Errorf("adopt run %s: step %d of a workflow of %d steps", r.req.RunID, h.Step+1, len(r.req.Workflow.Steps)))
	default:
		r.steps(ctx, sess, &h)
	}
}

// steps puts the checkout (unless the run is adopted: from is set), runs
// the steps and collects the outputs, within the workflow's timeout.
func (r *runState) steps(ctx context.Context, sess executor.Session, from *Handover) {
	runCtx, cancel := r.runContext(ctx)
	defer cancel()
	dirs := sess.Dirs()
	if from == nil {
		if err := r.putCheckout(runCtx, sess, dirs); err != nil {
			r.fail(r.faultStatus(ctx), "", err)
			return
		}
		r.restoreCaches(runCtx, sess, dirs)
	}
	r.runSteps(ctx, runCtx, sess, dirs, from)
	r.saveCaches(ctx, sess, dirs)
	if err := r.collectOutputs(ctx, sess, dirs); err != nil && r.res.Status == Success {
		r.fail(Error, "", err)
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

// grantSecrets decides which secret values the run gets: none for an
// untrusted run, else each name the workflow grants, which must have a
// value. It first checks the run variables, which stand beside them in
// every payload.
func (r *runState) grantSecrets() error {
	r.granted = map[string]string{}
	if err := workflow.CheckRunVars(r.req.Vars, r.req.Workflow.Secrets); err != nil {
		return err
	}
	if !r.req.Trusted {
		return nil
	}
	for _, name := range r.req.Workflow.Secrets {
		v, ok := r.req.Secrets[name]
		if !ok {
			return fmt.Errorf("secret %s is granted by workflow %s but this runner has no value for it", name, r.req.Workflow.Name)
		}
		r.granted[name] = v
	}
	return nil
}

// grantedValues are the values of the granted secrets: what the log, a
// dry run's payloads and the run's error are masked with.
func (r *runState) grantedValues() []string {
	values := make([]string, 0, len(r.granted))
	for _, v := range r.granted {
		values = append(values, v)
	}
	return values
}

func (r *runState) openLog(first bool) {
	sink := io.Writer(r.buf)
	if r.req.Live != nil {
		sink = io.MultiWriter(r.buf, r.req.Live)
	}
	r.mask = mask.NewSet(r.grantedValues())
	r.out = r.mask.Writer(&r.lines)
	r.lines.w = sink
	if !r.req.Trusted && first {
		for _, name := range r.req.Workflow.Secrets {
			r.logf("knotless-run: secret %s withheld: untrusted run", name)
		}
	}
}

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

func (r *runState) spec() executor.Spec {
	wf := r.req.Workflow
	image := wf.Image
	if image == "" {
		image = r.eng.cfg.DefaultImage
	}
	return executor.Spec{
		RunID:       r.req.RunID,
		Runner:      r.eng.cfg.Runner,
		Image:       image,
		Resources:   executor.Resources{CPU: wf.Resources.CPU, Memory: wf.Resources.Memory},
		Timeout:     r.eng.cfg.Max.timeout(r.req),
		Keep:        r.req.Keep,
		Trusted:     r.req.Trusted,
		Annotations: r.req.Annotations,
		Caches:      sessionCaches(wf.Cache),
	}
}

// putCheckout sends the checkout and the step scripts into the session:
// in one transfer where the session has a Root for both, else one each.
// The checkout bound counts the whole stream, the scripts in it.
func (r *runState) putCheckout(ctx context.Context, sess executor.Session, dirs executor.Dirs) error {
	if fi, err := os.Stat(r.req.Checkout); err != nil || !fi.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return fmt.Errorf("checkout %s: %w", r.req.Checkout, err)
	}
	start := time.Now()
	root, work, steps := "", "", ""
	if dirs.Root != "" && path.Dir(dirs.Work) == dirs.Root && path.Dir(dirs.Steps) == dirs.Root {
		root, work, steps = dirs.Root, path.Base(dirs.Work), path.Base(dirs.Steps)
	}
	n, err := r.retryCorrupt("checkout", func() (int64, error) {
		return transfer(ctx, func(w io.Writer) error {
			p := tarstream.NewPacker(ctx, w, r.eng.cfg.Checkout.Limits)
			if err := p.Tree(r.req.Checkout, work); err != nil {
				return err
			}
			if root != "" {
				if err := r.packScripts(p, steps); err != nil {
					return err
				}
			}
			return p.Close()
		}, func(rd io.Reader) error {
			if root != "" {
				return sess.Put(ctx, root, rd)
			}
			return sess.Put(ctx, dirs.Work, rd)
		})
	})
	if err != nil {
		return r.eng.cfg.Checkout.explain("checkout", fmt.Errorf("put checkout: %w", err))
	}
	if root == "" {
		var buf bytes.Buffer
		p := tarstream.NewPacker(ctx, &buf, tarstream.Limits{})
		if err := r.packScripts(p, ""); err != nil {
			return err
		}
		if err := p.Close(); err != nil {
			return err
		}
		if err := sess.Put(ctx, dirs.Steps, &buf); err != nil {
			return fmt.Errorf("put step scripts: %w", err)
		}
	}
	r.log.Info("checkout sent", "bytes", n, "with_scripts", root != "", "duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// packScripts adds each step's script, named its step number under dir.
func (r *runState) packScripts(p *tarstream.Packer, dir string) error {
	for i, s := range r.scripts {
		if err := p.File(path.Join(dir, strconv.Itoa(i+1)), 0o755, s); err != nil {
			return fmt.Errorf("pack step scripts: %w", err)
		}
	}
	return nil
}

// runSteps runs the steps in order until one does not succeed, or the
// run is detached. from, for an adopted run, says where to go on.
func (r *runState) runSteps(ctx, runCtx context.Context, sess executor.Session, dirs executor.Dirs, from *Handover) {
	steps := r.req.Workflow.Steps
	first := 0
	if from != nil {
		first = from.Step
	}
	for i := first; i < len(steps); i++ {
		s := steps[i]
		sr := &r.res.Steps[i]
		at := stepStart{time: time.Now()}
		if from != nil && i == from.Step && from.Started {
			// Its header and the output up to Offset are in the log already.
			at = stepStart{time: from.StepStartedAt, started: true, offset: from.Offset}
		} else {
			if r.detached() {
				r.handOver(sess, Handover{Step: i})
				return
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
			r.fail(Failure, s.Name, &StepError{Step: s.Name, ExitCode: &exit.Code})
		default:
			var se *StepError
			if errors.As(err, &se) {
				sr.TimedOut = se.TimedOut
			}
			sr.Status = r.classify(ctx, runCtx, err)
			r.fail(sr.Status, s.Name, err)
		}
		code := "none"
		if sr.ExitCode != nil {
			code = strconv.Itoa(*sr.ExitCode)
		}
		r.mark(func(m StepMarker) { m.StepEnded(i+1, sr.Status) })
		r.logf("<== step %s: %s, exit %s, %s", s.Name, sr.Status, code, sr.Duration.Round(time.Millisecond))
		r.log.Info("step ended", "step", s.Name, "status", sr.Status, "exit", code, "duration", sr.Duration.Round(time.Millisecond))
		r.eng.cfg.Observer.StepEnded(string(sr.Status), sr.Duration)
		if sr.Status != Success {
			return
		}
	}
	r.res.Status = Success
}

// stepStart is where a step's run begins: now, or (adopted) a step an
// earlier process started, of which offset output bytes are logged.
type stepStart struct {
	time    time.Time
	started bool
	offset  int64
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
	h.Session = sess.Ref()
	h.StartedAt, h.SessionStartedAt = r.res.StartedAt, r.sessionStarted
	h.Steps = append([]StepResult(nil), r.res.Steps...)
	h.CachesClean = r.cachesClean(false)
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
		followCtx, stopFollow := r.followContext(stepCtx, sess)
		out := &tarstream.CountingWriter{W: r.out}
		exit, err = sess.FollowStep(followCtx, id, at.offset, out)
		stopFollow()
		if err == nil {
			// Also when detached meanwhile: the step ended here.
			return exit, nil
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

// payload builds the text that starts step i: the runner's variables,
// the workflow's env and the run's variables, the step's granted
// secrets, and its script.
func (r *runState) payload(dirs executor.Dirs, i int) (string, error) {
	s := r.req.Workflow.Steps[i]
	env := []payload.Var{
		{Name: executor.EnvWork, Value: dirs.Work},
		{Name: executor.EnvSteps, Value: dirs.Steps},
		{Name: executor.EnvOutputs, Value: dirs.Outputs},
		{Name: executor.EnvRunID, Value: r.req.RunID},
		{Name: executor.EnvWorkflow, Value: r.req.Workflow.Name},
		{Name: executor.EnvStep, Value: s.Name},
		{Name: "CI", Value: "true"},
	}
	// The workflow's env, then the run's variables: a run variable of
	// the same name takes the place of the workflow's.
	for _, vars := range [][]workflow.EnvVar{r.req.Workflow.Env, r.req.Vars} {
		for _, v := range vars {
			env = slices.DeleteFunc(env, func(e payload.Var) bool { return e.Name == v.Name })
			env = append(env, payload.Var{Name: v.Name, Value: v.Value})
		}
	}
	var secrets []payload.Var
	for _, name := range s.Secrets {
		if v, ok := r.granted[name]; ok {
			secrets = append(secrets, payload.Var{Name: name, Value: v})
		}
	}
	return payload.Build(payload.Step{
		Env:     env,
		Secrets: secrets,
		Dir:     dirs.Work,
		Script:  path.Join(dirs.Steps, strconv.Itoa(i+1)),
	})
}

// DryRun returns each step's payload with secret values masked, as the
// executor would receive it.
func (e *Engine) DryRun(req Request, dirs executor.Dirs) ([]string, error) {
	r := &runState{eng: e, req: req}
	if err := r.grantSecrets(); err != nil {
		return nil, err
	}
	var out []string
	for i := range req.Workflow.Steps {
		text, err := r.payload(dirs, i)
		if err != nil {
			return nil, err
		}
		out = append(out, mask.String(text, r.grantedValues()))
	}
	return out, nil
}

// SessionSpec is what the engine would start req's session from (for a
// dry run that shows the executor's objects).
func (e *Engine) SessionSpec(req Request) executor.Spec {
	return (&runState{eng: e, req: req}).spec()
}

// collectOutputs brings the session's outputs directory back and unpacks
// it, as hostile input, into the request's outputs directory.
func (r *runState) collectOutputs(ctx context.Context, sess executor.Session, dirs executor.Dirs) error {
	if r.req.Outputs == "" || r.res.Status == Cancelled || r.res.Status == Detached {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.eng.cfg.CleanupTimeout)
	defer cancel()
	if err := os.MkdirAll(r.req.Outputs, 0o755); err != nil {
		return fmt.Errorf("create outputs directory: %w", err)
	}
	// Unpack into a staging directory beside the outputs, so a refused or
	// corrupted transfer leaves nothing half-written among them.
	n, err := r.retryCorrupt("outputs", func() (int64, error) {
		stage, err := os.MkdirTemp(filepath.Dir(filepath.Clean(r.req.Outputs)), ".knotless-outputs-")
		if err != nil {
			return 0, fmt.Errorf("create staging directory: %w", err)
		}
		defer os.RemoveAll(stage)
		n, err := transfer(ctx, func(w io.Writer) error { return sess.Get(ctx, dirs.Outputs, w) },
			func(rd io.Reader) error { return tarstream.Unpack(ctx, rd, stage, r.eng.cfg.Outputs.Limits) })
		if err != nil {
			return n, err
		}
		return n, moveEntries(stage, r.req.Outputs)
	})
	if err != nil {
		return r.eng.cfg.Outputs.explain("outputs", fmt.Errorf("collect outputs: %w", err))
	}
	r.log.Info("outputs collected", "bytes", n)
	files, err := listFiles(r.req.Outputs)
	r.res.Outputs = files
	r.res.Artifacts = r.req.Workflow.Published(files)
	return err
}

// retryCorrupt runs a transfer again once when the two ends' digests
// differ, saying so in the run log.
func (r *runState) retryCorrupt(what string, do func() (int64, error)) (int64, error) {
	n, err := do()
	if errors.Is(err, executor.ErrTransferCorrupt) {
		r.logf("knotless-run: %s transfer corrupted (%v); sending it once more", what, err)
		r.log.Warn("transfer corrupted; retrying", "transfer", what, "err", err)
		n, err = do()
	}
	return n, err
}

// moveEntries moves each top-level entry of from into to, replacing an
// entry of the same name.
func moveEntries(from, to string) error {
	entries, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, e := range entries {
		dst := filepath.Join(to, e.Name())
		if err := os.RemoveAll(dst); err != nil {
			return err
		}
		if err := os.Rename(filepath.Join(from, e.Name()), dst); err != nil {
			return err
		}
	}
	return nil
}

func listFiles(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	sort.Strings(files)
	return files, err
}

// faultStatus is the status of a fault outside any step: Cancelled when
// the run was cancelled, else Error.
func (r *runState) faultStatus(ctx context.Context) Status {
	if ctx.Err() != nil {
		return Cancelled
	}
	return Error
}

// classify turns a step's error into a status.
func (r *runState) classify(ctx, runCtx context.Context, err error) Status {
	var se *StepError
	switch {
	case ctx.Err() != nil:
		return Cancelled
	case errors.As(err, &se):
		return Failure
	default:
		return Error
	}
}

// fail records the first thing that ended the run.
func (r *runState) fail(status Status, step string, err error) {
	if r.res.Status != "" && r.res.Status != Success {
		return
	}
	r.res.Status, r.res.FailedStep, r.res.Error = status, step, err.Error()
	if r.out != nil {
		r.logf("knotless-run: %s: %s", status, err)
	}
}

func (r *runState) finish() {
	if r.res.Status == "" {
		r.res.Status = Error
		r.res.Error = "run ended without a status"
	}
	if r.out != nil {
		_ = r.out.Flush()
	}
	if r.granted != nil && r.res.Error != "" {
		r.res.Error = mask.String(r.res.Error, r.grantedValues())
	}
	r.res.FinishedAt = time.Now().UTC()
	r.res.Mask = r.mask
	r.res.Log = r.buf.Bytes()
	r.res.LogSize = r.buf.Total()
	r.log.Info("run finished", "status", r.res.Status, "failed_step", r.res.FailedStep, "duration", r.res.FinishedAt.Sub(r.res.StartedAt).Round(time.Millisecond))
}

// mark tells a Live that takes step marks of the line logged next: what
// the log holds back is written first and an unended line ended, so the
// mark falls where that line begins.
func (r *runState) mark(f func(StepMarker)) {
	m, ok := r.req.Live.(StepMarker)
	if !ok {
		return
	}
	_ = r.out.Flush()
	r.lines.endLine()
	f(m)
}

// logf writes one line of the runner's own to the run log.
func (r *runState) logf(format string, args ...any) {
	r.lines.endLine()
	fmt.Fprintf(r.out, format+"\n", args...)
	_ = r.out.Flush()
}

// transfer runs produce and consume over a pipe and returns the bytes
// that crossed it.
func transfer(ctx context.Context, produce func(io.Writer) error, consume func(io.Reader) error) (int64, error) {
	pr, pw := io.Pipe()
	counted := &tarstream.CountingWriter{W: pw}
	produced := make(chan error, 1)
	go func() {
		err := produce(counted)
		pw.CloseWithError(err)
		produced <- err
	}()
	cerr := consume(pr)
	pr.CloseWithError(errors.New("consumer finished"))
	perr := <-produced
	// A producer that stopped at a bound says why better than the
	// consumer that saw its stream break off.
	if cerr != nil && !passedBound(perr) {
		return counted.N, cerr
	}
	return counted.N, perr
}

// Bound limits one kind of transfer, and names the limits in the error a
// run ends with when a transfer passes one (the flags that set them). A
// zero limit is tarstream's default, not no bound.
type Bound struct {
	tarstream.Limits
	BytesName, FilesName string
}

func passedBound(err error) bool {
	return errors.Is(err, tarstream.ErrTooLarge) || errors.Is(err, tarstream.ErrTooManyFiles)
}

// explain puts the name of the bound a transfer of what passed in front
// of err.
func (b Bound) explain(what string, err error) error {
	name := func(n, fallback string) string {
		if n == "" {
			return fallback
		}
		return n
	}
	lim := b.Effective() // a zero field is tarstream's default
	switch {
	case errors.Is(err, tarstream.ErrTooLarge):
		return fmt.Errorf("%s exceed %s (%d bytes): %w", what, name(b.BytesName, "the size bound"), lim.MaxBytes, err)
	case errors.Is(err, tarstream.ErrTooManyFiles):
		return fmt.Errorf("%s exceed %s (%d files): %w", what, name(b.FilesName, "the file count bound"), lim.MaxFiles, err)
	}
	return err
}

// lineTracker remembers whether the log ends mid-line, so the runner's
// own lines always start on a line of their own.
type lineTracker struct {
	w       io.Writer
	midLine bool
}

func (l *lineTracker) Write(p []byte) (int, error) {
	if len(p) > 0 {
		l.midLine = p[len(p)-1] != '\n'
	}
	return l.w.Write(p)
}

func (l *lineTracker) endLine() {
	if l.midLine {
		_, _ = l.Write([]byte("\n"))
	}
}
