package scheduler

import (
	"knotless.dev/run/internal/rules/job"
)

// A workflow's concurrency group (workflow.Concurrency): at most one
// run of the group runs at a time on the runner, within its repository;
// a newer run of the group replaces the one still waiting; with
// cancel-in-progress it cancels the running one too.

// concurrencyGroup is the group j counts in: its repository and its
// workflow's group for its event; "" for a workflow with none.
func concurrencyGroup(j *job.Job) string {
	if j.Workflow == nil {
		return ""
	}
	g := j.Workflow.GroupOf(j.Event.CondEvent())
	if g == "" {
		return ""
	}
	return j.Event.Repo.URI.String() + "\x00" + g
}

// groupBusy reports whether a run of j's concurrency group runs, or is
// promised a worker (unwritten): j must wait with a queued check.
func (q *queue) groupBusy(j *job.Job) bool {
	g := concurrencyGroup(j)
	if g == "" {
		return false
	}
	for _, o := range q.running {
		if concurrencyGroup(o.Job) == g {
			return true
		}
	}
	for _, o := range q.waiting {
		if o.unwritten && concurrencyGroup(o.Job) == g {
			return true
		}
	}
	return false
}

// groupHeld reports whether t, waiting, belongs to a concurrency group
// that has a run going: no worker claims it yet.
func (q *queue) groupHeld(t *task) bool {
	g := concurrencyGroup(t.Job)
	if g == "" {
		return false
	}
	for _, o := range q.running {
		if concurrencyGroup(o.Job) == g {
			return true
		}
	}
	return false
}

// replaceInGroup applies t's concurrency group as t joins the queue:
// the older waiting runs of the group leave it (dropped, for their
// cancelled checks), and with cancel-in-progress the older running
// ones are marked superseded by t's event (cancel, for the caller).
func (q *queue) replaceInGroup(t *task) (dropped, cancel []*task) {
	g := concurrencyGroup(t.Job)
	if g == "" {
		return nil, nil
	}
	keep := q.waiting[:0]
	for _, o := range q.waiting {
		if concurrencyGroup(o.Job) == g && job.Older(o.Job, t.Job) {
			dropped = append(dropped, o)
			continue
		}
		keep = append(keep, o)
	}
	clear(q.waiting[len(keep):])
	q.waiting = keep
	if !t.Workflow.Concurrency.CancelInProgress {
		return dropped, nil
	}
	for _, o := range q.running {
		if concurrencyGroup(o.Job) == g && job.Older(o.Job, t.Job) && o.superseded == "" && o.cancelled == "" {
			o.superseded = t.Event.URI.String()
			cancel = append(cancel, o)
		}
	}
	return dropped, cancel
}
