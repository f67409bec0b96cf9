package scheduler

import (
	"context"
	"io"
	"log/slog"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
)

// task is a job in the scheduler's hands and what happens to it: its
// run, its check as last written, and how it was stopped.
type task struct {
	*job.Job
	runID  string
	check  forge.Check
	cancel context.CancelFunc
	// seen is what status shows of it (status.go).
	seen seen
	// superseded names the newer event that cancelled the run;
	// cancelled the cancel record a Cancel did it for, at cancelledAt.
	superseded, cancelled string
	cancelledAt           time.Time
	// released is set when a stopping daemon cancelled the run: its check
	// goes back to queued for the successor.
	released bool
	// fenced is set when the run's session was another process's.
	fenced bool
	// givenBack is set when the run was released at a stop: its work
	// is the successor's, its event not done here.
	givenBack bool
	// adopt is where an earlier process handed the run over, and prior
	// that process's log; nil for a run this process starts.
	adopt *run.Handover
	prior []byte
	// driverSeen is, for a run taken over from a replica that died,
	// that driver's last sign of life (zero: none known).
	driverSeen time.Time
	// hold keeps the session of the try going (with replicas) until
	// the check says how it ended (releaseSession).
	hold chan struct{}
	// unwritten: no queued record was written, as a worker was free when
	// the task came; it is claimed before any other, and its running
	// record is its check's first.
	unwritten bool
	// expected ends the expectation of its running record, written
	// soon after a worker claims it (nil: none).
	expected func()
	// live is the run's live output (Tap.Open), opened for the run
	// liveRun; nil: none.
	live    io.Writer
	liveRun string
	// try is which try of the work the run is (retry.go): 0 or 1 for
	// the first.
	try int
}

// end is how t's work ended, to write its check with (checks.End): by
// names a cancel's cause; the caller adds the run's result.
func (t *task) end(by string, log *slog.Logger) checks.End {
	return checks.End{Key: t.Key, Event: t.Event, Check: t.check, By: by, Log: log}
}

// queue is the work in hand: the tasks waiting for a worker and the
// tasks running, with the rules between them (supersede, who is claimed
// first, the release at stop, an author's load). It does no I/O, writes
// no check and takes no lock: the Scheduler's lock guards it, and the
// Scheduler does the writes its answers call for. See
// docs/design/daemon.md, "The queue".
type queue struct {
	waiting []*task
	running map[string]*task // by check key
	// reserved are check keys whose queued check is being written: in
	// hand already, so that no one queues them twice.
	reserved map[string]bool
	// draining is set when a stopping daemon claims nothing new.
	draining bool
	// paused counts the sweeps listing the sessions: nothing is claimed,
	// so no run starts a session the sweep could take for an orphan.
	paused int
	// idle are the workers waiting for a task.
	idle int
	// changed is closed and replaced when the queue changes.
	changed chan struct{}
}

func newQueue() *queue {
	return &queue{running: map[string]*task{}, reserved: map[string]bool{}, changed: make(chan struct{})}
}

// inHand reports whether the event (by key) has a task waiting or
// running.
func (q *queue) inHand(evKey string) bool {
	for _, t := range q.running {
		if t.Event.Key() == evKey {
			return true
		}
	}
	for _, t := range q.waiting {
		if t.Event.Key() == evKey {
			return true
		}
	}
	return false
}

// has reports whether a task of check key is waiting, running or being
// queued: a pull's pre-flight and the pull itself run a workflow that
// is both on: pull and queue: first under one check key, once.
func (q *queue) has(key string) bool {
	if _, ok := q.running[key]; ok || q.reserved[key] {
		return true
	}
	for _, t := range q.waiting {
		if t.Key == key {
			return true
		}
	}
	return false
}

// add puts t in the queue and applies supersede: unless t's workflow
// says its older runs finish, the older waiting tasks of t's group leave
// the queue (returned as dropped, for their cancelled checks) and the
// older running ones are marked superseded by t's event (returned as
// cancel, for the caller to cancel).
func (q *queue) add(t *task) (dropped, cancel []*task) {
	if t.Workflow.Superseded != "finish" {
		keep := q.waiting[:0]
		for _, o := range q.waiting {
			if o.Group() == t.Group() && job.Older(o.Job, t.Job) {
				dropped = append(dropped, o)
				continue
			}
			keep = append(keep, o)
		}
		clear(q.waiting[len(keep):])
		q.waiting = keep
		for _, o := range q.running {
			if o.Group() == t.Group() && job.Older(o.Job, t.Job) && o.superseded == "" {
				o.superseded = t.Event.URI.String()
				cancel = append(cancel, o)
			}
		}
	}
	d, c := q.replaceInGroup(t)
	dropped, cancel = append(dropped, d...), append(cancel, c...)
	q.waiting = append(q.waiting, t)
	q.signal()
	return dropped, cancel
}

