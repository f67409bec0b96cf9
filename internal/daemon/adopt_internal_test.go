package daemon

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/run"
	"knotless.dev/run/internal/state"
)

// goneExecutor knows which sessions are gone, fails the probe of some,
// and records what the sweep was told to keep.
type goneExecutor struct {
	gone, unsure map[string]bool // by session name

	mu   sync.Mutex
	kept []string
}

func (e *goneExecutor) Name() string { return "gone" }
func (e *goneExecutor) Start(context.Context, executor.Spec) (executor.Session, error) {
	return nil, executor.ErrNotImplemented
}
func (e *goneExecutor) Resume(context.Context, executor.Ref) (executor.Session, error) {
	return nil, executor.ErrNotImplemented
}
func (e *goneExecutor) Sweep(_ context.Context, keep []string) ([]executor.Ref, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.kept = append([]string(nil), keep...)
	return nil, nil
}
func (e *goneExecutor) Gone(_ context.Context, ref executor.Ref) (bool, error) {
	if e.unsure[ref.Name] {
		return false, errors.New("the API server did not answer")
	}
	return e.gone[ref.Name], nil
}

// TestAdoptSkipsGoneSessions: a handed-over run whose session is gone
// is not adopted: the sweep keeps nothing of it and state.json forgets
// it, so the reconciliation runs its work again under the same check
// key. A run whose probe fails is adopted as before; a run without a
// handover (killed mid-run) never is.
func TestAdoptSkipsGoneSessions(t *testing.T) {
	t.Parallel()
	d, _ := testDaemon(t)
	ex := &goneExecutor{gone: map[string]bool{"job-gone": true}, unsure: map[string]bool{"job-unsure": true}}
	d.cfg.Executor = ex
	handed := func(id, name string) state.Run {
		return state.Run{RunID: id, Handover: &run.Handover{Session: executor.Ref{Executor: "gone", RunID: id, Name: name}}}
	}
	d.st.Runs = map[string]state.Run{
		"k-going":  handed("r1", "job-going"),
		"k-gone":   handed("r2", "job-gone"),
		"k-unsure": handed("r3", "job-unsure"),
		"k-killed": {RunID: "r4"},
	}
	got := d.toAdopt(t.Context())
	if diff := cmp.Diff([]string{"k-going", "k-unsure"}, got); diff != "" {
		t.Errorf("runs to adopt (-want +got):\n%s", diff)
	}

	// What start does with them: the adopted runs' sessions are kept,
	// every other run is swept and forgotten.
	adopt := []*job{{key: "k-going", runID: "r1"}, {key: "k-unsure", runID: "r3"}}
	if err := d.sweep(t.Context(), adopt); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"r1", "r3"}, ex.kept); diff != "" {
		t.Errorf("sessions kept by the sweep (-want +got):\n%s", diff)
	}
	var left []string
	for key := range saved(t, d).Runs {
		left = append(left, key)
	}
	if diff := cmp.Diff([]string{"k-going", "k-unsure"}, slices.Sorted(slices.Values(left))); diff != "" {
		t.Errorf("runs in state.json after the sweep (-want +got):\n%s", diff)
	}
}

// TestAdoptWithoutProbe: an executor that cannot tell adopts every
// handed-over run.
func TestAdoptWithoutProbe(t *testing.T) {
	t.Parallel()
	d, _ := testDaemon(t)
	d.cfg.Executor = &plainExecutor{}
	d.st.Runs = map[string]state.Run{
		"k-a": {RunID: "r1", Handover: &run.Handover{}},
		"k-b": {RunID: "r2"},
	}
	if diff := cmp.Diff([]string{"k-a"}, d.toAdopt(t.Context())); diff != "" {
		t.Errorf("runs to adopt (-want +got):\n%s", diff)
	}
}

// plainExecutor is an executor without a gone probe.
type plainExecutor struct{}

func (plainExecutor) Name() string { return "plain" }
func (plainExecutor) Start(context.Context, executor.Spec) (executor.Session, error) {
	return nil, executor.ErrNotImplemented
}
func (plainExecutor) Sweep(context.Context, []string) ([]executor.Ref, error) { return nil, nil }

// TestFailureWhileStoppingReleases: a run that fails before its session
// started while the daemon stops (a signal to the whole unit ends its
// git export) comes back Detached without a handover, which runJob
// releases (its check back to queued for the successor, as
// TestStopWhilePending shows on a cluster); the same failure when not
// stopping is the run's final error.
func TestFailureWhileStoppingReleases(t *testing.T) {
	t.Parallel()
	for _, stopping := range []bool{true, false} {
		d, _ := testDaemon(t)
		d.cfg.Executor = plainExecutor{}
		d.detach = make(chan struct{})
		if stopping {
			close(d.detach)
		}
		d.faults.executorErr = errors.New("signal: terminated")
		j := pushJob("3k1", "main", "ci")
		j.runID = "r1"
		res := d.execute(t.Context(), j, t.TempDir())
		want := run.Error
		if stopping {
			want = run.Detached
		}
		if res.Status != want || res.Handover != nil {
			t.Errorf("stopping %v: status %s, handover %+v; want %s without a handover", stopping, res.Status, res.Handover, want)
		}
	}
}

// TestClaimTakesHandovers: an adopted run's handover is taken out of
// state.json as the run is adopted, so that a process killed while it
// goes on with the run leaves a run the next one sweeps and runs again,
// not a handover from a point the run has passed.
func TestClaimTakesHandovers(t *testing.T) {
	t.Parallel()
	d, _ := testDaemon(t)
	d.cfg.Executor = plainExecutor{}
	d.st.Runs = map[string]state.Run{
		"k-a": {RunID: "r1", Job: []byte(`{}`), Handover: &run.Handover{Step: 1, Started: true, Offset: 10}},
		"k-b": {RunID: "r2", Job: []byte(`{}`), Handover: &run.Handover{}},
	}
	if err := d.claim([]*job{{key: "k-a", runID: "r1"}}); err != nil {
		t.Fatal(err)
	}
	st := saved(t, d)
	if a := st.Runs["k-a"]; a.Handover != nil || a.RunID != "r1" || a.Job == nil {
		t.Errorf("the adopted run in state.json: %+v; want it kept without its handover", a)
	}
	if st.Runs["k-b"].Handover == nil {
		t.Error("a run not adopted lost its handover")
	}
	// The next process (this one killed): the adopted run is not adopted
	// again.
	next, _ := testDaemon(t)
	next.cfg.Executor = plainExecutor{}
	next.st = st
	if diff := cmp.Diff([]string{"k-b"}, next.toAdopt(t.Context())); diff != "" {
		t.Errorf("runs to adopt after a kill (-want +got):\n%s", diff)
	}
}
