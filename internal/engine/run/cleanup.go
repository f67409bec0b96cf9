package run

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"knotless.dev/run/internal/executor"
)

// Cleaner owns the clean-ups of the sessions of runs that have ended: a
// session's Stop (on Kubernetes, deleting the Job and waiting until its
// pod is gone) goes on in a goroutine of the Cleaner's after Run has
// returned the run's Result, so the verdict does not wait for it. Each
// clean-up is bounded by the engine's CleanupTimeout; one that fails is
// logged and counted, and what it left is for the executor's next Sweep
// (every session of the runner whose run is not going). A clean-up never
// changes the Result.
//
// The Cleaner's owner calls Wait before it exits (a daemon at shutdown,
// `knotless-run run` before it returns), so every clean-up goroutine has
// an owner that waits for it.
type Cleaner struct {
	log *slog.Logger
	// base is every clean-up's lifetime: Wait ends it when its own
	// context ends first.
	base    context.Context //nolint:containedctx // the clean-ups' lifetime, owned by the Cleaner
	cutOff  context.CancelFunc
	mu      sync.Mutex
	going   int
	idle    chan struct{} // closed when going falls to zero
	failed  atomic.Int64
	handled atomic.Int64
}

// NewCleaner returns a Cleaner that logs to log.
func NewCleaner(log *slog.Logger) *Cleaner {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	base, cutOff := context.WithCancel(context.Background())
	idle := make(chan struct{})
	close(idle)
	return &Cleaner{log: log, base: base, cutOff: cutOff, idle: idle}
}

// Failures is how many clean-ups failed since the Cleaner was made.
func (c *Cleaner) Failures() int64 { return c.failed.Load() }

// Done is how many clean-ups ended, failed or not.
func (c *Cleaner) Done() int64 { return c.handled.Load() }

// Wait waits until every clean-up handed to the Cleaner so far has
// ended. When ctx ends first it cuts the ones still going short (their
// contexts end), waits for them to return, and says how many it cut;
// what they leave is for the next Sweep. Clean-ups handed over after a
// cut start with their context ended.
func (c *Cleaner) Wait(ctx context.Context) error {
	for {
		c.mu.Lock()
		idle, going := c.idle, c.going
		c.mu.Unlock()
		if going == 0 {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			c.cutOff()
			<-idle
			return fmt.Errorf("wait for session clean-ups: %d cut short, left to the next sweep: %w", going, ctx.Err())
		}
	}
}

// stop stops sess in a goroutine of the Cleaner's, bounded by timeout.
// ctx is the run's: its values are kept, not its end.
func (c *Cleaner) stop(ctx context.Context, sess executor.Session, stop func(context.Context, executor.Session) error) {
	c.mu.Lock()
	if c.going == 0 {
		c.idle = make(chan struct{})
	}
	c.going++
	c.mu.Unlock()
	go func() {
		defer c.done()
		ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		defer context.AfterFunc(c.base, cancel)()
		if err := stop(ctx, sess); err != nil {
			c.failed.Add(1)
		}
	}()
}

func (c *Cleaner) done() {
	c.handled.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.going--
	if c.going == 0 {
		close(c.idle)
	}
}

// cleanUp stops the run's session once its result is complete: under
// the Cleaner when the engine has one, else before Run returns. Either
// way a session that cannot be stopped is logged and leaves the result
// as it is: the verdict is the work's, and what the clean-up left is
// for the next sweep. A detached run's session goes on for its
// successor.
func (e *Engine) cleanUp(ctx context.Context, r *runState) {
	sess := r.sess
	if sess == nil || r.res.Status == Detached {
		return
	}
	log, keep, timeout, hold := r.log, r.req.Keep, e.cfg.CleanupTimeout, r.req.HoldSession
	stop := func(ctx context.Context, sess executor.Session) error {
		if hold != nil {
			select {
			case <-hold:
			case <-ctx.Done():
				log.Warn("session held for the run's final check, and the runner stops first: the next sweep removes it", "session", sess.Ref().String())
				return ctx.Err()
			}
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := sess.Stop(ctx); err != nil {
			log.Error("stop session: the verdict stands; the next sweep removes what is left", "session", sess.Ref().String(), "err", err)
			return err
		}
		if keep {
			log.Info("session kept", "session", sess.Ref().String())
		} else {
			log.Info("session stopped", "session", sess.Ref().String())
		}
		return nil
	}
	if e.cfg.Cleaner == nil {
		hold = nil // Run has not returned: nothing can close it yet
		_ = stop(context.WithoutCancel(ctx), sess)
		return
	}
	e.cfg.Cleaner.stop(ctx, sess, stop)
}
