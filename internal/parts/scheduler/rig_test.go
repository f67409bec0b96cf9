package scheduler

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/lib/backoff"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// world is a scheduler alone on the rig: its checks written by a real
// checks.Keeper to the rig's PDS, its state in a real state.Store, its
// runs on a run.Engine over fakeexec.
type world struct {
	s      *Scheduler
	pds    *rig.PDS
	keeper *checks.Keeper
	store  *state.Store
	exec   *fakeexec.Executor
	git    *rig.Mirrors
	sealed *rig.Sealed
	wakes  *counter
	dir    string
	cfg    Config
	facts  Facts
	ports  Ports
}

type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) add() { c.mu.Lock(); c.n++; c.mu.Unlock() }
func (c *counter) get() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func newWorld(t *testing.T) *world {
	t.Helper()
	dir := t.TempDir()
	store, err := state.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{pds: &rig.PDS{}, store: store, exec: &fakeexec.Executor{}, git: &rig.Mirrors{}, sealed: &rig.Sealed{}, wakes: &counter{}, dir: dir}
	w.keeper = checks.NewKeeper(checks.NewRecorder(w.pds, nil), checks.Ports{Blobs: &rig.Blobs{}, Outbox: store},
		backoff.Policy{First: 2e9, Max: 300e9}, nil)
	key, err := forge.NewKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	w.facts = Facts{Runner: rig.Runner, Executor: executor.CapabilitiesOf(w.exec), ExecutorName: w.exec.Name(), RunsDir: t.TempDir()}
	w.ports = Ports{Engine: run.New(run.Config{Executor: w.exec, Runner: rig.Runner}), Checks: w.keeper, State: store, Mirrors: w.git,
		Sealed: w.sealed, Key: key, Sweeper: w.exec, Wake: w.wakes.add}
	w.cfg = Config{Concurrency: 1}
	w.s = New(w.cfg, w.facts, w.ports, slog.New(slog.DiscardHandler))
	return w
}

// again is the scheduler of a new process on the same state directory,
// run directories, executor and check records.
func (w *world) again(t *testing.T) *Scheduler {
	t.Helper()
	store, err := state.Open(w.dir)
	if err != nil {
		t.Fatal(err)
	}
	w.store = store
	w.ports.State = store
	w.keeper = checks.NewKeeper(checks.NewRecorder(w.pds, nil), checks.Ports{Blobs: &rig.Blobs{}, Outbox: store}, backoff.Policy{First: 2e9, Max: 300e9}, nil)
	w.ports.Checks = w.keeper
	w.s = New(w.cfg, w.facts, w.ports, slog.New(slog.DiscardHandler))
	return w.s
}

// work starts the scheduler's workers until the returned stop drains it
// (a SIGTERM) and they end.
func (w *world) work(t *testing.T, s *Scheduler) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	wait := s.Start(ctx, context.Background())
	var once sync.Once
	stop = func() {
		once.Do(func() {
			s.Drain()
			cancel()
			wait()
		})
	}
	t.Cleanup(stop)
	return stop
}

// statuses lists the statuses written for the check of j.
func (w *world) statuses(j *job.Job) []string { return w.pds.Statuses(j.Key) }

func pushJob(rkey, ref, wf string) *job.Job {
	ev := rig.Push(rkey, "c"+rkey)
	ev.Ref = "refs/heads/" + ref
	return &job.Job{Key: "k-" + rkey + "-" + wf, Event: ev, Workflow: &workflow.Workflow{Name: wf}}
}

func pullJob(author, rkey, commit, wf string) *job.Job {
	ev := rig.Pull(author, rkey, commit)
	return &job.Job{Key: "k-" + rkey + "-" + commit + "-" + wf, Event: ev, Workflow: &workflow.Workflow{Name: wf}}
}

func pullEvent(author, rkey, commit string) work.Event {
	return work.Event{Kind: forge.KindPull, URI: syntax.ATURI("at://" + author + "/" + forge.CollectionPull + "/" + rkey), Commit: commit}
}

func pushEvent(owner, rkey string) work.Event {
	return work.Event{Kind: forge.KindPush, URI: syntax.ATURI("at://" + owner + "/" + forge.CollectionRefUpdate + "/" + rkey), Commit: "c" + rkey, Trusted: true}
}

// runnable is the job of workflow wf (steps running scripts) for ev,
// exported from the rig's mirror.
func (w *world) runnable(ev work.Event, wf string, scripts ...string) *job.Job {
	repo, _ := w.git.Open(context.Background(), job.MirrorKey(ev))
	return job.New(ev, rig.CI(wf, scripts...), repo, ev.Commit)
}
