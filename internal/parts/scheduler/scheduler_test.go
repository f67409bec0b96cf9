package scheduler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/workflow"
)

// The scheduler alone on the rig: jobs from their queued check to their
// final one, supersede, the caps' load, the release and the detach at
// stop, adoption by a successor, secrets.

func TestEnqueueSupersedesWaiting(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	old, newer := pushJob("3k1", "main", "ci"), pushJob("3k2", "main", "ci")
	for _, j := range []*job.Job{old, newer} {
		if queued, err := w.s.Enqueue(ctx, j); err != nil || !queued {
			t.Fatalf("enqueue %s: %v, %v", j.Key, queued, err)
		}
	}
	want := []string{"k-3k1-ci queued", "k-3k2-ci queued", "k-3k1-ci cancelled"}
	if diff := cmp.Diff(want, w.pds.Writes()); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	if c, _ := w.keeper.Get(old.Key); c.Error != "superseded by "+string(newer.Event.URI) {
		t.Errorf("superseded check's error = %q", c.Error)
	}
	if !w.store.Done(old.Event.Key()) {
		t.Error("the superseded event is not done in state.json")
	}
	// In hand already (a pre-flight and its pull share a check): not
	// queued twice, nothing written.
	if queued, err := w.s.Enqueue(ctx, newer); err != nil || queued {
		t.Errorf("enqueue of a check in hand: queued %v, %v", queued, err)
	}
	if got := len(w.pds.Writes()); got != 3 {
		t.Errorf("%d writes after queueing a queued check again, want 3", got)
	}
	if !w.s.HasCheck(newer.Key) || !w.s.InHand(newer.Event.Key()) {
		t.Error("the queued job is not in hand")
	}
	if running, queued, draining := w.s.Counts(); running != 0 || queued != 1 || draining {
		t.Errorf("counts %d running, %d queued, draining %v", running, queued, draining)
	}
}

func TestEnqueueCancelsRunning(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		ctx := t.Context()
		old := pushJob("3k1", "main", "ci")
		if _, err := w.s.Enqueue(ctx, old); err != nil {
			t.Fatal(err)
		}
		tk, jctx := w.s.next(ctx, context.Background(), func() {})
		if tk.Job != old {
			t.Fatalf("claimed %v", tk)
		}
		if _, err := w.s.Enqueue(ctx, pushJob("3k2", "main", "ci")); err != nil {
			t.Fatal(err)
		}
		<-jctx.Done() // the older run is cancelled
		if tk.superseded == "" {
			t.Error("the older run is not marked superseded")
		}
		w.s.jobEnded(tk)
		if w.s.InHand(old.Event.Key()) {
			t.Error("ended job still in hand")
		}
	})
}

func TestEnqueueFailsWhenTheQueuedCheckIsNotWritten(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.pds.FailNext(rig.ErrDown)
	j := pushJob("3k1", "main", "ci")
	if _, err := w.s.Enqueue(t.Context(), j); err == nil {
		t.Fatal("enqueue without its queued check succeeded")
	}
	if w.s.HasCheck(j.Key) {
		t.Error("a job whose queued check was not written is in hand")
	}
}

// TestNextWaitsForWork drives the workers' claim under synctest: a
// worker waits while the queue is empty, wakes when a job is added, and
// returns nil once the scheduler drains.
func TestNextWaitsForWork(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		ctx := t.Context()
		got := make(chan *task)
		go func() {
			for {
				tk, jctx := w.s.next(ctx, context.Background(), func() {})
				if tk != nil && jctx == nil {
					t.Error("a claimed task has no context")
				}
				got <- tk
				if tk == nil {
					return
				}
			}
		}()
		synctest.Wait()
		select {
		case tk := <-got:
			t.Fatalf("claimed %v from an empty queue", tk)
		default:
		}
		want := pushJob("3k1", "main", "ci")
		if _, err := w.s.Enqueue(ctx, want); err != nil {
			t.Fatal(err)
		}
		tk := <-got
		if tk.Job != want || tk.cancel == nil {
			t.Fatalf("claimed %v, want %s with a cancel", tk, want.Key)
		}
		synctest.Wait()
		w.s.Drain()
		if tk := <-got; tk != nil {
			t.Fatalf("claimed %s while draining", tk.Key)
		}
	})
}

// observer records what it is told.
type observer struct {
	mu     sync.Mutex
	events []string
}

func (o *observer) add(s string)            { o.mu.Lock(); o.events = append(o.events, s); o.mu.Unlock() }
func (o *observer) Queued(j *job.Job)       { o.add("queued " + j.Workflow.Name) }
func (o *observer) Inherited(how string)    { o.add("inherited " + how) }
func (o *observer) TakenOver(time.Duration) { o.add("taken over") }
func (o *observer) Retried(j *job.Job, reason string) {
	o.add("retried " + j.Workflow.Name + " " + reason)
}
func (o *observer) Started(j *job.Job, _ string, _ time.Time) { o.add("started " + j.Workflow.Name) }
func (o *observer) Ended(j *job.Job, res *run.Result) {
	o.add("ended " + j.Workflow.Name + " " + string(res.Status))
}

// tap hands each run a buffer for its live log.
type tap struct {
	mu   sync.Mutex
	logs map[string]*bytes.Buffer
	// checks, when set, lists the statuses written for a check; opened
	// records them at each Open.
	checks func(key string) []string
	opened []string
	ended  []*run.Result
}

