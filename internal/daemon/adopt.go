package daemon

import (
	"context"
	"sort"
	"time"

	"knotless.dev/run/internal/executor"
)

// goner is an executor that can tell whether a handed-over session can
// still go on (kubernetes.Executor.Gone).
type goner interface {
	Gone(ctx context.Context, ref executor.Ref) (bool, error)
}

// goneProbeTimeout bounds the probe of one handed-over session.
const goneProbeTimeout = 30 * time.Second

// toAdopt returns the check keys of the runs an earlier process handed
// over whose sessions are still there. A run whose session is gone (its
// Job deleted, ended or its pod lost while no process watched) is not
// adopted: adopting it could only end in an error check. It is left to
// the sweep, which forgets it, and the reconciliation runs its work
// again under the same check key. When the executor cannot tell, or the
// probe fails, the run is adopted as before.
func (d *Daemon) toAdopt(ctx context.Context) []string {
	g, canTell := d.cfg.Executor.(goner)
	var keys []string
	for key, r := range d.st.Runs {
		if r.Handover == nil {
			continue
		}
		if canTell {
			pctx, cancel := context.WithTimeout(ctx, goneProbeTimeout)
			gone, err := g.Gone(pctx, r.Handover.Session)
			cancel()
			switch {
			case err != nil:
				d.log.Warn("cannot tell whether a handed-over session is still there; adopting it", "check", key, "run", r.RunID, "session", r.Handover.Session.String(), "err", err)
			case gone:
				d.log.Info("the session of a handed-over run is gone; its work runs again", "check", key, "run", r.RunID, "session", r.Handover.Session.String())
				continue
			}
		}
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys
}

// stopping reports whether a stopping daemon has detached its runs.
func (d *Daemon) stopping() bool {
	if d.detach == nil {
		return false
	}
	select {
	case <-d.detach:
		return true
	default:
		return false
	}
}

// claim takes the handovers of the runs this process adopts out of
// state.json before it goes on with them: a handover is good once. If
// this process dies without handing them over again (SIGKILL), the next
// one finds them as runs killed mid-run, sweeps their sessions and runs
// the work again, instead of going on from a point the run has passed
// (its steps moved on under this process; starting one of them twice
// would run it twice). A stop hands them over afresh (detachJob).
func (d *Daemon) claim(jobs []*job) error {
	if len(jobs) == 0 {
		return nil
	}
	d.mu.Lock()
	for _, j := range jobs {
		if r, ok := d.st.Runs[j.key]; ok {
			r.Handover = nil
			d.st.Runs[j.key] = r
		}
	}
	snap := d.sf.snapshot(d.st)
	d.mu.Unlock()
	return d.sf.write(snap)
}
