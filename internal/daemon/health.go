package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"

	"knotless.dev/run/internal/lib/backoff"
)

// healthEvery is how often the executor's health is checked.
const healthEvery = time.Minute

// health is what the daemon knows of the executor: why it cannot take
// runs (nil: it can), and whether the start-up sweep has worked.
type health struct {
	mu    sync.Mutex
	cause error
	swept bool
}

func (h *health) err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cause
}

func (h *health) set(err error) (was error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	was, h.cause = h.cause, err
	return was
}

func (h *health) setSwept() {
	h.mu.Lock()
	h.swept = true
	h.mu.Unlock()
}

func (h *health) isSwept() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.swept
}

// degrade marks the executor unusable: the daemon starts anyway, says so
// in STATUS=, gives each run one final error check naming the cause, and
// tries the sweep again with backoff until it works.
func (d *Daemon) degrade(err error) {
	if was := d.health.set(err); was == nil {
		d.log.Error("executor degraded: runs get an error check until it recovers", "executor", d.cfg.Engine.Executor.Name(), "err", err)
	}
}

// executorDown is why runs cannot go to the executor now, or nil (the
// scheduler's Down port).
func (d *Daemon) executorDown() error {
	if err := d.health.err(); err != nil {
		return fmt.Errorf("executor %s unavailable: %w", d.cfg.Engine.Executor.Name(), err)
	}
	return nil
}

// watchExecutor tries the start-up sweep again while it has not worked,
// with backoff, and checks the executor's health on a timer when it can
// tell (executor.HealthChecker: a credential about to expire is logged
// without a run touching the cluster) until ctx ends.
func (d *Daemon) watchExecutor(ctx context.Context) {
	retry := backoff.Policy{First: d.cfg.Retry.Backoff, Max: d.cfg.Retry.MaxBackoff}
	tries := 0
	for {
		wait := healthEvery
		var err error
		if !d.health.isSwept() {
			if err = d.sched.Resweep(ctx); err == nil {
				d.health.setSwept()
			}
		}
		if err == nil && d.caps.Health != nil {
			err = d.caps.Health.Health(ctx)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			d.degrade(err)
			tries++
			wait = min(retry.After(tries), healthEvery)
		} else {
			tries = 0
			if was := d.health.set(nil); was != nil {
				d.log.Info("executor recovered", "executor", d.cfg.Engine.Executor.Name())
				d.status()
			}
		}
		if err != nil {
			d.status()
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