func (tp *tap) Open(j *job.Job, runID string, prior []byte, h *run.Handover) io.Writer {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	b := &bytes.Buffer{}
	tp.logs[j.Key] = b
	if tp.checks != nil {
		size := int64(-1)
		if h != nil {
			size = h.LogSize
		}
		tp.opened = append(tp.opened, fmt.Sprintf("%s after %v, prior %q at %d", runID, tp.checks(j.Key), prior, size))
	}
	return b
}

func (tp *tap) Ended(_ *job.Job, _ string, res *run.Result, _ string) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.ended = append(tp.ended, res)
}

// A job from its queued check to its final one: the run on the engine
// with the job's run variables, the live tap and the observer told, the
// run recorded in state.json while it goes and forgotten after, its run
// directory removed.
func TestWorkRunsAJob(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		obs, tp := &observer{}, &tap{logs: map[string]*bytes.Buffer{}}
		w.ports.Observer, w.ports.Tap = obs, tp
		w.s = New(w.cfg, w.facts, w.ports, nil)
		gate := make(chan struct{})
		w.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Output: "hello\n", Gate: gate} }
		j := w.runnable(rig.Push("3k1", "c1"), "ci", "make")
		j.Vars = []workflow.EnvVar{{Name: "GREETING", Value: "hi"}}
		stop := w.work(t, w.s)
		if _, err := w.s.Enqueue(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if r, ok := w.store.Run(j.Key); !ok || r.Job == nil {
			t.Errorf("the going run is not in state.json: %+v", r)
		}
		var runID string
		for id := range w.exec.Running() {
			runID = w.exec.Running()[id]
		}
		payload, _ := w.exec.Session(runID).Payload("1")
		if !bytes.Contains(payload, []byte("GREETING")) {
			t.Errorf("the step's payload has no run variable: %q", payload)
		}
		close(gate)
		synctest.Wait()
		stop()
		// A worker was free: no queued record, the running one is the
		// check's first.
		if diff := cmp.Diff([]string{"running", "success"}, w.statuses(j)); diff != "" {
			t.Errorf("statuses (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"queued ci", "started ci", "ended ci success"}, obs.events); diff != "" {
			t.Errorf("observed (-want +got):\n%s", diff)
		}
		if !strings.Contains(tp.logs[j.Key].String(), "hello") {
			t.Errorf("live log %q", tp.logs[j.Key].String())
		}
		if len(w.store.Runs()) != 0 || !w.store.Done(j.Event.Key()) {
			t.Errorf("runs %v, done %v", w.store.Runs(), w.store.DoneKeys())
		}
		if left, _ := os.ReadDir(w.facts.RunsDir); len(left) != 0 {
			t.Errorf("run directories left: %v", left)
		}
		if w.wakes.get() != 0 {
			t.Error("a trusted push's end woke the reconciler")
		}
	})
}

// An untrusted run's end frees a slot of its author's cap: the
// reconciler is woken.
func TestWorkWakesForAuthors(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		stop := w.work(t, w.s)
		if _, err := w.s.Enqueue(t.Context(), w.runnable(rig.Pull("did:plc:author", "3p1", "h1"), "ci", "make")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		stop()
		if w.wakes.get() != 1 {
			t.Errorf("woken %d times, want once", w.wakes.get())
		}
	})
}

// Cancel: a waiting job leaves the queue, a running one is cancelled;
// both checks end cancelled naming the cancel record. A key not in hand
// is not.
func TestCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		never := make(chan struct{})
		w.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: never} }
		running := w.runnable(rig.Push("3k1", "c1"), "ci", "make")
		waiting := w.runnable(rig.Pull("did:plc:author", "3p1", "h1"), "ci", "make")
		stop := w.work(t, w.s)
		for _, j := range []*job.Job{running, waiting} {
			if _, err := w.s.Enqueue(t.Context(), j); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		for _, j := range []*job.Job{waiting, running} {
			if !w.s.Cancel(t.Context(), j.Key, "at://did:plc:owner/dev.knotless.cancel/1") {
				t.Errorf("%s not in hand", j.Key)
			}
		}
		synctest.Wait()
		if w.s.Cancel(t.Context(), "k-nothing", "no") {
			t.Error("a key not in hand was cancelled")
		}
		stop()
		for _, j := range []*job.Job{running, waiting} {
			c, _ := w.keeper.Get(j.Key)
			if c.Status != "cancelled" || c.Error != "cancelled by at://did:plc:owner/dev.knotless.cancel/1" ||
				c.CancelledBy != "at://did:plc:owner/dev.knotless.cancel/1" {
				t.Errorf("%s: %s %q by %q", j.Key, c.Status, c.Error, c.CancelledBy)
			}
			if !w.store.Done(j.Event.Key()) {
				t.Errorf("%s: not done", j.Key)
			}
		}
	})
}

