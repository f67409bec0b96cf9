package daemon

import (
	"context"
	"fmt"
	"time"

	"knotless.dev/run/internal/readiness"
)

// healthChecker is an executor that can tell whether it can take runs
// (Kubernetes: credentials valid, API server answering).
type healthChecker interface {
	Health(ctx context.Context) error
}

// healthEvery is how often the executor's health is checked.
const healthEvery = time.Minute

// degrade marks the executor unusable: the daemon starts anyway, says so
// in STATUS=, gives each run one final error check naming the cause, and
// tries the sweep again with backoff until it works.
func (d *Daemon) degrade(err error) {
	d.mu.Lock()
	was := d.faults.executorErr
	d.faults.executorErr = err
	d.mu.Unlock()
	if was == nil {
		d.log.Error("executor degraded: runs get an error check until it recovers", "executor", d.cfg.Executor.Name(), "err", err)
	}
}

// executorDown is why runs cannot go to the executor now, or nil.
func (d *Daemon) executorDown() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.faults.executorErr == nil {
		return nil
	}
	return fmt.Errorf("executor %s unavailable: %w", d.cfg.Executor.Name(), d.faults.executorErr)
}

// degradedStatus is the part of STATUS= about the executor.
func (d *Daemon) degradedStatusLocked() string {
	if d.faults.executorErr == nil {
		return ""
	}
	return "; " + readiness.DegradedMark + ": " + d.faults.executorErr.Error()
}

// watchExecutor tries the start-up sweep again while it has not worked,
// with backoff, and checks the executor's health on a timer (so a
// credential about to expire is logged without a run touching the
// cluster) until ctx ends.
func (d *Daemon) watchExecutor(ctx context.Context) {
	hc, _ := d.cfg.Executor.(healthChecker)
	tries := 0
	for {
		wait := healthEvery
		d.mu.Lock()
		swept := d.faults.swept
		d.mu.Unlock()
		var err error
		if !swept {
			if err = d.resweep(ctx); err == nil {
				d.mu.Lock()
				d.faults.swept = true
				d.mu.Unlock()
			}
		}
		if err == nil && hc != nil {
			err = hc.Health(ctx)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			d.degrade(err)
			tries++
			wait = min(d.cfg.Retry.wait(tries), healthEvery)
		} else {
			tries = 0
			d.mu.Lock()
			was := d.faults.executorErr
			d.faults.executorErr = nil
			d.mu.Unlock()
			if was != nil {
				d.log.Info("executor recovered", "executor", d.cfg.Executor.Name())
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

// resweep is the start-up sweep tried again later: it keeps the sessions
// of every run this process holds, and leaves state.json alone.
func (d *Daemon) resweep(ctx context.Context) error {
	d.mu.Lock()
	var keep []string
	for _, r := range d.st.Runs {
		keep = append(keep, r.RunID)
	}
	d.mu.Unlock()
	removed, err := d.cfg.Executor.Sweep(ctx, keep)
	if err != nil {
		return fmt.Errorf("sweep orphaned sessions: %w", err)
	}
	for _, r := range removed {
		d.log.Info("swept orphaned session", "session", r.String())
	}
	return nil
}