// remove takes the waiting task of check key out of the queue.
func (q *queue) remove(key string) *task {
	for i, t := range q.waiting {
		if t.Key == key {
			q.waiting = append(q.waiting[:i:i], q.waiting[i+1:]...)
			q.signal()
			return t
		}
	}
	return nil
}

// free is how many idle workers no unwritten task waits for: a task
// that comes now is started at once by one of them (its check needs no
// queued record). None while the claiming is paused or stopped.
func (q *queue) free() int {
	if q.draining || q.paused > 0 {
		return 0
	}
	n := q.idle
	for _, t := range q.waiting {
		if t.unwritten {
			n--
		}
	}
	return max(n, 0)
}

// ahead is how many runs a job queued now waits behind: the waiting
// tasks that wait for a worker, and those being queued. A task that
// found a worker free (unwritten) is not among them: a worker takes it
// before any other, so it waits for no one, and counting it would give
// the next job the count the one after it gets once it is claimed.
func (q *queue) ahead() int {
	n := len(q.reserved)
	for _, t := range q.waiting {
		if !t.unwritten {
			n++
		}
	}
	return n
}

// claim moves the task a worker takes next (claimIndex) from waiting to
// running; nil when there is none, or the claiming is paused or
// stopped.
func (q *queue) claim() *task {
	if q.draining || q.paused > 0 || len(q.waiting) == 0 {
		return nil
	}
	i := claimIndex(q.waiting, func(t *task) bool { return q.legHeld(t) || q.groupHeld(t) || q.needsHeld(t.Job) })
	if i < 0 {
		return nil
	}
	t := q.waiting[i]
	q.waiting = append(q.waiting[:i:i], q.waiting[i+1:]...)
	q.running[t.Key] = t
	return t
}

// start puts a task that was not claimed (an adopted run) among the
// running.
func (q *queue) start(t *task) { q.running[t.Key] = t }

// end takes a task out of the running.
func (q *queue) end(t *task) { delete(q.running, t.Key) }

// drain stops the claiming: the waiting tasks are released (their
// checks stay queued, the successor's work). It returns how many were
// waiting and how many are running.
func (q *queue) drain() (released, going int) {
	q.draining = true
	released, going = len(q.waiting), len(q.running)
	q.waiting = nil
	q.signal()
	return released, going
}

// releaseRunning marks every running task released (its check goes back
// to queued when it ends cancelled) and returns how many there are.
func (q *queue) releaseRunning() int {
	for _, t := range q.running {
		t.released = true
	}
	return len(q.running)
}

// wait returns a channel closed at the next change of the queue.
func (q *queue) wait() <-chan struct{} { return q.changed }

func (q *queue) signal() {
	close(q.changed)
	q.changed = make(chan struct{})
}

// load is what author a has in hand, as the flood caps count it: its
// runs queued or running, but those ev supersedes (it takes their
// place), and the check writes they all still owe.
func (q *queue) load(a string, all bool, ev work.Event) (runs, owing int) {
	count := func(t *task, writes int) {
		if job.Author(t.Event, all) != a {
			return
		}
		owing += writes
		if !job.SupersededBy(t.Job, ev) {
			runs++
		}
	}
	for _, t := range q.waiting {
		count(t, 2) // running, final
	}
	for _, t := range q.running {
		count(t, 1) // final
	}
	return runs, owing
}

// claimIndex is the queued task a worker takes next, of those not held
// (a matrix's leg past its max-parallel; held may be nil): the first
// unwritten one (it came while a worker was free, which it was
// promised: it has no check to show it waits), else the first trusted
// one (the owner's pushes go ahead of strangers' pulls), else the
// first; -1 when every task is held.
func claimIndex(queue []*task, held func(*task) bool) int {
	ok := func(t *task) bool { return held == nil || !held(t) }
	for i, t := range queue {
		if t.unwritten && ok(t) {
			return i
		}
	}
	for i, t := range queue {
		if t.Event.Trusted && ok(t) {
			return i
		}
	}
	for i, t := range queue {
		if ok(t) {
			return i
		}
	}
	return -1
}

// expectedDone ends the expectation of t's running record, met or not.
func (t *task) expectedDone() {
	if t.expected != nil {
		t.expected()
	}
}
