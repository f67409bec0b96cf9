package run

import (
	"context"
	"errors"
	"time"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/rules/workflow"
)

// Start is a run whose session is starting: Engine.Begin made it, and
// its Run goes on once the caller has the checkout and the secrets. The
// session's spec depends on neither (only on the workflow, the run's
// trust, id, keep and annotations), so what the caller does meanwhile
// (export the tree, gather the secrets, write the running check)
// overlaps the session's start: on Kubernetes the Job is created at
// Begin and its pod is scheduled and started while the caller works.
//
// Exactly one of Run and Discard must be called: each waits for the
// start's goroutine, which the Start owns.
type Start struct {
	r *runState
	// cancel ends the start (Discard, or a run that cannot go on).
	cancel context.CancelFunc
	done   chan struct{} // closed when the start has ended
	// Set by the start's goroutine before done is closed: the session
	// or why there is none, and when it was there.
	sess executor.Session
	err  error
	at   time.Time
	// started is false when Begin started nothing: the run is refused
	// before any session (its run variables, the operator's maximums).
	started bool
}

// Begin starts the session of req's run on the executor, in a goroutine
// of the returned Start, and returns at once. req.Checkout and
// req.Secrets are not read here: Start.Run takes them. A run the engine
// refuses before any session (a run variable a workflow may not take, a
// maximum passed) starts none: Run then ends it with the error.
func (e *Engine) Begin(ctx context.Context, req Request) *Start {
	r := e.newRunState(req)
	st := &Start{r: r, done: make(chan struct{})}
	if workflow.CheckRunVars(req.Vars, req.Workflow.Secrets) != nil || e.cfg.Max.check(req) != nil || e.classErr(req) != nil {
		st.cancel, st.err = func() {}, errNotStarted
		close(st.done)
		return st
	}
	// Without the checkout the scripts of `uses` steps are not read
	// yet: the spec needs none of them.
	st.started = true
	var sctx context.Context
	sctx, st.cancel = context.WithCancel(ctx)
	// What the goroutine reads of the request, read here: Run fills in
	// the rest meanwhile.
	spec, log := r.spec(), r.log
	startCtx, stopStart := r.startContext(sctx)
	go func() {
		defer close(st.done)
		defer stopStart()
		st.sess, st.err = e.cfg.Executor.Start(startCtx, spec)
		st.at = time.Now()
		if st.err == nil {
			log.Info("session started", "session", st.sess.Ref().String())
		}
	}()
	return st
}

// errNotStarted is what wait gives for a run Begin refused; execute
// refuses it before it asks.
var errNotStarted = errors.New("no session started: the run was refused before it")

// wait waits for the start to end and returns what it gave.
func (s *Start) wait() (executor.Session, time.Time, error) {
	<-s.done
	return s.sess, s.at, s.err
}

// stop ends a start the run will not use: it is cancelled, and a session
// it made all the same is the run's to clean up (Engine.cleanUp).
func (s *Start) stop() {
	s.cancel()
	if sess, _, err := s.wait(); err == nil {
		s.r.sess = sess
	}
}

// Run goes on with the run once the checkout (the directory put at the
// session's work directory) and the secrets (by name, as
// Request.Secrets) are there: it waits for the session, then does all
// Engine.Run does, and returns the Result. The log is the same as
// Engine.Run's.
func (s *Start) Run(ctx context.Context, checkout string, secrets map[string]string) *Result {
	r := s.r
	r.req.Checkout, r.req.Secrets = checkout, secrets
	defer s.cancel()
	r.execute(ctx, s)
	r.finish()
	r.eng.cleanUp(ctx, r)
	return r.res
}

// Discard gives the run up before Run (the caller could not export its
// tree): the start is cancelled, and a session it made all the same is
// removed (under the engine's Cleaner, as after a run).
func (s *Start) Discard(ctx context.Context) {
	s.stop()
	s.r.res.Status = Error
	s.r.eng.cleanUp(ctx, s.r)
}

// classErr is why req may not run in the class its workflow names, or
// nil.
func (e *Engine) classErr(req Request) error {
	_, err := e.cfg.Classes.Pick(req.Workflow.Class, req.Trusted)
	return err
}
