package scheduler

import (
	"context"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/rules/work"
)

// CancelCheck stops the work of check key for the cancel record by (run
// control), whether or not it is in hand: in hand, as Cancel does; not
// in hand (a check an earlier process left queued or running, not
// taken up again yet), c, its check as known, of event ev, is written
// cancelled here, while no job of key can be queued. It reports false
// when the work is being queued at that moment: the caller tries again
// at its next reconcile. The transition table keeps a check that is
// final already as it is, so of a cancel and a run's end one final
// check is written, whichever comes first. A replica does not write a
// check another process left running: only a run's driver writes its
// check, and the driver (or the survivor that takes the run over)
// stops the run when it sees the same record; false then too.
func (s *Scheduler) CancelCheck(ctx context.Context, key, by string, ev work.Event, c forge.Check) bool {
	s.mu.Lock()
	if s.q.has(key) {
		s.mu.Unlock()
		return s.Cancel(ctx, key, by)
	}
	if s.p.Drivers != nil && checks.Status(c.Status) == checks.Running {
		s.mu.Unlock()
		return false
	}
	s.q.reserved[key] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.q.reserved, key)
		s.mu.Unlock()
	}()
	s.p.Checks.Cancelled(ctx, checks.End{Key: key, Event: ev, Check: c, By: by, Log: s.log})
	s.markDoneIfIdle(ev)
	return true
}