// releaseAtStop runs j on w's scheduler until it is going, then stops
// the scheduler as a SIGTERM past the stop wait does: drained, its run
// released.
func releaseAtStop(t *testing.T, w *world, j *job.Job) {
	t.Helper()
	runCtx, stopRuns := context.WithCancel(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	wait := w.s.Start(ctx, runCtx)
	if _, err := w.s.Enqueue(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	if released, going := w.s.Drain(); released != 0 || going != 1 {
		t.Errorf("drain: %d released, %d going", released, going)
	}
	cancel()
	if n := w.s.ReleaseRunning(); n != 1 {
		t.Errorf("released %d running", n)
	}
	stopRuns()
	wait()
}

// At the stop wait a run still going is released: its check back to
// queued, not done, for the successor; its live output is not ended
// (the successor's run of the work replaces it).
func TestReleaseRunning(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		w.facts.Executor = executor.Capabilities{} // cannot detach
		tp := &tap{logs: map[string]*bytes.Buffer{}}
		w.ports.Tap = tp
		w.s = New(w.cfg, w.facts, w.ports, nil)
		never := make(chan struct{})
		w.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: never} }
		j := w.runnable(rig.Push("3k1", "c1"), "ci", "make")
		releaseAtStop(t, w, j)
		if diff := cmp.Diff([]string{"running", "queued"}, w.statuses(j)); diff != "" {
			t.Errorf("statuses (-want +got):\n%s", diff)
		}
		if w.store.Done(j.Event.Key()) {
			t.Error("released work is done")
		}
		if len(tp.ended) != 0 {
			t.Errorf("the released run's live output was ended (%+v): a successor runs the work again", tp.ended)
		}
	})
}

// noDrivers are the Drivers of a replica alone: nothing to claim.
type noDrivers struct{}

func (noDrivers) Save(context.Context, string, []byte) error { return nil }
func (noDrivers) Claim(context.Context, string) ([]byte, bool, time.Time, error) {
	return nil, false, time.Time{}, nil
}
func (noDrivers) Drop(context.Context, string) error { return nil }
func (noDrivers) Forget(string)                      {}

// A replica's run released at a stop before its session started has no
// check record at all (a replica's first record is the running one,
// written once its Job is its own): its event is not done, so that the
// replica that takes it next runs it. Marked done, the push was lost.
func TestReleasedBeforeAnyRecordIsNotDone(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		w.facts.Executor = executor.Capabilities{} // cannot detach
		w.ports.Drivers = noDrivers{}
		never := make(chan struct{})
		w.exec.StartGate = never // the pod never gets a node
		w.s = New(w.cfg, w.facts, w.ports, nil)
		j := w.runnable(rig.Push("3k1", "c1"), "ci", "make")
		releaseAtStop(t, w, j)
		if got := w.statuses(j); len(got) != 0 {
			t.Errorf("a replica wrote %v for a run released before its session", got)
		}
		if w.store.Done(j.Event.Key()) {
			t.Error("the event of a run released with no record is done: no replica would run it")
		}
	})
}

// At SIGTERM on an executor that resumes sessions a going run is
// detached: state.json keeps its handover and its log beside its run
// directory; the successor adopts it (its sweep keeps the session) and
// writes its one final check.
func TestDetachAndAdopt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		gate := make(chan struct{})
		w.exec.Script = func(_, id string) fakeexec.Step {
			if id == "1" {
				return fakeexec.Step{Output: "before the handover\n", Gate: gate}
			}
			return fakeexec.Step{Output: "after\n"}
		}
		j := w.runnable(rig.Push("3k1", "c1"), "ci", "make", "make test")
		j.Vars = []workflow.EnvVar{{Name: "RERUN_ENV", Value: "1"}} // a re-run's env: the successor's run gets it too
		w.git.SetWorkflows(j.Workflow)
		stop := w.work(t, w.s)
		if _, err := w.s.Enqueue(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		stop()
		if got := w.statuses(j); !slices.Equal(got, []string{"running"}) {
			t.Fatalf("before the handover: %v", got)
		}
		if w.s.Detached() != 1 {
			t.Errorf("detached %d", w.s.Detached())
		}
		st, err := state.Load(w.dir)
		if err != nil {
			t.Fatal(err)
		}
		handed, ok := st.Runs[j.Key]
		if !ok || handed.Handover == nil {
			t.Fatalf("state.json runs %+v: want the run handed over", st.Runs)
		}
		if _, err := os.Stat(filepath.Join(w.facts.RunsDir, handed.RunID, handoverLog)); err != nil {
			t.Errorf("the handed-over run's log: %v", err)
		}

		obs := &observer{}
		w.ports.Observer = obs
		next := w.again(t)
		if n := next.Adopt(t.Context()); n != 1 {
			t.Fatalf("adopted %d runs, want 1", n)
		}
		if got := next.adopted[0].Vars; !slices.Equal(got, j.Vars) {
			t.Errorf("the adopted run's variables %v, want %v", got, j.Vars)
		}
		if err := next.Sweep(t.Context()); err != nil {
			t.Fatal(err)
		}
		if swept := w.exec.Swept(); !cmp.Equal(swept[len(swept)-1], []string{handed.RunID}) {
			t.Errorf("sweep kept %v, want the adopted run", swept)
		}
		if r, _ := w.store.Run(j.Key); r.Handover != nil {
			t.Error("the adopted run's handover is still in state.json: a crash would adopt it again")
		}
		close(gate)
		stop = w.work(t, next)
		synctest.Wait()
		stop()
		if got := w.statuses(j); !slices.Equal(got, []string{"running", "success"}) {
			t.Errorf("after adoption: %v", got)
		}
		if len(w.store.Runs()) != 0 {
			t.Error("the adopted run is still in state.json")
		}
		if !slices.Contains(obs.events, "taken over") {
			t.Errorf("observed %v: the adopted run's takeover is not told", obs.events)
		}
	})
}

