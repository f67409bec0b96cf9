package scheduler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/workflow"
)

// liveTap keeps the one live stream of a check and the run it was
// opened and ended for.
type liveTap struct {
	mu            sync.Mutex
	log           bytes.Buffer
	opened, ended []string
	results       []*run.Result
}

func (tp *liveTap) Open(_ *job.Job, runID string, _ []byte, _ *run.Handover) io.Writer {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.opened = append(tp.opened, runID)
	return writerFunc(func(p []byte) (int, error) {
		tp.mu.Lock()
		defer tp.mu.Unlock()
		return tp.log.Write(p)
	})
}

func (tp *liveTap) Ended(_ *job.Job, runID string, res *run.Result, _ string) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.ended = append(tp.ended, runID)
	tp.results = append(tp.results, res)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestRetry: a run lost to the infrastructure (a step's pod evicted, or
// its session's start refused) is tried again, each try its own run (its
// own id, so its own session), up to the workflow's max, within one
// check that says how many tries ran; a failing step is tried again
// only when the workflow retries when: always.
func TestRetry(t *testing.T) {
	t.Parallel()
	evicted := executor.Lost(errors.New("pod p was disrupted while the step ran (Evicted)"))
	for _, tc := range []struct {
		name  string
		retry *workflow.Retry
		// step is what try n's (1, 2, ...) step does; startErr, when
		// set, fails every session's start.
		step     func(try int) fakeexec.Step
		startErr error
		status   string
		tries    int
		retried  string // the reason each retry was observed with
		logHas   []string
	}{
		{"lost twice, then done", &workflow.Retry{Max: 2, When: workflow.RetryInfrastructure},
			func(try int) fakeexec.Step {
				if try < 3 {
					return fakeexec.Step{Output: fmt.Sprintf("try %d\n", try), Err: evicted}
				}
				return fakeexec.Step{Output: "try 3\n"}
			}, nil, "success", 3, "infrastructure",
			[]string{"try 1\n", "knotless-run: attempt 2 of 3: attempt 1 was lost to the infrastructure: follow step ci-a: pod p was disrupted while the step ran (Evicted)\n",
				"try 2\n", "knotless-run: attempt 3 of 3: attempt 2 was lost", "try 3\n"}},
		{"lost every time: bounded by max", &workflow.Retry{Max: 2, When: workflow.RetryInfrastructure},
			func(int) fakeexec.Step { return fakeexec.Step{Err: evicted} }, nil, "error", 3, "infrastructure",
			[]string{"attempt 3 of 3: attempt 2 was lost"}},
		{"a session's start lost", &workflow.Retry{Max: 1, When: workflow.RetryInfrastructure},
			nil, evicted, "error", 2, "infrastructure",
			[]string{"attempt 2 of 2: attempt 1 was lost to the infrastructure: start session of workflow ci: pod p was disrupted"}},
		{"a failing step is not retried", &workflow.Retry{Max: 2, When: workflow.RetryInfrastructure},
			func(int) fakeexec.Step { return fakeexec.Step{Code: 1} }, nil, "failure", 1, "", nil},
		{"a step's stream broken is not the infrastructure's", &workflow.Retry{Max: 2, When: workflow.RetryInfrastructure},
			func(int) fakeexec.Step { return fakeexec.Step{Err: errors.New("stream broke")} }, nil, "error", 1, "", nil},
		{"without retry, a lost run is not retried", nil,
			func(int) fakeexec.Step { return fakeexec.Step{Err: evicted} }, nil, "error", 1, "", nil},
		{"a failing step, when: always", &workflow.Retry{Max: 2, When: workflow.RetryAlways},
			func(int) fakeexec.Step { return fakeexec.Step{Code: 1} }, nil, "failure", 3, "failure",
			[]string{"attempt 2 of 3: attempt 1 ended failure: step \"ci-a\" exited with code 1\n"}},
		{"when: always, a success is not retried", &workflow.Retry{Max: 2, When: workflow.RetryAlways},
			func(int) fakeexec.Step { return fakeexec.Step{} }, nil, "success", 1, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				w := newWorld(t)
				obs, tp := &observer{}, &liveTap{}
				w.ports.Observer, w.ports.Tap = obs, tp
				w.s = New(w.cfg, w.facts, w.ports, nil)
				j := w.runnable(rig.Push("3k1", "c1"), "ci", "make")
				j.Workflow.Retry = tc.retry
				// The try a run id is, from the ids the tries get.
				tryOf := map[string]int{}
				for n := 1; n <= 6; n++ {
					tryOf[run.IDFor(rig.Runner, TryKey(j.Key, n))] = n
				}
				var startsMu sync.Mutex
				var starts []string
				w.exec.OnStart = func(spec executor.Spec) {
					startsMu.Lock()
					starts = append(starts, spec.RunID)
					startsMu.Unlock()
				}
				w.exec.StartErr = tc.startErr
				if tc.step != nil {
					w.exec.Script = func(runID, _ string) fakeexec.Step { return tc.step(tryOf[runID]) }
				}
				stop := w.work(t, w.s)
				if _, err := w.s.Enqueue(t.Context(), j); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				stop()

				if diff := cmp.Diff([]string{"running", tc.status}, w.statuses(j)); diff != "" {
					t.Errorf("statuses (-want +got):\n%s", diff)
				}
				want := []string{"queued ci", "started ci"}
				for range tc.tries - 1 {
					want = append(want, "retried ci "+tc.retried)
				}
				want = append(want, "ended ci "+tc.status)
				if diff := cmp.Diff(want, obs.events); diff != "" {
					t.Errorf("observed (-want +got):\n%s", diff)
				}
				// Each try its own run: the ids of tries 1..n, in order.
				var wantStarts []string
				for n := 1; n <= tc.tries; n++ {
					wantStarts = append(wantStarts, run.IDFor(rig.Runner, TryKey(j.Key, n)))
				}
				if diff := cmp.Diff(wantStarts, starts); diff != "" {
					t.Errorf("sessions started (-want +got):\n%s", diff)
				}
				if got := w.exec.Running(); len(got) != 0 {
					t.Errorf("sessions left going: %v", got)
				}
				wantTries := int64(tc.tries)
				if tc.tries == 1 {
					wantTries = 0
				}
				if c := w.pds.Checks()[j.Key]; c.Tries != wantTries {
					t.Errorf("the final check says %d tries, want %d", c.Tries, wantTries)
				}
				// One live stream, opened and ended for the first try's run.
				if diff := cmp.Diff([]string{wantStarts[0]}, tp.opened); diff != "" {
					t.Errorf("live streams opened (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]string{wantStarts[0]}, tp.ended); diff != "" {
					t.Errorf("live streams ended (-want +got):\n%s", diff)
				}
				if len(tp.results) == 1 {
					res := tp.results[0]
					for _, s := range tc.logHas {
						if !bytes.Contains(res.Log, []byte(s)) {
							t.Errorf("the final log lacks %q:\n%s", s, res.Log)
						}
						if !strings.Contains(tp.log.String(), s) {
							t.Errorf("the live stream lacks %q:\n%s", s, tp.log.String())
						}
					}
					if int(res.LogSize) != len(res.Log) || tp.log.Len() != len(res.Log) {
						t.Errorf("log size %d, log %d bytes, live stream %d bytes: want one length", res.LogSize, len(res.Log), tp.log.Len())
					}
					if !strings.HasPrefix(tp.log.String(), "knotless-run: workflow ci") {
						t.Errorf("the live stream does not begin with the first try's log:\n%s", tp.log.String())
					}
				}
				if len(w.store.Runs()) != 0 {
					t.Errorf("runs left in state.json: %v", w.store.Runs())
				}
				if left, _ := os.ReadDir(w.facts.RunsDir); len(left) != 0 {
					t.Errorf("run directories left: %v", left)
				}
			})
		})
	}
}

