package scheduler

import (
	"sort"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/rules/job"
)

// seen is what status shows of a task that the scheduler keeps for no
// other use: when it was queued (zero: adopted), when its run started,
// and the step it is at. The Scheduler's lock guards it.
type seen struct {
	queued, started time.Time
	progress        run.Progress
}

// Item is a job in hand as `knotless-run status` shows it.
type Item struct {
	Job *job.Job
	// RunID is its run's ("" while it waits, and until its run has
	// started).
	RunID string
	// Queued is when it was queued (zero for an adopted run); Started
	// when its run started (zero while it waits, or while its running
	// check is being written).
	Queued, Started time.Time
	// Adopted: an earlier process handed the run over and this one goes
	// on with it; Session is then its session (executor.Ref's string).
	Adopted bool
	Session string
	// Progress is the step the run is at (zero: none started yet).
	Progress run.Progress
}

// Work lists the jobs in hand: the running ones, oldest first, and the
// waiting ones in the order they were queued.
func (s *Scheduler) Work() (running, waiting []Item) {
	item := func(t *task) Item {
		it := Item{Job: t.Job, Queued: t.seen.queued, Started: t.seen.started, Progress: t.seen.progress}
		// A worker sets a run's id before it takes the lock to set its
		// start (start), so the id is read only after the start is; an
		// adopted run's was set before it was in hand.
		if !t.seen.started.IsZero() || t.adopt != nil {
			it.RunID = t.runID
		}
		if t.adopt != nil {
			it.Adopted, it.Session = true, t.adopt.Session.String()
		}
		return it
	}
	s.mu.Lock()
	for _, t := range s.q.running {
		running = append(running, item(t))
	}
	for _, t := range s.q.waiting {
		waiting = append(waiting, item(t))
	}
	s.mu.Unlock()
	sort.Slice(running, func(i, j int) bool {
		a, b := running[i], running[j]
		return a.Started.Before(b.Started) || a.Started.Equal(b.Started) && a.Job.Key < b.Job.Key
	})
	return running, waiting
}

// setProgress notes the step t's run is at (run.Request.Progress).
func (s *Scheduler) setProgress(t *task, p run.Progress) {
	s.mu.Lock()
	t.seen.progress = p
	s.mu.Unlock()
}