// A handed-over run whose workflow is gone cannot be adopted: the sweep
// forgets it and removes its session, and its work runs again.
func TestAdoptDropsWhatCannotGoOn(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		gate := make(chan struct{})
		w.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: gate} }
		j := w.runnable(rig.Push("3k1", "c1"), "ci", "make")
		stop := w.work(t, w.s)
		if _, err := w.s.Enqueue(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		stop()
		w.git.SetWorkflows(rig.CI("other", "make"))
		next := w.again(t)
		if n := next.Adopt(t.Context()); n != 0 {
			t.Fatalf("adopted %d runs of a workflow that is gone", n)
		}
		if err := next.Sweep(t.Context()); err != nil {
			t.Fatal(err)
		}
		if len(w.store.Runs()) != 0 {
			t.Error("the run that cannot go on is still in state.json")
		}
		if running := w.exec.Running(); len(running) != 0 {
			t.Errorf("sessions left after the sweep: %v", running)
		}
		close(gate)
	})
}

// goneExecutor knows which sessions are gone and fails the probe of
// some.
type goneExecutor struct {
	plainExecutor
	gone, unsure map[string]bool // by session name
}

func (e *goneExecutor) Gone(_ context.Context, ref executor.Ref) (bool, error) {
	if e.unsure[ref.Name] {
		return false, errors.New("the API server did not answer")
	}
	return e.gone[ref.Name], nil
}

// plainExecutor records what its sweep was told to keep.
type plainExecutor struct {
	mu   sync.Mutex
	kept []string
}

func (e *plainExecutor) Name() string { return "plain" }
func (e *plainExecutor) Start(context.Context, executor.Spec) (executor.Session, error) {
	return nil, executor.ErrNotImplemented
}
func (e *plainExecutor) Resume(context.Context, executor.Ref) (executor.Session, error) {
	return nil, executor.ErrNotImplemented
}
func (e *plainExecutor) Sweep(_ context.Context, keep []string) ([]executor.Ref, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.kept = slices.Clone(keep)
	return nil, nil
}

// TestAdoptSkipsGoneSessions: a handed-over run whose session is gone
// is not adopted: the sweep keeps nothing of it and state.json forgets
// it, so the reconciliation runs its work again under the same check
// key. A run whose probe fails is adopted as before; a run without a
// handover (killed mid-run) never is. An executor that cannot tell
// adopts every handed-over run.
func TestAdoptSkipsGoneSessions(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ex := &goneExecutor{gone: map[string]bool{"job-gone": true}, unsure: map[string]bool{"job-unsure": true}}
	handed := func(id, name string) state.Run {
		return state.Run{RunID: id, Handover: &run.Handover{Session: executor.Ref{Executor: "plain", RunID: id, Name: name}}}
	}
	for key, r := range map[string]state.Run{"k-going": handed("r1", "job-going"), "k-gone": handed("r2", "job-gone"),
		"k-unsure": handed("r3", "job-unsure"), "k-killed": {RunID: "r4"}} {
		if err := w.store.StartRun(key, r); err != nil {
			t.Fatal(err)
		}
	}
	w.facts.Executor, w.facts.ExecutorName = executor.CapabilitiesOf(ex), ex.Name()
	s := New(w.cfg, w.facts, w.ports, nil)
	if diff := cmp.Diff([]string{"k-going", "k-unsure"}, s.toAdopt(t.Context())); diff != "" {
		t.Errorf("runs to adopt (-want +got):\n%s", diff)
	}
	w.facts.Executor = executor.CapabilitiesOf(&plainExecutor{})
	s = New(w.cfg, w.facts, w.ports, nil)
	if diff := cmp.Diff([]string{"k-going", "k-gone", "k-unsure"}, s.toAdopt(t.Context())); diff != "" {
		t.Errorf("without a probe: runs to adopt (-want +got):\n%s", diff)
	}
}

// Sweep and Resweep: the start's sweep keeps the adopted runs alone and
// forgets the others; the later one keeps every run this process holds.
func TestSweeps(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ex := &plainExecutor{}
	w.ports.Sweeper = ex
	s := New(w.cfg, w.facts, w.ports, nil)
	for _, k := range []string{"k1", "k2"} {
		if err := w.store.StartRun(k, state.Run{RunID: "r-" + k}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Resweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"r-k1", "r-k2"}, ex.kept); diff != "" {
		t.Errorf("resweep kept (-want +got):\n%s", diff)
	}
	if err := s.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(ex.kept) != 0 || len(w.store.Runs()) != 0 {
		t.Errorf("sweep kept %v, runs %v: want nothing adopted, nothing left", ex.kept, w.store.Runs())
	}
	w.ports.Sweeper = &fakeexec.Executor{SweepErr: errors.New("cluster unreachable")}
	if err := New(w.cfg, w.facts, w.ports, nil).Sweep(t.Context()); err == nil || !strings.Contains(err.Error(), "cluster unreachable") {
		t.Errorf("a failed sweep: %v", err)
	}
}

