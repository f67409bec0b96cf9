package daemon

import "context"

// queue is the work in hand: the jobs waiting for a worker and the jobs
// running, with the rules between them (supersede, the author cap, who
// is claimed first, the release at stop). It does no I/O, writes no
// check and takes no lock: the Daemon's mutex guards it, and the Daemon
// does the writes its answers call for. See docs/design/daemon.md, "The
// queue".
type queue struct {
	waiting []*job
	running map[string]*job // by check key
	// draining is set when a stopping daemon claims nothing new.
	draining bool
	// deferred are the events waiting for their author's caps: the
	// limit each waits for (logged once per limit) and what it needs,
	// once its workflows were read (so the next look needs no fetch).
	deferred map[string]deferral
	// changed is closed and replaced when the queue changes.
	changed chan struct{}
}

func newQueue() *queue {
	return &queue{running: map[string]*job{}, deferred: map[string]deferral{}, changed: make(chan struct{})}
}

// inHand reports whether the event (by key) has a job waiting or
// running.
func (q *queue) inHand(evKey string) bool {
	for _, j := range q.running {
		if j.ev.Key() == evKey {
			return true
		}
	}
	for _, j := range q.waiting {
		if j.ev.Key() == evKey {
			return true
		}
	}
	return false
}

// jobs lists the jobs running and waiting.
func (q *queue) jobs() []*job {
	jobs := make([]*job, 0, len(q.running)+len(q.waiting))
	for _, j := range q.running {
		jobs = append(jobs, j)
	}
	return append(jobs, q.waiting...)
}

// deferral is an event waiting for its author's caps.
type deferral struct {
	flag string
	need need
}

// hold remembers whether an event waits for its author's caps (d is
// the caps' decision) and, when it does, what it needs (n, when known;
// else what was known before): first is true the first time it waits
// for d's limit, so that it is logged once.
func (q *queue) hold(evKey string, d decision, n need) (first bool) {
	if d.verdict != wait {
		delete(q.deferred, evKey)
		return false
	}
	prev, was := q.deferred[evKey]
	if !n.known {
		n = prev.need
	}
	q.deferred[evKey] = deferral{flag: d.flag, need: n}
	return !was || prev.flag != d.flag
}

// need is what a waiting event needs, as known when it was deferred.
func (q *queue) need(evKey string) need { return q.deferred[evKey].need }

// forgetDeferred drops the waiting events for which gone is true (no
// longer listed), so that memory follows the listing.
func (q *queue) forgetDeferred(gone func(evKey string) bool) {
	for k := range q.deferred {
		if gone(k) {
			delete(q.deferred, k)
		}
	}
}

// add puts j in the queue and applies supersede: unless j's workflow
// says its older runs finish, the older waiting jobs of j's group leave
// the queue (returned as dropped, for their cancelled checks) and the
// older running ones are marked superseded by j's event (returned as
// cancel, for the caller to cancel).
func (q *queue) add(j *job) (dropped, cancel []*job) {
	if j.wf.Superseded != "finish" {
		keep := q.waiting[:0]
		for _, o := range q.waiting {
			if o.group() == j.group() && older(o, j) {
				dropped = append(dropped, o)
				continue
			}
			keep = append(keep, o)
		}
		clear(q.waiting[len(keep):])
		q.waiting = keep
		for _, o := range q.running {
			if o.group() == j.group() && older(o, j) && o.superseded == "" {
				o.superseded = j.ev.URI.String()
				cancel = append(cancel, o)
			}
		}
	}
	q.waiting = append(q.waiting, j)
	q.signal()
	return dropped, cancel
}

// claim moves the job a worker takes next (claimIndex) from waiting to
// running; nil when there is none or the daemon is stopping.
func (q *queue) claim() *job {
	if q.draining || len(q.waiting) == 0 {
		return nil
	}
	i := claimIndex(q.waiting)
	j := q.waiting[i]
	q.waiting = append(q.waiting[:i:i], q.waiting[i+1:]...)
	q.running[j.key] = j
	return j
}

// start puts a job that was not claimed (an adopted run) among the
// running.
func (q *queue) start(j *job) { q.running[j.key] = j }

// end takes a job out of the running.
func (q *queue) end(j *job) { delete(q.running, j.key) }

// drain stops the claiming: the waiting jobs are released (their checks
// stay queued, the successor's work). It returns how many were waiting
// and how many are running.
func (q *queue) drain() (released, going int) {
	q.draining = true
	released, going = len(q.waiting), len(q.running)
	q.waiting = nil
	q.signal()
	return released, going
}

// releaseRunning marks every running job released (its check goes back
// to queued when it ends cancelled) and returns how many there are.
func (q *queue) releaseRunning() int {
	for _, j := range q.running {
		j.released = true
	}
	return len(q.running)
}

// wait returns a channel closed at the next change of the queue.
func (q *queue) wait() <-chan struct{} { return q.changed }

func (q *queue) signal() {
	close(q.changed)
	q.changed = make(chan struct{})
}

// claimCtx is the context a claimed job runs under.
func claimCtx(runCtx context.Context, j *job) context.Context {
	jctx, cancel := context.WithCancel(runCtx)
	j.cancel = cancel
	return jctx
}
