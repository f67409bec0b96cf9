package scheduler

import (
	"context"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/rules/job"
)

// A matrix's legs are jobs of their own (workflow.Plan), each with its
// check; the legs of one matrix for one event share its max-parallel
// (never more of them running at once) and its fail-fast (a leg that
// fails cancels the others, queued and running).

// matrixGroup is the legs j counts with: the legs of its matrix for its
// event; "" for a job that is no leg.
func matrixGroup(j *job.Job) string {
	if j.Workflow == nil || j.Workflow.Leg == nil {
		return ""
	}
	return j.Event.Key() + "\x00" + j.Workflow.Leg.Base
}

// legHeld reports whether t, waiting, is a leg whose matrix has its
// max-parallel legs running: no worker claims it yet.
func (q *queue) legHeld(t *task) bool {
	l := t.Workflow.Leg
	if l == nil || l.MaxParallel == 0 {
		return false
	}
	g, n := matrixGroup(t.Job), 0
	for _, o := range q.running {
		if matrixGroup(o.Job) == g {
			n++
		}
	}
	return n >= l.MaxParallel
}

// legsFull reports whether j is a leg whose matrix has its max-parallel
// legs running or promised a worker (unwritten): j must wait with a
// queued check.
func (q *queue) legsFull(j *job.Job) bool {
	l := j.Workflow.Leg
	if l == nil || l.MaxParallel == 0 {
		return false
	}
	g, n := matrixGroup(j), 0
	for _, o := range q.running {
		if matrixGroup(o.Job) == g {
			n++
		}
	}
	for _, o := range q.waiting {
		if o.unwritten && matrixGroup(o.Job) == g {
			n++
		}
	}
	return n >= l.MaxParallel
}

// failFast takes the other legs of failed's matrix out: the waiting ones
// leave the queue (dropped, for their cancelled checks), the running
// ones are marked superseded by it (cancel, for the caller to cancel).
func (q *queue) failFast(failed *task, why string) (dropped, cancel []*task) {
	g := matrixGroup(failed.Job)
	keep := q.waiting[:0]
	for _, o := range q.waiting {
		if matrixGroup(o.Job) == g {
			dropped = append(dropped, o)
			continue
		}
		keep = append(keep, o)
	}
	clear(q.waiting[len(keep):])
	q.waiting = keep
	for _, o := range q.running {
		if o != failed && matrixGroup(o.Job) == g && o.superseded == "" && o.cancelled == "" {
			o.superseded = why
			cancel = append(cancel, o)
		}
	}
	if len(dropped) > 0 {
		q.signal()
	}
	return dropped, cancel
}

// legEnded is told the final status of a run: a failed leg of a
// fail-fast matrix cancels the others (their checks: cancelled,
// "superseded by" the failed leg).
func (s *Scheduler) legEnded(ctx context.Context, t *task, status string) {
	l := t.Workflow.Leg
	if l == nil || !l.FailFast || (status != string(run.Failure) && status != string(run.Error)) {
		return
	}
	why := "the failed leg " + t.Workflow.Name + " (fail-fast)"
	s.mu.Lock()
	dropped, cancel := s.q.failFast(t, why)
	for _, o := range cancel {
		o.cancel()
	}
	s.mu.Unlock()
	if len(dropped)+len(cancel) > 0 {
		s.log.Info("fail-fast: a leg failed; the other legs of its matrix are cancelled", "check", t.Key, "workflow", t.Workflow.Name,
			"queued", len(dropped), "running", len(cancel))
	}
	for _, o := range dropped {
		s.p.Checks.Superseded(ctx, o.end(why, s.log))
		s.markDoneIfIdle(o.Event)
	}
	s.p.Changed()
}
