// Package scheduler is the daemon's scheduler part: the queue of work
// in hand (queue.go: supersede, pushes first, an author's load, the
// release at stop; pure) and the workers, which take a job from its
// queued check to its end (worker.go): the run on the engine, its
// running and final checks, its record in state.json, the detach of a
// stopping daemon; and the adoption of a predecessor's runs (adopt.go).
// Its lock guards the queue only; it reaches everything else through
// its ports.
package scheduler

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
)

// Config is the operator's part of the scheduler.
type Config struct {
	// Concurrency is how many runs go at once (at least 1); more wait as
	// queued checks.
	Concurrency int
	// Secrets are the operator's secrets, each with the repositories
	// (and optionally workflows and refs) it is for; one that applies to
	// a run takes precedence over a sealed record of the same name.
	Secrets []OperatorSecret
}

// Facts are what the daemon learned at start and hands the scheduler.
type Facts struct {
	// Runner is the runner's DID: sealed secrets are opened for it.
	Runner syntax.DID
	// Executor is what the executor can do beyond the core, asked once
	// (executor.CapabilitiesOf); ExecutorName is its name, as a
	// session's Ref names it.
	Executor     executor.Capabilities
	ExecutorName string
	// RunsDir holds a directory per run: its checkout, its outputs and,
	// for a detached run, its log so far.
	RunsDir string
	// LimitsAll: the author caps count the repository owners' pushes too
	// (--limits-apply-to all).
	LimitsAll bool
}

// Engine runs workflows (run.Engine): Begin starts a run's session,
// and its Start.Run goes on once the checkout and the secrets are there.
type Engine interface {
	Begin(ctx context.Context, req run.Request) *run.Start
	Adopt(ctx context.Context, req run.Request, h run.Handover, prior []byte) *run.Result
}

// Checks is the checks part (checks.Keeper): every check the scheduler
// causes is written there.
type Checks interface {
	Queued(ctx context.Context, key string, ev work.Event, wf string, behind int, waits string) (forge.Check, error)
	Unqueued(key string, ev work.Event, wf string) (forge.Check, bool)
	// ExpectWrite says the check of key is about to be written: the
	// check writes queued meanwhile wait for it (a little), to go with
	// it in one commit (checks.Recorder.ExpectWrite).
	ExpectWrite(key string) (done func())
	Running(ctx context.Context, key string, c forge.Check, started time.Time, log *slog.Logger) forge.Check
	// Finished, Superseded, Cancelled and Released write how some work
	// ended (checks.End): its final check, or (Released) its check
	// queued again for a successor.
	Finished(ctx context.Context, e checks.End) forge.Check
	Superseded(ctx context.Context, e checks.End) forge.Check
	Cancelled(ctx context.Context, e checks.End) forge.Check
	Released(ctx context.Context, e checks.End)
	Pending(ev work.Event) bool
	// Final reports whether the check of key is known final (written,
	// or owed to the PDS).
	Final(key string) bool
	// Refresh reads the check of key from the PDS unless it is known
	// final: with replicas, another may have written it.
	Refresh(ctx context.Context, key string) error
	// Get is the check of key as last written (or owed); Skipped writes
	// the final skipped check of work that does not run (needs.go).
	Get(key string) (forge.Check, bool)
	Skipped(ctx context.Context, ev work.Event, wf, why string)
	// Requeued writes the check of key, which says running, queued
	// again (why), now or not at all: with replicas, its dead driver
	// had started no step.
	Requeued(ctx context.Context, key, why string) error
}

// State is the scheduler's part of state.json (state.Store): the going
// runs, and the events done.
type State interface {
	Run(key string) (state.Run, bool)
	Runs() map[string]state.Run
	RunIDs() []string
	StartRun(key string, r state.Run) error
	DetachRun(key string, h *run.Handover) error
	EndRun(key string) error
	ClaimHandovers(keys []string) error
	KeepRuns(keys []string) (int, error)
	MarkDone(evKey string) error
}

// Sealed lists a repository owner's sealed secret records.
type Sealed interface {
	Secrets(ctx context.Context, owner syntax.DID) ([]forge.Record[forge.Secret], []forge.Invalid, error)
}

// Opener opens a sealed secret for a repository and runner
// (forge.KeyPair).
type Opener interface {
	OpenSecret(s forge.Secret, repo, runner string) ([]byte, error)
}

// Sweeper removes the sessions no run owns (executor.Executor).
type Sweeper interface {
	Sweep(ctx context.Context, keep []string) ([]executor.Ref, error)
}