// TestFailureWhileStoppingReleases: a run that fails before its session
// started while the daemon stops (a signal to the whole unit ends its
// git export) comes back Detached without a handover, which runJob
// releases; the same failure when not stopping is the run's final
// error.
func TestFailureWhileStoppingReleases(t *testing.T) {
	t.Parallel()
	for _, stopping := range []bool{true, false} {
		w := newWorld(t)
		w.ports.Down = func() error { return errors.New("signal: terminated") }
		s := New(w.cfg, w.facts, w.ports, nil)
		if stopping {
			s.Drain()
		}
		tk := one(pushJob("3k1", "main", "ci"))
		tk.runID = "r1"
		res := s.execute(t.Context(), tk, t.TempDir(), s.log)
		want := run.Error
		if stopping {
			want = run.Detached
		}
		if res.Status != want || res.Handover != nil {
			t.Errorf("stopping %v: status %s, handover %+v; want %s without a handover", stopping, res.Status, res.Handover, want)
		}
	}
}

// Secrets of a trusted run: the repository's sealed ones opened with the
// runner's key, refused when sealed for another repository, and the
// operator's, which win.
func TestSecretsOfATrustedRun(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	key, err := forge.NewKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	w.ports.Key = key
	seal := func(name, repo, value string) forge.Record[forge.Secret] {
		b, err := forge.SealSecret(key.Public, forge.Envelope{Repo: repo, Name: name, Runner: rig.Runner, Scope: forge.ScopePush, Value: []byte(value)})
		if err != nil {
			t.Fatal(err)
		}
		return forge.Record[forge.Secret]{URI: syntax.ATURI("at://did:plc:owner/dev.knotless.secret/" + name),
			Value: forge.Secret{Repo: rig.Repo, Name: name, Runner: rig.Runner, Scope: forge.ScopePush, Sealed: b}}
	}
	w.ports.Sealed = &rig.Sealed{
		Recs: []forge.Record[forge.Secret]{seal("TOKEN", rig.Repo, "sealed-token"), seal("STOLEN", "at://did:plc:other/dev.knotless.repo/x", "x"),
			seal("SHARED", rig.Repo, "sealed-shared"), seal("UNGRANTED", rig.Repo, "u")},
		Bad: []forge.Invalid{{URI: "at://did:plc:owner/dev.knotless.secret/bad", Err: errors.New("no")}},
	}
	w.cfg.Secrets = []OperatorSecret{{Name: "SHARED", Value: "operator-shared", Repos: []string{rig.Repo}}}
	s := New(w.cfg, w.facts, w.ports, nil)
	wf := rig.CI("ci", "make")
	wf.Secrets = []string{"TOKEN", "STOLEN", "SHARED"}
	got, err := s.secrets(t.Context(), &job.Job{Event: rig.Push("3k1", "c1"), Workflow: wf})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"TOKEN": "sealed-token", "SHARED": "operator-shared"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("secrets (-want +got):\n%s", diff)
	}
	w.ports.Sealed = &rig.Sealed{Err: rig.ErrDown}
	s = New(w.cfg, w.facts, w.ports, nil)
	if _, err := s.secrets(t.Context(), &job.Job{Event: rig.Push("3k1", "c1"), Workflow: wf}); err == nil {
		t.Error("a failed listing of sealed secrets gave no error")
	}
}

// Work shows the jobs in hand as status shows them: the running one
// with its run, its start and the step it is at, the waiting one with
// when it was queued; the observer is told how long the run waited.
func TestWorkShowsTheJobsInHand(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		obs := &waits{}
		w.ports.Observer = obs
		w.s = New(w.cfg, w.facts, w.ports, nil)
		gate := make(chan struct{})
		w.exec.Script = func(_, id string) fakeexec.Step {
			if id == "2" {
				return fakeexec.Step{Gate: gate}
			}
			return fakeexec.Step{}
		}
		first := w.runnable(rig.Push("3k1", "c1"), "ci", "make", "make test")
		second := w.runnable(rig.Push("3k2", "c2"), "lint", "make lint")
		queuedAt := time.Now()
		for _, j := range []*job.Job{first, second} {
			if _, err := w.s.Enqueue(t.Context(), j); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(5 * time.Second) // waiting, queued
		stop := w.work(t, w.s)
		synctest.Wait()
		running, waiting := w.s.Work()
		if len(running) != 1 || len(waiting) != 1 {
			t.Fatalf("work: %d running, %d waiting; want 1 and 1", len(running), len(waiting))
		}
		r, q := running[0], waiting[0]
		if r.Job != first || r.RunID == "" || !r.Started.Equal(queuedAt.Add(5*time.Second)) || r.Adopted {
			t.Errorf("running: %+v", r)
		}
		if want := (run.Progress{Step: 2, Steps: 2, Name: "ci-b", Started: queuedAt.Add(5 * time.Second)}); r.Progress != want {
			t.Errorf("progress %+v, want %+v", r.Progress, want)
		}
		if q.Job != second || q.RunID != "" || !q.Queued.Equal(queuedAt) || !q.Started.IsZero() {
			t.Errorf("waiting: %+v", q)
		}
		close(gate)
		synctest.Wait()
		stop()
		if diff := cmp.Diff([]time.Duration{5 * time.Second, 5 * time.Second}, obs.get()); diff != "" {
			t.Errorf("waits observed (-want +got):\n%s", diff)
		}
		if running, waiting := w.s.Work(); len(running)+len(waiting) != 0 {
			t.Errorf("work after the runs: %v %v", running, waiting)
		}
	})
}

