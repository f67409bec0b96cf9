package runctl

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/lib/backoff"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/parts/intake"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/parts/scheduler"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
)

// world is run control on the rig with its real neighbours: intake
// (which hands it the listings and considers the events it makes), a
// real checks.Keeper writing to the rig's PDS, a real state.Store, and
// a real scheduler whose workers do not run, so what is queued stays
// queued (and counts for the caps).
type world struct {
	in     *intake.Intake
	rc     *Part
	pds    *rig.PDS
	keeper *checks.Keeper
	store  *state.Store
	sched  *scheduler.Scheduler
	lister *rig.Lister
	git    *rig.Mirrors
	cfg    intake.Config
	// What join puts in front of the parts, when set: a scheduler (a
	// spy of sched), a lister (of lister), an observer of both, a log.
	scheduler parts
	listing   intake.Lister
	observer  *observed
	log       *slog.Logger
}

// parts is what intake and run control take of the scheduler.
type parts interface {
	intake.Scheduler
	Scheduler
}

func newWorld(t *testing.T) *world {
	t.Helper()
	store, err := state.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w := &world{pds: &rig.PDS{}, store: store, lister: &rig.Lister{}, git: &rig.Mirrors{}}
	w.build(t)
	return w
}

// build makes the parts from w's config and fakes: a new checks part
// and scheduler, then intake and run control joined (join).
func (w *world) build(t *testing.T) {
	t.Helper()
	w.keeper = checks.NewKeeper(checks.NewRecorder(w.pds, func(key string, c forge.Check) {
		if w.in != nil {
			w.in.NoteCheck(key, c)
		}
	}), checks.Ports{Blobs: &rig.Blobs{}, Outbox: w.store}, backoff.Policy{First: 2e9, Max: 300e9}, nil)
	ex := &fakeexec.Executor{}
	w.sched = scheduler.New(scheduler.Config{}, scheduler.Facts{Runner: rig.Runner, Executor: executor.CapabilitiesOf(ex), RunsDir: t.TempDir()},
		scheduler.Ports{Engine: run.New(run.Config{Executor: ex}), Checks: w.keeper, State: w.store, Mirrors: w.git, Sweeper: ex}, nil)
	w.scheduler = nil
	w.join()
}

// join makes intake and run control anew on w's checks part and
// scheduler, as the daemon wires them.
func (w *world) join() {
	var sched parts = w.sched
	if w.scheduler != nil {
		sched = w.scheduler
	}
	var lister intake.Lister = w.lister
	if w.listing != nil {
		lister = w.listing
	}
	ip := intake.Ports{Lister: lister, Mirrors: w.git, Scheduler: sched, Checks: w.keeper, State: w.store}
	rp := Ports{Scheduler: sched, Checks: w.keeper, State: w.store, Mirrors: w.git}
	if w.observer != nil {
		ip.Observer, rp.Observer = w.observer, w.observer
	}
	w.rc = New(Config{Retention: w.cfg.WithDefaults().Retention, Remembered: w.cfg.Remembered}, rig.Runner, rp, w.log)
	ip.Control = w.rc
	w.in = intake.New(w.cfg, intake.Facts{Runner: rig.Runner}, ip, w.log)
	w.rc.p.Intake = w.in
}

// reconcile runs one reconcile and fails the test on an error.
func (w *world) reconcile(t *testing.T) {
	t.Helper()
	if err := w.in.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
}

const stranger = "did:plc:stranger"

// spy is the real scheduler, keeping the jobs queued.
type spy struct {
	*scheduler.Scheduler
	mu   sync.Mutex
	jobs []*job.Job
}

func (s *spy) Enqueue(ctx context.Context, j *job.Job) (bool, error) {
	ok, err := s.Scheduler.Enqueue(ctx, j)
	if ok {
		s.mu.Lock()
		s.jobs = append(s.jobs, j)
		s.mu.Unlock()
	}
	return ok, err
}

func (s *spy) job(key string) *job.Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, j := range s.jobs {
		if j.Key == key {
			return j
		}
	}
	return nil
}

// spied joins w's parts anew on a spy of its scheduler.
func (w *world) spied() *spy {
	s := &spy{Scheduler: w.sched}
	w.scheduler = s
	w.join()
	return s
}

// finish makes the check of key known final as status (a run ended):
// the check known, else a first attempt of workflow wf of ev.
func (w *world) finish(key string, ev work.Event, wf, status string) {
	c, known := w.keeper.Get(key)
	if !known {
		c = forge.Check{Type: forge.CollectionCheck, Subject: ev.Subject(), Workflow: wf, CreatedAt: forge.Now()}
	}
	c.Status = status
	w.keeper.Know(key, c)
}

// drop takes the job of key out of the scheduler's queue, as if it ran
// (the check's writes are the test's).
func (w *world) drop(t *testing.T, key string) {
	t.Helper()
	w.sched.Cancel(t.Context(), key, "at://did:plc:test/dev.knotless.cancel/x")
}

func tid(n int) string {
	return syntax.NewTIDFromInteger(uint64(time.Now().UnixMicro())<<10 + uint64(n)).String()
}

// observed records what intake and run control tell their observers.
type observed struct {
	mu sync.Mutex
	s  []string
}

func (o *observed) add(s string) { o.mu.Lock(); o.s = append(o.s, s); o.mu.Unlock() }
func (o *observed) get() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.s)
}
func (o *observed) Reconciled(n int, err error)         { o.add(fmt.Sprintf("reconciled %d", n)) }
func (o *observed) Deferred(_ work.Event, flag string)  { o.add("deferred " + flag) }
func (o *observed) Refused(_ work.Event, reason string) { o.add("refused " + reason) }
func (o *observed) TickSkipped(reason string)           { o.add("tick skipped " + reason) }