// Observer is told what happens to jobs (metrics); every method is
// optional: a nil Observer is told nothing.
type Observer interface {
	// Queued: a job is in the queue; Started: its run started, queued
	// since queued (or an adopted one goes on: queued is zero); Ended:
	// its run ended, with its result.
	Queued(j *job.Job)
	Started(j *job.Job, runID string, queued time.Time)
	Ended(j *job.Job, res *run.Result)
	// Retried: its run is tried again by its workflow's retry (retry.go),
	// for reason "infrastructure" (the run was lost to it) or "failure"
	// (it ended failure or error, and the workflow retries when: always).
	Retried(j *job.Job, reason string)
	// Inherited: at start, what was done with a run an earlier process
	// left going: "handover", "checkpoint", "ended" or "again"
	// (metrics.InheritedHows).
	Inherited(how string)
	// TakenOver: a run an earlier process left going goes on here
	// (adopted at its handover or from its checkpoint), after since
	// this process's scheduler was made.
	TakenOver(after time.Duration)
}

// Tap is live output (tap.go): it gives each run a writer of its live,
// masked log (run.Request.Live) and is told of the run's end. A nil Tap,
// or a nil writer, taps nothing.
type Tap interface {
	// Open is asked before a run starts, before its running check is
	// written (prior and h nil), or before an adopted run goes on: prior
	// is the log an earlier process handed over, h its handover (the
	// stream goes on at h.LogSize with no byte twice).
	Open(j *job.Job, runID string, prior []byte, h *run.Handover) io.Writer
	// Ended is told the result of a run that ended here, its outputs in
	// outDir, before its final check is written and outDir removed. A
	// run handed over (it goes on in a successor) or released (a
	// successor runs its work anew) does not end here: it is not told.
	Ended(j *job.Job, runID string, res *run.Result, outDir string)
}

// Ports are what the scheduler uses of the outside.
type Ports struct {
	Engine  Engine
	Checks  Checks
	State   State
	Mirrors job.Mirrors // a handed-over run's workflow is read again from its mirror
	Sealed  Sealed
	Key     Opener
	Sweeper Sweeper
	// Down is why the executor cannot take runs now (nil: it can).
	Down func() error
	// Wake asks intake for a reconcile soon: a slot of an author's cap
	// is free (a deferred event may go, the lander may go on).
	Wake func()
	// Changed is told when the work in hand changed (STATUS=).
	Changed func()
	// StopForeign stops a session an earlier process handed over on
	// another executor than this one (the operator changed --executor),
	// which this one cannot adopt, and returns once it is gone; nil, or
	// an error, when this process cannot reach that executor.
	StopForeign func(ctx context.Context, ref executor.Ref) error
	// Drivers, with replicas (serve --replicas), keeps each run's
	// checkpoint beside its session and lets a replica take the run of
	// one that died (checkpoint.go); nil: one process.
	Drivers Drivers
	// Observer and Tap may be nil.
	Observer Observer
	Tap      Tap
}

// Drivers is the cluster's record of the runs of the runner's replicas
// (replicas.Runs).
type Drivers interface {
	// Save keeps run runID's checkpoint (checkpointFile's bytes) beside
	// its session.
	Save(ctx context.Context, runID string, checkpoint []byte) error
	// Claim takes run runID, whose session exists, when its driver is
	// gone (or an earlier process of this replica): claimed is false
	// while its driver lives. Claimed, checkpoint is where the run
	// stands, or nil when its driver recorded none (no step had
	// started): the run starts again (startAgain).
	// lastSeen is the dead driver's last sign of life (its Lease's last
	// renewal; zero: unknown), which the takeover's time counts from.
	Claim(ctx context.Context, runID string) (checkpoint []byte, claimed bool, lastSeen time.Time, err error)
	// Drop deletes the session of run runID, claimed with no
	// checkpoint, once its check is queued again (startAgain).
	Drop(ctx context.Context, runID string) error
	// Forget is told that run runID ended here.
	Forget(runID string)
}

// Scheduler is the scheduler part.
type Scheduler struct {
	// born is when the scheduler was made: a takeover's start.
	born  time.Time
	cfg   Config
	facts Facts
	p     Ports
	log   *slog.Logger
	// detach is closed on SIGTERM to hand started runs over; nil when the
	// executor cannot resume sessions (they then finish within the stop
	// wait).
	detach chan struct{}

	mu sync.Mutex
	q  *queue
	// adopted are the runs an earlier process handed over, taken up
	// before READY=1 (Adopt) and started by Start.
	adopted  []*task
	detached int // runs handed over by detaching
	// elsewhere are the check keys whose runs other live replicas
	// drive, by when that was seen (HasCheck).
	elsewhere map[string]time.Time
	// runCtx and workers are Start's: what a run taken over later
	// (TakeOver) goes under, and the wait for it.
	runCtx  context.Context
	workers *sync.WaitGroup
}