// waits records how long each started run waited queued.
type waits struct {
	mu sync.Mutex
	d  []time.Duration
}

func (o *waits) Queued(*job.Job)             {}
func (o *waits) Ended(*job.Job, *run.Result) {}
func (o *waits) Inherited(string)            {}
func (o *waits) TakenOver(time.Duration)     {}
func (o *waits) Retried(*job.Job, string)    {}
func (o *waits) Started(_ *job.Job, _ string, queued time.Time) {
	o.mu.Lock()
	o.d = append(o.d, time.Since(queued))
	o.mu.Unlock()
}

func (o *waits) get() []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.d
}

// TestForeignHandover: a run handed over on one executor (here fake),
// taken up by a process on another (a runner moved from Kubernetes to
// Docker) that cannot adopt it. Before issue 35 the successor forgot it
// and ran its work again while its session went on: the work ran twice
// at once. Now, when the successor can reach the old executor, it stops
// the session first (the work then runs again here, under the same,
// not final, check); when it cannot, the check ends error naming the
// executor change, with the log so far, and the work does not run
// again here.
func TestForeignHandover(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		stop    func(w *world) func(context.Context, executor.Ref) error
		stopped bool   // the old session is stopped
		final   string // the check's last status
		error   string // what its error says
	}{
		{name: "reachable", stop: func(w *world) func(context.Context, executor.Ref) error {
			return func(ctx context.Context, ref executor.Ref) error {
				sess, err := w.exec.Resume(ctx, ref)
				if err != nil {
					return err
				}
				return sess.Stop(ctx)
			}
		}, stopped: true, final: "running"},
		{name: "unreachable", stop: func(*world) func(context.Context, executor.Ref) error { return nil },
			final: "error", error: "handed over by a runner on executor fake; this runner's executor shell cannot adopt it and could not stop its session fake:"},
		{name: "stop fails", stop: func(*world) func(context.Context, executor.Ref) error {
			return func(context.Context, executor.Ref) error { return errors.New("the API server did not answer") }
		}, final: "error", error: "(the API server did not answer): not run again here, so that it never runs twice at once"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t)
				gate := make(chan struct{})
				defer close(gate)
				w.exec.Script = func(string, string) fakeexec.Step {
					return fakeexec.Step{Output: "before the handover\n", Gate: gate}
				}
				j := w.runnable(rig.Push("3k1", "c1"), "ci", "make")
				w.git.SetWorkflows(j.Workflow)
				stop := w.work(t, w.s)
				if _, err := w.s.Enqueue(t.Context(), j); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				stop()
				handed, ok := w.store.Run(j.Key)
				if !ok || handed.Handover == nil {
					t.Fatalf("want the run handed over, state has %+v", handed)
				}

				// The successor: another executor, which resumes nothing
				// and sweeps only its own sessions.
				w.facts.Executor, w.facts.ExecutorName = executor.Capabilities{}, "shell"
				w.ports.Sweeper = &plainExecutor{}
				var asked []executor.Ref
				if stopper := tt.stop(w); stopper != nil {
					w.ports.StopForeign = func(ctx context.Context, ref executor.Ref) error {
						asked = append(asked, ref)
						return stopper(ctx, ref)
					}
				}
				next := w.again(t)
				if n := next.Adopt(t.Context()); n != 0 {
					t.Fatalf("adopted %d runs on another executor", n)
				}
				if err := next.Sweep(t.Context()); err != nil {
					t.Fatal(err)
				}
				if w.ports.StopForeign != nil && (len(asked) != 1 || asked[0] != handed.Handover.Session) {
					t.Errorf("asked to stop %v, want the handed-over session %s", asked, handed.Handover.Session)
				}
				if stopped := len(w.exec.Running()) == 0; stopped != tt.stopped {
					t.Errorf("the old session stopped: %v, want %v", stopped, tt.stopped)
				}
				if len(w.store.Runs()) != 0 {
					t.Errorf("state.json still holds %v", w.store.Runs())
				}
				got := w.statuses(j)
				if len(got) == 0 || got[len(got)-1] != tt.final {
					t.Fatalf("check statuses %v, want the last %s", got, tt.final)
				}
				if tt.error != "" {
					c := w.pds.Checks()[j.Key]
					if !strings.Contains(c.Error, tt.error) {
						t.Errorf("the check's error %q, want it to say %q", c.Error, tt.error)
					}
					if c.Log == nil {
						t.Error("the error check has no log: the earlier process's part is lost")
					}
				}
			})
		})
	}
}

