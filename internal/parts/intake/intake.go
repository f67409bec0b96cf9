// Package intake is the daemon's intake part: from the listing of the
// watched repositories (a reconcile, at start, on every hint of the
// event streams and every poll) or from one event the lander or run
// control hands it, to the jobs it asks the scheduler for, or to an
// error check when the work cannot run. It notes the repositories seen,
// fetches and merges (reconcile.go), reads the workflows, applies the
// flood caps (caps.go), tries a commit that does not fetch again
// (fetch.go, its own lock), forgets what is past the retention
// (retention.go) and follows the event streams, keeping their cursors
// (follow.go). Run control is a part of its own (internal/parts/runctl):
// intake hands it each listing and considers the events it makes
// (control.go), within their authors' caps.
package intake

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/lib/keymu"
	"knotless.dev/run/internal/lib/onceset"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
)

// Config is the operator's part of intake.
type Config struct {
	// Poll is how often the work is listed without a hint (default 5
	// min); Firehose follows the event streams for hints.
	Poll     time.Duration
	Firehose bool
	// Caps bound floods (caps.go): the workflows one event may run, and
	// the runs and check writes of one author.
	Caps Caps
	// Retention is how long final work is remembered (default 30 days).
	Retention time.Duration
	// FetchTries is how many times an event's commit is fetched before
	// the event gets an error check instead (default 5), FetchBackoff the
	// first wait between tries (default 1 min, doubling: about 15 min in
	// all, so a source that is briefly down is not mistaken).
	FetchTries   int
	FetchBackoff time.Duration
	// Remembered bounds the workflow warnings intake remembers having
	// logged (0: onceset.DefaultMax).
	Remembered int
}

// DefaultRetention is how long final work is remembered by default.
const DefaultRetention = 30 * 24 * time.Hour

// WithDefaults is c with the defaults in its zero fields, as New takes
// it.
func (c Config) WithDefaults() Config {
	c.defaults()
	return c
}

func (c *Config) defaults() {
	if c.Poll <= 0 {
		c.Poll = 5 * time.Minute
	}
	c.Caps.defaults()
	if c.Retention <= 0 {
		c.Retention = DefaultRetention
	}
	if c.FetchTries <= 0 {
		c.FetchTries = 5
	}
	if c.FetchBackoff <= 0 {
		c.FetchBackoff = time.Minute
	}
}

// Facts are what the daemon knows and hands intake.
type Facts struct {
	// Runner is the runner's DID: workflows name the runners they allow.
	Runner syntax.DID
	// Relay, when set, is where events come from instead of the owners'
	// PDSes.
	Relay string
	// LimitsAll: the author caps count the repository owners' pushes too
	// (--limits-apply-to all).
	LimitsAll bool
	// DefaultImage is the image of a workflow that names none.
	DefaultImage string
}

// Lister lists the work (ingest.Lister) and is told of what the event
// streams saw.
type Lister interface {
	Reconcile(ctx context.Context) (*ingest.Snapshot, error)
	Changed(c ingest.Change)
}

// Scheduler takes the jobs (scheduler.Scheduler) and says what is in
// hand.
type Scheduler interface {
	Enqueue(ctx context.Context, j *job.Job) (bool, error)
	InHand(evKey string) bool
	HasCheck(key string) bool
	Load(author string, ev work.Event) (runs, owing int)
	// Elsewhere reports whether another live replica drives the run of
	// key (scheduler.Scheduler.Elsewhere).
	Elsewhere(key string) bool
	// TakeOver takes a job whose check another process of the runner
	// left running, with replicas, and says whether it is handled
	// (scheduler.Scheduler.TakeOver).
	TakeOver(ctx context.Context, j *job.Job) bool
}

// Checks is the checks part (checks.Keeper): what is final, the error
// checks of work that cannot run, and forgetting.
type Checks interface {
	Final(key string) bool
	Error(ctx context.Context, ev work.Event, wf, msg string)
	// Skipped writes the skipped check of a workflow its path filters
	// leave out.
	Skipped(ctx context.Context, ev work.Event, wf, why string)
	Forget(cutoff time.Time, need func(evKey string) bool) int
	// Refresh reads a check from the PDS unless it is known final:
	// with replicas, another process of the runner may have written it.
	Refresh(ctx context.Context, key string) error
	// Going reports whether the check of key says its run is going.
	Going(key string) bool
	// Expect says a check write made with the context returned is
	// about to come (checks.Recorder.Expect): a burst's lanes expect
	// theirs, so that the writes of the burst go as one commit.
	Expect(ctx context.Context) (_ context.Context, done func())
}

