// Package runctl is the daemon's run-control part
// (docs/design/protocol.md, "Run control" and "Schedules"): from each
// listing intake hands it, it acts on the cancel, rerun and dispatch
// records the owners and pulls' authors write, takes up the run-control
// work an earlier process left unfinished, and runs the schedules' ticks
// due. It decides each record by the pure rules of internal/rules/control; a
// cancel goes to the scheduler, a re-run, a dispatch or a tick becomes
// an event it hands back to intake to consider like a push (the same
// caps, the same error checks). It owns what it remembers having acted
// on or refused (bounded: onceset), the count of refusals a reconcile
// logs, and the schedules read per repository with the newest tick
// queued of each workflow; the newest tick run is kept in state.json.
package runctl

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/lib/onceset"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
)

// Config is the operator's part of run control.
type Config struct {
	// Retention is how long final work is remembered: a rerun or a
	// dispatch record older than it is never acted on, its checks may be
	// forgotten (intake.Config.Retention; 0: intake.DefaultRetention's
	// 30 days).
	Retention time.Duration
	// Remembered bounds what run control remembers having logged or
	// done once (0: onceset.DefaultMax).
	Remembered int
}

// DefaultRetention is the Retention of a Config that sets none.
const DefaultRetention = 30 * 24 * time.Hour

// Scheduler says what is in hand (scheduler.Scheduler) and cancels it.
type Scheduler interface {
	HasCheck(key string) bool
	// Waiting says whether the job of check key is queued and not
	// started yet (a schedule's tick waits for its previous one).
	Waiting(key string) bool
	// CancelCheck stops the work of a check for a cancel record, in hand
	// or not (false: it is being queued; try again).
	CancelCheck(ctx context.Context, key, by string, ev work.Event, c forge.Check) bool
}

// Checks are the checks known (checks.Keeper): one by key, every
// attempt of some work, the work not final, and whether a check is.
type Checks interface {
	Get(key string) (forge.Check, bool)
	Work(s forge.Subject) []forge.Check
	Unfinished() map[string]forge.Check
	Final(key string) bool
}

// State is run control's part of state.json (state.Store): whether an
// event is done, and the newest tick of each scheduled workflow run.
type State interface {
	Done(evKey string) bool
	ScheduleLast(repo, wf string) time.Time
	SetScheduleLast(repo, wf string, t time.Time) error
	// KeepSchedules and KeepScheduleRepos forget the schedules no
	// longer scheduled, and those of repositories no longer served.
	KeepSchedules(repo string, scheduled []string) (int, error)
	KeepScheduleRepos(served []string) (int, error)
}

// Intake considers the events run control makes (intake.Intake): a
// re-run, a dispatch or a tick, like a push or a pull, within its
// author's caps; and writes, within them too, the error check of a
// record's work that cannot run.
type Intake interface {
	ConsiderControl(ctx context.Context, ev work.Event) error
	ControlError(ctx context.Context, ev work.Event, wf, msg string)
}

// Observer is told what run control decides (metrics); nil is told
// nothing.
type Observer interface {
	// TickSkipped: a schedule's tick is not run (reason, one of a few
	// words: SkipQueued).
	TickSkipped(reason string)
}

// Ports are what run control uses of the outside.
type Ports struct {
	Scheduler Scheduler
	Checks    Checks
	State     State
	// Mirrors read the default branches' heads and their workflows
	// (schedules, dispatches).
	Mirrors  job.Mirrors
	Intake   Intake
	Observer Observer
}

// Part is the run-control part.
type Part struct {
	cfg    Config
	runner string
	p      Ports
	log    *slog.Logger

	// once holds the records refused or acted on, the dispatches not
	// handled, the ticks and resumed work said; bounded, its own lock.
	once *onceset.Set
	// refusals counts the records refused this reconcile (refuseOnce).
	refusals atomic.Int64

	mu sync.Mutex
	// schedules are the scheduled workflows known by repository, and
	// queuedTicks the newest tick queued of each, by repository and
	// workflow (schedule.go).
	schedules   map[string]*repoSchedule
	queuedTicks map[string]map[string]queuedTick
	// legKeys are the check keys of the legs of the matrix workflows
	// dispatched, by dispatch record (control.go): the record's own key
	// names no check. Bounded by maxLegKeys.
	legKeys map[string][]string
}

// maxLegKeys bounds the dispatches whose leg keys are remembered; past
// it they are forgotten (each is then read from git once more).
const maxLegKeys = 10000

// New returns the run-control part of runner.
func New(cfg Config, runner syntax.DID, p Ports, log *slog.Logger) *Part {
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Part{cfg: cfg, runner: runner.String(), p: p, log: log, once: onceset.New(cfg.Remembered),
		schedules: map[string]*repoSchedule{}, queuedTicks: map[string]map[string]queuedTick{}, legKeys: map[string][]string{}}
}

// Cancel acts on the listing's cancel records. Intake calls it before
// it considers the listing's events, so that a check an earlier process
// left queued, and now cancelled, is not queued again.
func (p *Part) Cancel(ctx context.Context, snap *ingest.Snapshot) {
	p.cancels(ctx, snap)
}

// Act acts on the rest of the listing, after intake considered its
// events: the rerun and dispatch records, the run-control work an
// earlier process left unfinished, and the schedules' ticks due; then
// it says how many refusals it did not log one by one.
func (p *Part) Act(ctx context.Context, snap *ingest.Snapshot) {
	p.reruns(ctx, snap)
	p.dispatches(ctx, snap)
	p.resume(ctx, snap)
	p.runSchedules(ctx, snap)
	p.sayRefusals()
}

// Next is the earliest next tick of the schedules known (zero: none):
// intake's reconcile loop wakes then.
func (p *Part) Next() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var next time.Time
	for _, m := range p.schedules {
		if !m.next.IsZero() && (next.IsZero() || m.next.Before(next)) {
			next = m.next
		}
	}
	return next
}