// TestTakeUpDecides: at start, each run an earlier process died running
// (in state.json, not handed over) is adopted from its checkpoint when
// its session is there; ends error when a step may have started and it
// cannot go on (its session gone, on another executor, or where it
// stood unreadable), never to run again; is left to run again from the
// start when it has no checkpoint (no step had started); and is left
// alone when its check is final (the process died after writing it).
func TestTakeUpDecides(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ex := &goneExecutor{gone: map[string]bool{"job-gone": true}}
	w.facts.Executor, w.facts.ExecutorName = executor.CapabilitiesOf(ex), ex.Name()
	obs := &observer{}
	w.ports.Observer = obs
	s := New(w.cfg, w.facts, w.ports, slog.New(slog.DiscardHandler))
	checkpoint := func(runID, exec, session string) {
		log := []byte("==> step 1/2: build\nok\n")
		h := run.Handover{Session: executor.Ref{Executor: exec, RunID: runID, Name: session}, Step: 1, Replay: true,
			Steps: make([]run.StepResult, 2), LogSize: int64(len(log))}
		if err := s.writeCheckpoint(context.Background(), runID, h, log); err != nil {
			t.Fatal(err)
		}
	}
	keys := []string{"k-none", "k-going", "k-gone", "k-docker", "k-corrupt", "k-final", "k-ended"}
	for _, key := range keys {
		j := pushJob(key, "main", "ci")
		saved, err := job.Encode(j, forge.Check{Status: "running", Workflow: "ci"})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.store.StartRun(key, state.Run{CheckKey: key, RunID: "r-" + key, Workflow: "ci", Job: saved}); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint("r-k-going", "plain", "job-going")
	checkpoint("r-k-gone", "plain", "job-gone")
	checkpoint("r-k-docker", "docker", "c-docker")
	checkpoint("r-k-final", "plain", "job-final")
	// Killed after its last step, which failed; its Job went with the
	// dead process's clean-up.
	endedLog := []byte("==> step 1/2: build\nok\n==> step 2/2: test\nFAIL\n")
	exit := 1
	if err := s.writeCheckpoint(context.Background(), "r-k-ended", run.Handover{Session: executor.Ref{Executor: "plain", RunID: "r-k-ended", Name: "job-gone"}, Step: 2, Replay: true,
		Steps:  []run.StepResult{{Name: "build", Status: run.Success}, {Name: "test", Status: run.Failure, ExitCode: &exit}},
		Status: run.Failure, FailedStep: "test", Error: "step test exited 1", LogSize: int64(len(endedLog))}, endedLog); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(s.runDir("r-k-corrupt"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.runDir("r-k-corrupt"), checkpointFile), []byte("{\"step\":"), 0o600); err != nil {
		t.Fatal(err)
	}
	w.keeper.Know("k-final", forge.Check{Status: "success", Workflow: "ci"})

	var adopted []string
	for _, o := range s.takeUp(t.Context()) {
		adopted = append(adopted, o.key)
		if string(o.log) != "==> step 1/2: build\nok\n" || o.h.Step != 1 || !o.h.Replay {
			t.Errorf("%s: taken up at step %d (replay %t) with log %q", o.key, o.h.Step, o.h.Replay, o.log)
		}
	}
	if diff := cmp.Diff([]string{"k-going"}, adopted); diff != "" {
		t.Errorf("runs taken up (-want +got):\n%s", diff)
	}
	// takeUp counts what it ended and what runs again; Adopt counts
	// what it takes up.
	ended, again := 0, 0
	for _, e := range obs.events {
		switch e {
		case "inherited ended":
			ended++
		case "inherited again":
			again++
		}
	}
	if ended != 3 || again != 1 {
		t.Errorf("observed %v; want 3 ended (gone, docker, corrupt) and 1 again (no checkpoint)", obs.events)
	}
	// After its last step, with its session gone: nothing to run, the
	// checkpoint's verdict, the log saying its outputs were not collected.
	if c, _ := w.keeper.Get("k-ended"); !slices.Equal(w.pds.Statuses("k-ended"), []string{"failure"}) || len(c.Steps) != 2 || c.Steps[1].Status != "failure" {
		t.Errorf("k-ended: checks written %v, %+v; want one failure check of step test", w.pds.Statuses("k-ended"), c)
	}
	for key, want := range map[string]string{
		"k-none":    "",
		"k-final":   "",
		"k-going":   "",
		"k-gone":    "runner restarted during step 2/2 (the process running it died), and its session plain:job-gone is gone",
		"k-docker":  "its session is on executor docker, which this runner (executor plain) cannot take over",
		"k-corrupt": "where it stood cannot be read",
	} {
		got := w.pds.Statuses(key)
		if want == "" {
			if len(got) != 0 {
				t.Errorf("%s: checks written %v, want none", key, got)
			}
			continue
		}
		c, _ := w.keeper.Get(key)
		if !slices.Equal(got, []string{"error"}) || !strings.Contains(c.Error, want) || !strings.Contains(c.Error, "not run again, so that no step runs twice") {
			t.Errorf("%s: checks written %v, error %q; want one error check saying %q", key, got, c.Error, want)
		}
	}
}

// TestFence: a run's id comes from its check key and the runner, never
// from the process; a run whose session exists already (another process
// of the runner drives it) is fenced: its session is left alone, and no
// final check, state or run directory of it comes from here.
func TestFence(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		obs := &observer{}
		w.ports.Observer = obs
		w.s = New(w.cfg, w.facts, w.ports, nil)
		gate := make(chan struct{})
		w.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Output: "other\n", Gate: gate} }
		j := w.runnable(rig.Push("3k1", "c1"), "ci", "make")
		id := run.IDFor(rig.Runner, j.Key)
		if id != run.IDFor(rig.Runner, j.Key) || id == run.IDFor("did:plc:another", j.Key) || id == run.IDFor(rig.Runner, j.Key+"x") {
			t.Fatalf("run ids: %s is not one per runner and check key", id)
		}
		// The other process's session of the same run, its step going.
		other, err := w.exec.Start(t.Context(), executor.Spec{RunID: id, Runner: rig.Runner})
		if err != nil {
			t.Fatal(err)
		}
		if err := other.StartStep(t.Context(), "1", nil); err != nil {
			t.Fatal(err)
		}
		stop := w.work(t, w.s)
		if _, err := w.s.Enqueue(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		stop()
		// The running check goes beside the session's start; nothing
		// after it (no release to queued, no final check).
		if got := w.statuses(j); len(got) > 1 || (len(got) == 1 && got[0] != "running") {
			t.Errorf("a fenced run's checks: %v, want at most the running one written beside its start", got)
		}
		if len(w.store.Runs()) != 0 {
			t.Errorf("a fenced run is in state.json: %v", w.store.Runs())
		}
		if left, _ := os.ReadDir(w.facts.RunsDir); len(left) != 0 {
			t.Errorf("run directories left: %v", left)
		}
		if got := w.exec.Running(); len(got) != 1 || got[0] != id {
			t.Errorf("sessions going %v, want the other process's %s alone", got, id)
		}
		close(gate)
	})
}

