package scheduler

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/rules/job"
)

// A job that comes while a worker is free gets no queued record: its
// running record is its check's first. One that waits for a worker
// shows it, queued.
func TestQueuedOnlyWhenItWaits(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		gate := make(chan struct{})
		w.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: gate} }
		stop := w.work(t, w.s)
		first := w.runnable(rig.Push("3k1", "c1"), "a", "make")
		second := w.runnable(rig.Push("3k1", "c1"), "b", "make")
		if _, err := w.s.Enqueue(t.Context(), first); err != nil {
			t.Fatal(err)
		}
		if _, err := w.s.Enqueue(t.Context(), second); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := w.statuses(second); !slices.Equal(got, []string{"queued"}) {
			t.Errorf("the job waiting for the one worker: %v, want queued", got)
		}
		close(gate)
		synctest.Wait()
		stop()
		if diff := cmp.Diff([]string{"running", "success"}, w.statuses(first)); diff != "" {
			t.Errorf("the job taken at once (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"queued", "running", "success"}, w.statuses(second)); diff != "" {
			t.Errorf("the job that waited (-want +got):\n%s", diff)
		}
	})
}

// The free workers, as the queue counts them: idle ones, but those an
// unwritten task waits for, and none while paused or stopped; an
// unwritten task is claimed before any other, pushes before pulls.
func TestQueueFree(t *testing.T) {
	t.Parallel()
	q := newQueue()
	q.idle = 2
	pull := &task{Job: pullJob("did:plc:a", "3p1", "h1", "ci")}
	q.add(pull)
	if q.free() != 2 {
		t.Errorf("free %d with a written task waiting, want 2", q.free())
	}
	promised := &task{Job: pullJob("did:plc:a", "3p2", "h2", "ci"), unwritten: true}
	q.add(promised)
	if q.free() != 1 {
		t.Errorf("free %d with one task promised a worker, want 1", q.free())
	}
	push := &task{Job: pushJob("3k1", "main", "ci")}
	q.add(push)
	if got := q.claim(); got != promised {
		t.Errorf("claimed %v first, want the unwritten task", got.Key)
	}
	if got := q.claim(); got != push {
		t.Errorf("claimed %v, want the push before the pull", got.Key)
	}
	q.paused = 1
	if q.free() != 0 || q.claim() != nil {
		t.Error("a paused queue has free workers or gives a task")
	}
}

// The run's session starts while its running check is written and its
// tree exported (the PDS is held): it does not wait for them; and a
// sweep meanwhile, before the run is recorded in state.json, keeps it.
func TestSessionStartsBesideTheRunningWrite(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		hold := make(chan struct{})
		w.pds.Hold(hold)
		j := w.runnable(rig.Push("3k1", "c1"), "ci", "make")
		stop := w.work(t, w.s)
		if _, err := w.s.Enqueue(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		started := w.exec.Running()
		if len(started) != 1 {
			t.Fatalf("sessions %v while the running check is written, want the run's", started)
		}
		if exported := w.git.Exported(); len(exported) != 1 {
			t.Errorf("exported %v while the running check is written, want the run's tree", exported)
		}
		if _, ok := w.store.Run(j.Key); ok {
			t.Fatal("the run is recorded before its running check is written")
		}
		if err := w.s.Resweep(t.Context()); err != nil {
			t.Fatal(err)
		}
		if swept := w.exec.Swept(); !slices.Contains(swept[len(swept)-1], started[0]) {
			t.Errorf("the sweep kept %v, not the run whose session is starting (%s)", swept[len(swept)-1], started[0])
		}
		close(hold)
		synctest.Wait()
		stop()
		if diff := cmp.Diff([]string{"running", "success"}, w.statuses(j)); diff != "" {
			t.Errorf("statuses (-want +got):\n%s", diff)
		}
	})
}

// A run whose tree does not export gives its session up (Begin started
// it): the run ends error and no session is left going.
func TestExportFailureStopsTheBegunSession(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		j := w.runnable(rig.Push("3k1", "c1"), "ci", "make")
		j.Repo = failingExport{j.Repo}
		stop := w.work(t, w.s)
		if _, err := w.s.Enqueue(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		stop()
		if got := w.statuses(j); !slices.Equal(got, []string{"running", "error"}) {
			t.Errorf("statuses %v, want running, error", got)
		}
		for _, id := range w.exec.Running() {
			if s := w.exec.Session(id); s != nil && !s.Stopped() {
				t.Errorf("session of run %s left going", id)
			}
		}
	})
}

// failingExport is a repository whose tree does not export.
type failingExport struct{ job.Repo }

func (failingExport) Export(context.Context, string, string) error {
	return errors.New("git archive: broken pipe")
}

// Sweeps sweeps again soon after a clean-up failed (a session that
// could not be removed after its verdict), and every SweepEvery.
func TestSweepsAfterACleanupFailed(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		w.exec.StopErr = errors.New(`jobs.batch "knotless-r" is forbidden`)
		cleaner := run.NewCleaner(nil)
		w.ports.Engine = run.New(run.Config{Executor: w.exec, Runner: rig.Runner, Cleaner: cleaner})
		w.facts.Executor = executor.CapabilitiesOf(w.exec)
		w.s = New(w.cfg, w.facts, w.ports, nil)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); w.s.Sweeps(ctx, cleaner.Failures) }()
		stop := w.work(t, w.s)
		j := w.runnable(rig.Push("3k1", "c1"), "ci", "make")
		if _, err := w.s.Enqueue(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if err := cleaner.Wait(t.Context()); err != nil || cleaner.Failures() != 1 {
			t.Fatalf("clean-up: %v, %d failed; want one failure", err, cleaner.Failures())
		}
		if got := w.statuses(j); !slices.Equal(got, []string{"running", "success"}) {
			t.Errorf("statuses %v: a failed clean-up changed the verdict", got)
		}
		before := len(w.exec.Swept())
		synctest.Wait()
		// The failure is seen within failureCheck.
		<-time.After(failureCheck)
		synctest.Wait()
		if n := len(w.exec.Swept()); n != before+1 {
			t.Errorf("%d sweeps after the failed clean-up, want 1", n-before)
		}
		if s := w.exec.Running(); len(s) != 0 {
			t.Errorf("sessions left after the sweep: %v", s)
		}
		<-time.After(SweepEvery)
		synctest.Wait()
		if n := len(w.exec.Swept()); n != before+2 {
			t.Errorf("%d sweeps after SweepEvery, want 2 in all", n-before)
		}
		cancel()
		<-done
		stop()
	})
}