// New returns a scheduler with an empty queue.
func New(cfg Config, facts Facts, p Ports, log *slog.Logger) *Scheduler {
	if cfg.Concurrency < 1 {
		cfg.Concurrency = 1
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, f := range []*func(){&p.Wake, &p.Changed} {
		if *f == nil {
			*f = func() {}
		}
	}
	if p.Down == nil {
		p.Down = func() error { return nil }
	}
	s := &Scheduler{cfg: cfg, facts: facts, p: p, log: log, q: newQueue(), born: time.Now()}
	if facts.Executor.Detaches() {
		s.detach = make(chan struct{})
	}
	return s
}

// Cancel stops the job of check key for the cancel record by (its
// AT-URI): a waiting one leaves the queue, a running one is cancelled;
// either's check ends cancelled naming the record (Keeper.Cancelled). A
// run that ends before its cancel takes effect keeps its result: one
// final check, whichever came first. It reports whether a job of key
// was in hand (CancelCheck also cancels work not in hand).
func (s *Scheduler) Cancel(ctx context.Context, key, by string) bool {
	s.mu.Lock()
	if t, ok := s.q.running[key]; ok {
		if t.cancelled == "" && t.superseded == "" {
			t.cancelled, t.cancelledAt = by, time.Now()
			t.cancel()
		}
		s.mu.Unlock()
		return true
	}
	t := s.q.remove(key)
	s.mu.Unlock()
	if t == nil {
		return false
	}
	s.p.Checks.Cancelled(ctx, t.end(by, s.log))
	s.markDoneIfIdle(t.Event)
	s.p.Changed()
	return true
}

// InHand reports whether the event (by key) has a job waiting or
// running.
func (s *Scheduler) InHand(evKey string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.q.inHand(evKey)
}

// HasCheck reports whether a job of check key is waiting or running.
func (s *Scheduler) HasCheck(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.q.has(key)
}

// Elsewhere reports whether key's run was seen driven by another live
// replica a moment ago (its start here was fenced): it is left alone
// until elsewhereHold has passed or the live replicas changed.
func (s *Scheduler) Elsewhere(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.elsewhere[key]
	if ok && time.Since(at) >= elsewhereHold {
		delete(s.elsewhere, key)
		return false
	}
	return ok
}

// elsewhereHold is how long a replica leaves alone the work whose run
// another live replica drives (its start was fenced and the driver
// lives), unless the live replicas change first (ReplicasChanged).
const elsewhereHold = 30 * time.Second

// drivenElsewhere notes that key's run is another live replica's.
func (s *Scheduler) drivenElsewhere(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.elsewhere == nil {
		s.elsewhere = map[string]time.Time{}
	}
	s.elsewhere[key] = time.Now()
}

// ReplicasChanged is told that the runner's live replicas changed: the
// work another replica drove is looked at again at once (its driver
// may be the one gone).
func (s *Scheduler) ReplicasChanged() {
	s.mu.Lock()
	clear(s.elsewhere)
	s.mu.Unlock()
}

// Load is what author a has in hand, as the flood caps count it: its
// runs queued or running (but those ev supersedes) and the check writes
// they still owe (2 a queued run, 1 a running one).
func (s *Scheduler) Load(a string, ev work.Event) (runs, owing int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.q.load(a, s.facts.LimitsAll, ev)
}

// Counts are the runs going and waiting, and whether the scheduler is
// draining (a stopping daemon claims nothing new).
func (s *Scheduler) Counts() (running, queued int, draining bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.q.running), len(s.q.waiting), s.q.draining
}

// Drain stops the claiming at SIGTERM: the waiting jobs are released
// (their checks stay queued: the successor's work), and started runs
// are detached for the successor to adopt when the executor resumes
// sessions. It returns how many were waiting and how many are running.
func (s *Scheduler) Drain() (released, going int) {
	s.mu.Lock()
	released, going = s.q.drain()
	s.mu.Unlock()
	if s.detach != nil {
		close(s.detach)
	}
	return released, going
}

// ReleaseRunning marks the runs still going released (the stop wait is
// over: they are cancelled, their checks back to queued) and returns how
// many there are.
func (s *Scheduler) ReleaseRunning() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.q.releaseRunning()
}

// Detached is how many runs were handed over by detaching.
func (s *Scheduler) Detached() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.detached
}

// stopping reports whether a stopping daemon has detached its runs.
func (s *Scheduler) stopping() bool {
	if s.detach == nil {
		return false
	}
	select {
	case <-s.detach:
		return true
	default:
		return false
	}
}

// runDir is the directory of run id.
func (s *Scheduler) runDir(runID string) string { return filepath.Join(s.facts.RunsDir, runID) }