// TestRetryKeepsOneRunInState: while a retry goes, state.json has the
// work once, under the retry's run id; the check is not written again
// as running.
func TestRetryKeepsOneRunInState(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		w.s = New(w.cfg, w.facts, w.ports, nil)
		j := w.runnable(rig.Push("3k1", "c1"), "ci", "make")
		j.Workflow.Retry = &workflow.Retry{Max: 1, When: workflow.RetryInfrastructure}
		first, second := run.IDFor(rig.Runner, j.Key), run.IDFor(rig.Runner, TryKey(j.Key, 2))
		gate := make(chan struct{})
		w.exec.Script = func(runID, _ string) fakeexec.Step {
			if runID == first {
				return fakeexec.Step{Err: executor.Lost(errors.New("node n is gone"))}
			}
			return fakeexec.Step{Gate: gate}
		}
		stop := w.work(t, w.s)
		if _, err := w.s.Enqueue(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		runs := w.store.Runs()
		if r, ok := w.store.Run(j.Key); len(runs) != 1 || !ok || r.RunID != second {
			t.Errorf("state.json's runs while the retry goes: %+v, want the work once, as run %s", runs, second)
		}
		if got := w.exec.Running(); len(got) != 1 || got[0] != second {
			t.Errorf("sessions going %v, want the retry's %s alone", got, second)
		}
		if left, _ := os.ReadDir(w.facts.RunsDir); len(left) > 1 || (len(left) == 1 && left[0].Name() != second) {
			t.Errorf("run directories while the retry goes: %v, want at most the retry's", left)
		}
		if diff := cmp.Diff([]string{"running"}, w.statuses(j)); diff != "" {
			t.Errorf("statuses while the retry goes (-want +got):\n%s", diff)
		}
		close(gate)
		synctest.Wait()
		stop()
		if diff := cmp.Diff([]string{"running", "success"}, w.statuses(j)); diff != "" {
			t.Errorf("statuses (-want +got):\n%s", diff)
		}
	})
}