// State is intake's part of state.json (state.Store).
type State interface {
	Done(evKey string) bool
	MarkDone(evKey string) error
	NoteRepos(uris []string, history func(uri string) []string) (map[string]int, error)
	Prune(cutoff time.Time, keep func(evKey string) bool) (int, error)
	Cursor(host string) int64
	SetCursor(host string, seq int64)
	SaveCursors() error
}

// Control is run control (runctl.Part), handed each reconcile's
// listing: its cancels before the listing's events are considered, the
// rest after. Its re-runs, dispatches and ticks come back as events
// (ConsiderControl, ControlError); its next schedule tick wakes the
// reconcile loop.
type Control interface {
	Cancel(ctx context.Context, snap *ingest.Snapshot)
	Act(ctx context.Context, snap *ingest.Snapshot)
	// Next is the earliest next tick of the schedules known (zero:
	// none).
	Next() time.Time
}

// Lander is handed each reconcile's listing (lander.Lander.Offer); it
// must not block.
type Lander interface {
	Offer(snap *ingest.Snapshot)
}

// Observer is told what intake decides (metrics); nil is told nothing.
type Observer interface {
	// Reconciled: a reconcile ended, with the events listed or why not.
	Reconciled(events int, err error)
	// Deferred: an event waits for its author's caps (flag names the
	// limit); Refused: an event gets one error check instead of runs
	// (reason: the limit's flag, or "source").
	Deferred(ev work.Event, flag string)
	Refused(ev work.Event, reason string)
}

// Ports are what intake uses of the outside.
type Ports struct {
	Lister    Lister
	Mirrors   job.Mirrors
	Scheduler Scheduler
	Checks    Checks
	State     State
	// Control is run control; nil acts on no run-control record.
	Control Control
	// Lander is nil without --queue.
	Lander Lander
	// Stream follows the event stream of host from cursor
	// (ingest.Firehose).
	Stream func(host string, cursor int64) ingest.Source
	// Changed is told when a reconcile ended (STATUS=).
	Changed func()
	// CheckImage says whether the executor can find an image
	// (executor.ImageChecker); nil checks nothing (images.go).
	CheckImage func(ctx context.Context, image string) error
	Observer   Observer
	// Mine, when set, says whether an event (by its key) is this
	// replica's to take (replicas.Set.Mine, serve --replicas); the
	// others' are left to them, and their checks are read from the PDS
	// before this replica queues anything of an event. nil: every
	// event is this process's.
	Mine func(evKey string) bool
}

// Intake is the intake part.
type Intake struct {
	cfg   Config
	facts Facts
	p     Ports
	log   *slog.Logger
	wake  chan struct{} // a hint that records changed: reconcile soon

	budget *writeBudget // the authors' check writes (caps.go); its own lock
	// warned holds the workflow warnings logged once (warnUnacted);
	// bounded, its own lock. images are the images checked (images.go),
	// imagesAtStart whether the watched repositories' images were.
	warned        *onceset.Set
	images        sync.Map
	imagesAtStart atomic.Bool
	// admission serializes, per author, the caps' decision and the queueing
	// of an event's jobs: the lander considers its pre-flights beside the
	// reconcile.
	admission keymu.Map

	mu sync.Mutex
	// deferred are the events waiting for their author's caps (caps.go).
	deferred map[string]deferral
	// fetches counts failed fetches per event key (fetch.go).
	fetches map[string]*attempts
	// hosts are the PDSes of the watched repositories' owners.
	hosts []string
	// controlled are the keys of the run-control events the last
	// reconcile considered (control.go).
	controlled map[string]bool
}

// New returns intake.
func New(cfg Config, facts Facts, p Ports, log *slog.Logger) *Intake {
	cfg.defaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if p.Changed == nil {
		p.Changed = func() {}
	}
	if p.Control == nil {
		p.Control = noControl{}
	}
	return &Intake{cfg: cfg, facts: facts, p: p, log: log, wake: make(chan struct{}, 1),
		budget: newWriteBudget(cfg.Caps.CheckWritesPerAuthor, cfg.Caps.Window), warned: onceset.New(cfg.Remembered),
		deferred: map[string]deferral{}, fetches: map[string]*attempts{}, controlled: map[string]bool{}}
}

// noControl is no run control: no record is acted on, no tick is due.
type noControl struct{}

func (noControl) Cancel(context.Context, *ingest.Snapshot) {}
func (noControl) Act(context.Context, *ingest.Snapshot)    {}
func (noControl) Next() time.Time                          { return time.Time{} }