// TestQueuedSaysWhatWaitsAhead: a queued check says how many runs were
// waiting ahead of it when it was written (left out when none), and the
// record is one the check lexicon takes.
func TestQueuedSaysWhatWaitsAhead(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		gate := make(chan struct{})
		w.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: gate} }
		stop := w.work(t, w.s)
		var jobs []*job.Job
		for i := range 4 {
			ev := rig.Push(fmt.Sprintf("3k%d", i), fmt.Sprintf("c%d", i))
			ev.Ref = fmt.Sprintf("refs/heads/b%d", i) // none supersedes another
			j := w.runnable(ev, "ci", "make")
			jobs = append(jobs, j)
			if _, err := w.s.Enqueue(t.Context(), j); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		checks := w.pds.Checks()
		for i, want := range []int64{-1, 0, 1, 2} {
			c := checks[jobs[i].Key]
			switch {
			case want < 0 && c.Status != "running":
				t.Errorf("job %d: %s, want running (a worker was free)", i, c.Status)
			case want >= 0 && (c.Status != "queued" || c.QueuedBehind != want):
				t.Errorf("job %d: %s with %d waiting ahead, want queued with %d", i, c.Status, c.QueuedBehind, want)
			}
		}
		// The lexicon takes it (the rig's commits are short: a real one).
		c := checks[jobs[3].Key]
		c.Subject.Commit = strings.Repeat("c", 40)
		cat, err := pdsclient.NewCatalog()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cat.Encode(forge.CollectionCheck, c); err != nil {
			t.Errorf("the lexicon refuses a queued check that says what waits ahead: %v", err)
		}
		close(gate)
		synctest.Wait()
		stop()
	})
}

// TestConcurrencyGroup: with two workers, pushes (to branches of their
// own) of a workflow whose concurrency group is one: one run of the
// group at a time. Without cancel-in-progress the second waits, queued,
// while the first runs, and a third replaces it while it waits
// (cancelled); with it, each newer run cancels the one running and runs
// once it has stopped.
func TestConcurrencyGroup(t *testing.T) {
	t.Parallel()
	for _, cancelInProgress := range []bool{false, true} {
		t.Run(fmt.Sprintf("cancel-in-progress %v", cancelInProgress), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t)
				w.cfg.Concurrency = 2
				w.s = New(w.cfg, w.facts, w.ports, nil)
				gate := make(chan struct{})
				w.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: gate} }
				stop := w.work(t, w.s)
				var jobs []*job.Job
				push := func(i int) {
					ev := rig.Push(fmt.Sprintf("3k%d", i), fmt.Sprintf("c%d", i))
					ev.Ref = fmt.Sprintf("refs/heads/b%d", i) // no push supersedes another
					j := w.runnable(ev, "deploy", "make deploy")
					j.Workflow.Concurrency = &workflow.Concurrency{Group: "deploy", CancelInProgress: cancelInProgress}
					jobs = append(jobs, j)
					if _, err := w.s.Enqueue(t.Context(), j); err != nil {
						t.Fatal(err)
					}
					synctest.Wait()
				}
				want := func(when string, i int, statuses ...string) {
					t.Helper()
					if got := w.statuses(jobs[i]); !cmp.Equal(got, statuses) {
						t.Errorf("%s: run %d %v, want %v", when, i, got, statuses)
					}
				}
				push(0)
				push(1)
				push(2)
				if !cancelInProgress {
					want("three runs of one group, two workers", 0, "running")
					want("three runs of one group, two workers", 1, "queued", "cancelled")
					want("three runs of one group, two workers", 2, "queued")
				} else {
					want("three runs of one group, two workers", 0, "running", "cancelled")
					want("three runs of one group, two workers", 1, "queued", "running", "cancelled")
					want("three runs of one group, two workers", 2, "queued", "running")
				}
				close(gate)
				synctest.Wait()
				stop()
				if !cancelInProgress {
					want("at the end", 0, "running", "success")
					want("at the end", 2, "queued", "running", "success")
				} else {
					want("at the end", 2, "queued", "running", "success")
				}
			})
		})
	}
}