// claimTries are the Drivers of a replica whose runs' Jobs are only the
// second try's of one check (by its run ID): claimed, with no checkpoint.
type claimTries struct {
	mu      sync.Mutex
	there   string // the run ID whose Job is there
	claimed []string
	dropped []string
}

func (d *claimTries) Save(context.Context, string, []byte) error { return nil }
func (d *claimTries) Claim(_ context.Context, runID string) ([]byte, bool, time.Time, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.claimed = append(d.claimed, runID)
	if runID != d.there {
		return nil, false, time.Time{}, fmt.Errorf("claim run %s: %w", runID, executor.ErrSessionGone)
	}
	return nil, true, time.Time{}, nil
}
func (d *claimTries) Drop(_ context.Context, runID string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dropped = append(d.dropped, runID)
	return nil
}
func (d *claimTries) Forget(string) {}

// A retried run whose driver died during its second try: the survivor's
// takeover finds the second try's Job (the first try's is gone), claims
// it and, no step of it having started, queues the check again before it
// drops that Job. Looking for the first try's Job only, it found none
// and left the run to its dead driver: running for ever.
func TestTakeOverFindsTheTryGoing(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	j := w.runnable(rig.Push("3k1", "c1"), "ci", "make")
	j.Workflow.Retry = &workflow.Retry{Max: 2}
	second := run.IDFor(rig.Runner, TryKey(j.Key, 2))
	d := &claimTries{there: second}
	w.ports.Drivers = d
	w.s = New(w.cfg, w.facts, w.ports, nil)
	w.work(t, w.s)
	c, _ := w.keeper.Unqueued(j.Key, j.Event, j.Workflow.Name)
	w.keeper.Running(t.Context(), j.Key, c, time.Now(), w.s.log) // the dead driver's
	if w.s.TakeOver(t.Context(), j) {
		t.Fatal("TakeOver handled the run: want it queued again here (its try had started no step)")
	}
	first := run.IDFor(rig.Runner, j.Key)
	if diff := cmp.Diff([]string{first, second}, d.claimed); diff != "" {
		t.Errorf("claims (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{second}, d.dropped); diff != "" {
		t.Errorf("dropped (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"running", "queued"}, w.statuses(j)); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
}
