package lander

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"

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
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// world is the lander on the rig with its real neighbours: intake (its
// pre-flights and batches are ordinary events), the scheduler with its
// workers on a run.Engine over fakeexec, the checks part and the state
// store; the merge queue's records, the git source and the check
// records are the rig's. serve runs them as the daemon does, without
// the daemon.
type world struct {
	dir    string
	store  *state.Store
	pds    *rig.PDS
	keeper *checks.Keeper
	lister *rig.Lister
	git    *rig.Mirrors
	queue  *rig.Queue
	exec   *fakeexec.Executor
	in     *intake.Intake
	sched  *scheduler.Scheduler
	l      *Lander
	cfg    Config
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{dir: t.TempDir(), pds: &rig.PDS{}, lister: &rig.Lister{}, git: &rig.Mirrors{}, queue: rig.NewQueue(), exec: &fakeexec.Executor{},
		cfg: Config{Queue: true}}
	w.build(t)
	return w
}

// build makes the parts, as a new process: the state loaded from its
// directory, the checks written so far known (as listed at start).
func (w *world) build(t *testing.T) {
	t.Helper()
	store, err := state.Open(w.dir)
	if err != nil {
		t.Fatal(err)
	}
	w.store = store
	quiet := slog.New(slog.DiscardHandler)
	w.keeper = checks.NewKeeper(checks.NewRecorder(w.pds, nil), checks.Ports{Blobs: &rig.Blobs{}, Outbox: store}, backoff.Policy{First: 2e9, Max: 300e9}, quiet)
	for k, c := range w.pds.Checks() {
		w.keeper.Know(k, c)
	}
	var in *intake.Intake
	wake := func() { in.Wake() }
	w.sched = scheduler.New(scheduler.Config{}, scheduler.Facts{Runner: rig.Runner, Executor: executor.CapabilitiesOf(w.exec), ExecutorName: w.exec.Name(), RunsDir: w.dir + "/runs"},
		scheduler.Ports{Engine: run.New(run.Config{Executor: w.exec, Runner: rig.Runner}), Checks: w.keeper, State: store, Mirrors: w.git,
			Sealed: &rig.Sealed{}, Sweeper: w.exec, Wake: wake}, quiet)
	w.l = New(w.cfg, rig.Runner, Ports{Records: w.queue, Mirrors: w.git, Checks: w.keeper, State: store, Wake: wake}, quiet)
	in = intake.New(intake.Config{}, intake.Facts{Runner: rig.Runner},
		intake.Ports{Lister: w.lister, Mirrors: w.git, Scheduler: w.sched, Checks: w.keeper, State: store, Lander: w.l}, quiet)
	w.l.p.Intake = in
	w.in = in
}

// serve runs intake, the scheduler's workers and the lander until the
// returned stop is called; stop waits for them (the daemon's order:
// intake and the lander stop, then the workers drain).
func (w *world) serve(t *testing.T) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	runCtx, stopRuns := context.WithCancel(context.Background())
	var parts sync.WaitGroup
	// The daemon's start: the runs an earlier process left are adopted
	// or swept before any work is queued.
	w.sched.Adopt(ctx)
	if err := w.sched.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	wait := w.sched.Start(ctx, runCtx)
	parts.Go(func() { w.in.Run(ctx) })
	parts.Go(func() { w.l.Run(ctx) })
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			parts.Wait()
			w.sched.Drain()
			wait()
			stopRuns()
		})
	}
	t.Cleanup(stop)
	return stop
}

// serveUntilIdle serves until nothing is left to do (every run ended
// and the queue settled), then stops.
func (w *world) serveUntilIdle(t *testing.T) {
	stop := w.serve(t)
	synctest.Wait()
	stop()
}

// successor is the world of a restarted process: the same state
// directory, fakes and records.
func (w *world) successor(t *testing.T) *world {
	t.Helper()
	next := *w
	next.build(t)
	return &next
}

func (w *world) statuses(ev work.Event, wf string) []string {
	return w.pds.Statuses(forge.CheckKey(ev.Subject(), wf))
}

// queueScript is what the rig's runs do: the pre-flight of a pull in
// failPre fails, and so does a batch holding the head culprit.
type queueScript struct {
	w       *world
	mu      sync.Mutex
	failPre map[string]bool
	culprit string
}

func (s *queueScript) step(runID, _ string) fakeexec.Step {
	ev := s.w.exec.Session(runID).Spec().Annotations["knotless.dev/event"]
	s.mu.Lock()
	fail, culprit := s.failPre[ev], s.culprit
	s.mu.Unlock()
	if fail {
		return fakeexec.Step{Output: "pre-flight says no\n", Code: 1}
	}
	if uri := syntax.ATURI(ev); culprit != "" && uri.Collection().String() == forge.CollectionBatch {
		for _, p := range s.w.queue.Batch(uri.RecordKey().String()).Pulls {
			if p.Commit == culprit {
				return fakeexec.Step{Output: "fails together\n", Code: 1}
			}
		}
	}
	return fakeexec.Step{}
}

// newLanderWorld is a world whose runner lands the rig repository's
// queue (--queue): pre is its pre-flight (queue: first), batch its
// on: batch workflow.
func newLanderWorld(t *testing.T) (*world, *queueScript) {
	t.Helper()
	w := newWorld(t)
	w.lister.SetRepos(rig.QueueRepo([]string{rig.Runner}, []string{rig.Runner}))
	w.git.SetWorkflows(
		&workflow.Workflow{Name: "pre", File: ".knotless/workflows/pre.yaml", On: []workflow.Trigger{workflow.Pull}, Queue: "first",
			Steps: []workflow.Step{{Name: "check", Run: "make check"}}},
		&workflow.Workflow{Name: "batch", File: ".knotless/workflows/batch.yaml", On: []workflow.Trigger{workflow.Batch},
			Steps: []workflow.Step{{Name: "test", Run: "make test"}}},
	)
	s := &queueScript{w: w, failPre: map[string]bool{}}
	w.exec.Script = s.step
	return w, s
}

// queuePull opens pull n (its head changing paths) and has the owner
// queue it; n orders the queue.
func (w *world) queuePull(n int, paths ...string) (uri, head string) {
	return w.queue.QueuePull(w.git, n, paths...)
}

// batchPulls is a batch's pulls as pull URIs.
func batchPulls(b forge.Batch) []string {
	var out []string
	for _, p := range b.Pulls {
		out = append(out, p.Pull)
	}
	return out
}
