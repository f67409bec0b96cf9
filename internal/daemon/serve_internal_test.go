package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/parts/intake"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// The whole daemon served on the rig: the parts wired as Run wires
// them, with the outside in memory and time in a synctest bubble.

func TestServeRunsAPush(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.exec.Script = func(_, id string) fakeexec.Step { return fakeexec.Step{Output: "step " + id + "\n"} }
		h.exec.Outputs = map[string]string{"plot.png": "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "notes.txt": "text",
			"private.png": "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"}
		pullsOnly := rig.CI("pulls-only")
		pullsOnly.On = []workflow.Trigger{workflow.Pull}
		ci := rig.CI("ci", "make", "make test")
		ci.Artifacts = []string{"plot.png", "notes.txt"} // private.png is not published
		h.git.SetWorkflows(ci, pullsOnly)
		ev := rig.Push("3k1", "c1")
		h.lister.Set(ev)
		stop := h.serve(t)
		synctest.Wait()
		stop()

		// A worker was free: the check's first record is its running one.
		if diff := cmp.Diff([]string{"running", "success"}, h.statuses(ev, "ci")); diff != "" {
			t.Errorf("check statuses (-want +got):\n%s", diff)
		}
		c := h.final(ev, "ci")
		if c.Log == nil || len(c.Steps) != 2 || c.Steps[1].Status != "success" {
			t.Errorf("final check: log %v, steps %+v", c.Log, c.Steps)
		}
		if len(c.Outputs) != 1 || c.Outputs[0].Path != "plot.png" {
			t.Errorf("outputs %+v, want the image alone", c.Outputs)
		}
		if len(h.statuses(ev, "pulls-only")) != 0 {
			t.Error("a workflow for pulls only got a check on a push")
		}
		st := h.saved(t)
		if _, done := st.Done[ev.Key()]; !done || len(st.Runs) != 0 {
			t.Errorf("state.json: done %v, runs %v", st.Done, st.Runs)
		}
		if _, seen := st.Repos[rig.Repo]; !seen {
			t.Error("the repository is not noted in state.json")
		}
		if !h.notes.has("READY=1") || !h.notes.has("STOPPING=1") {
			t.Errorf("notifications %q", h.notes.msgs)
		}
		if left, _ := os.ReadDir(filepath.Join(h.cfg.CacheDir, "runs")); len(left) != 0 {
			t.Errorf("run directories left: %v", left)
		}
	})
}

// What cannot run gets one final error check, and the event is done:
// a failing step, a pull that does not merge, a refused source, an
// unreadable workflow file, an executor that is down, a pull over the
// operator's maximums.
func TestServeErrorChecks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		ev       work.Event
		setup    func(t *testing.T, h *harness)
		workflow string
		status   string
		errHas   string
	}{
		{"failing step", rig.Push("3k1", "c1"), func(_ *testing.T, h *harness) {
			h.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Output: "boom\n", Code: 3} }
		}, "ci", "failure", `step "ci-a" exited with code 3`},
		{"conflict", rig.Pull("did:plc:author", "3p1", "h1"), func(_ *testing.T, h *harness) { h.git.Conflict = true },
			"ci", "error", "merge conflict"},
		{"refused source", rig.Push("3k1", "c1"), func(_ *testing.T, h *harness) {
			h.git.FetchErr = fmt.Errorf("source file:///etc: %w", mirror.ErrRefused)
		}, intake.RefusedCheck, "error", "file:///etc"},
		{"invalid workflow file", rig.Push("3k1", "c1"), func(_ *testing.T, h *harness) {
			h.git.Bad = []error{workflow.Errors{{Position: workflow.Position{File: ".knotless/workflows/lint.yml", Line: 3}, Msg: "steps: required"}}}
		}, "lint", "error", "invalid workflow file"},
		{"executor down", rig.Push("3k1", "c1"), func(_ *testing.T, h *harness) {
			h.exec.SetSweepErr(errors.New("cluster unreachable"))
		}, "ci", "error", "executor fake unavailable: sweep orphaned sessions: cluster unreachable"},
		{"pull over the operator's maximum", rig.Pull("did:plc:author", "3p1", "h1"), func(t *testing.T, h *harness) {
			h.git.Workflows[0].Image = "evil.test/miner"
			h.cfg.Engine.Max = run.Maximums{Images: []string{"registry.test/*"}}
			h.rewire(t)
		}, "ci", "error", "is not allowed by --allow-image"},
		{"untrusted run asks for a secret", rig.Pull("did:plc:author", "3p1", "h1"), func(_ *testing.T, h *harness) {
			h.git.Workflows[0].Secrets = []string{"TOKEN"}
		}, "ci", "success", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t)
				h.git.SetWorkflows(rig.CI("ci", "make"))
				tc.setup(t, h)
				h.lister.Set(tc.ev)
				h.serveUntilIdle(t)
				c := h.final(tc.ev, tc.workflow)
				if c.Status != tc.status || !strings.Contains(c.Error, tc.errHas) {
					t.Errorf("check %s: status %q, error %q; want %q with %q", tc.workflow, c.Status, c.Error, tc.status, tc.errHas)
				}
				if _, done := h.saved(t).Done[tc.ev.Key()]; !done {
					t.Error("the event is not done")
				}
			})
		})
	}
}

// A newer push to the same ref, seen while the older one runs, cancels
// it: its check says so, and the newer one runs.
func TestServeSupersedesARunningPush(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		never := make(chan struct{})
		first := rig.Push("3k1", "c1")
		h.exec.Script = func(runID, _ string) fakeexec.Step {
			if s := h.exec.Session(runID); s != nil && s.Spec().Annotations["knotless.dev/event"] == string(first.URI) {
				return fakeexec.Step{Gate: never}
			}
			return fakeexec.Step{}
		}
		h.git.SetWorkflows(rig.CI("ci", "make"))
		h.lister.Set(first)
		stop := h.serve(t)
		synctest.Wait()
		if got := h.statuses(first, "ci"); !cmp.Equal(got, []string{"running"}) {
			t.Fatalf("first push: %v", got)
		}
		second := rig.Push("3k2", "c2")
		h.lister.Set(first, second)
		h.d.intake.Wake()
		synctest.Wait()
		stop()
		if c := h.final(first, "ci"); c.Status != "cancelled" || c.Error != "superseded by "+string(second.URI) {
			t.Errorf("first push: status %q, error %q", c.Status, c.Error)
		}
		if c := h.final(second, "ci"); c.Status != "success" {
			t.Errorf("second push: %q", c.Status)
		}
	})
}

// A pull's author has at most QueuedPerAuthor runs in hand: the next
// waits, without a check, and goes when one ends.
func TestServeAuthorCap(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.Intake.Caps.QueuedPerAuthor = 1 })
		gate := make(chan struct{})
		h.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: gate} }
		h.git.SetWorkflows(rig.CI("ci", "make"))
		a, b := rig.Pull("did:plc:author", "3p1", "h1"), rig.Pull("did:plc:author", "3p2", "h2")
		h.lister.Set(a, b)
		stop := h.serve(t)
		synctest.Wait()
		if got := h.statuses(b, "ci"); len(got) != 0 {
			t.Errorf("the pull over its author's cap has checks %v", got)
		}
		close(gate)
		synctest.Wait()
		stop()
		for _, ev := range []work.Event{a, b} {
			if c := h.final(ev, "ci"); c.Status != "success" {
				t.Errorf("%s: %q", ev.URI, c.Status)
			}
		}
	})
}

// At SIGTERM a run going on an executor that resumes sessions is handed
// over: state.json keeps it, with its log; the successor adopts it
// before READY=1 and writes its one final check.
func TestServeHandsOverAndAdopts(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		gate := make(chan struct{})
		h.exec.Script = func(_, id string) fakeexec.Step {
			if id == "1" {
				return fakeexec.Step{Output: "before the handover\n", Gate: gate}
			}
			return fakeexec.Step{Output: "after\n"}
		}
		h.git.SetWorkflows(rig.CI("ci", "make", "make test"))
		ev := rig.Push("3k1", "c1")
		h.lister.Set(ev)
		h.serveUntilIdle(t)
		if got := h.statuses(ev, "ci"); !cmp.Equal(got, []string{"running"}) {
			t.Fatalf("before the handover: %v", got)
		}
		key := forge.CheckKey(ev.Subject(), "ci")
		handed, ok := h.saved(t).Runs[key]
		if !ok || handed.Handover == nil {
			t.Fatalf("state.json runs %+v: want the run handed over", h.saved(t).Runs)
		}
		if _, err := os.Stat(filepath.Join(h.cfg.CacheDir, "runs", handed.RunID, "handover.log")); err != nil {
			t.Errorf("the handed-over run's log: %v", err)
		}

		next := h.successor(t)
		if swept := h.exec.Swept(); !cmp.Equal(swept[len(swept)-1], []string{handed.RunID}) {
			t.Errorf("sweep kept %v, want the adopted run", swept)
		}
		close(gate)
		stop := serve(t, next)
		synctest.Wait()
		if running, _, _ := next.sched.Counts(); running != 0 {
			t.Errorf("%d running after the adopted run ended", running)
		}
		stop()
		if got := h.statuses(ev, "ci"); !cmp.Equal(got, []string{"running", "success"}) {
			t.Errorf("after adoption: %v", got)
		}
		if len(h.saved(t).Runs) != 0 {
			t.Error("the adopted run is still in state.json")
		}
	})
}

// At SIGTERM on an executor that cannot resume, a run still going at
// the stop wait is cancelled and its check released (queued again); a
// queued one is released at once. The handover takes the stop wait,
// telling systemd to extend its timeout meanwhile.
func TestServeReleasesAtStopWait(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.StopWait = time.Minute })
		h.cfg.Engine.Executor = noResume{h.exec}
		h.rewire(t)
		never := make(chan struct{})
		h.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: never} }
		h.git.SetWorkflows(rig.CI("ci", "make"))
		going, waiting := rig.Push("3k1", "c1"), rig.Pull("did:plc:author", "3p1", "h1")
		h.lister.Set(going, waiting)
		stop := h.serve(t)
		synctest.Wait()
		start := time.Now()
		stop()
		if waited := time.Since(start); waited != time.Minute {
			t.Errorf("handover took %s, want the stop wait", waited)
		}
		if got := h.statuses(going, "ci"); !cmp.Equal(got, []string{"running", "queued"}) {
			t.Errorf("statuses %v, want released to queued", got)
		}
		if c := h.final(going, "ci"); !strings.Contains(c.Error, "released by a stopping runner") {
			t.Errorf("released check's error %q", c.Error)
		}
		if got := h.statuses(waiting, "ci"); !cmp.Equal(got, []string{"queued"}) {
			t.Errorf("the waiting pull: %v, want its queued check alone", got)
		}
		for _, ev := range []work.Event{going, waiting} {
			if _, done := h.saved(t).Done[ev.Key()]; done {
				t.Errorf("released work %s is done", ev.URI)
			}
		}
		for _, want := range []string{"STOPPING=1", "EXTEND_TIMEOUT_USEC=", "STATUS=stopping: 1 running"} {
			if !h.notes.has(want) {
				t.Errorf("no %q notified; got %v", want, h.notes.msgs)
			}
		}
	})
}

// A run cancelled at the stop wait goes to the successor: its
// if: always() step does not run after the cancel (the engine is told
// by the cause, run.ErrStopped), so the handover keeps the stop wait.
func TestServeRunsNoCleanupStepAtStopWait(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.StopWait = time.Minute })
		h.cfg.Engine.Executor = noResume{h.exec}
		h.rewire(t)
		never := make(chan struct{})
		var mu sync.Mutex
		var started []string
		h.exec.Script = func(_, id string) fakeexec.Step {
			mu.Lock()
			defer mu.Unlock()
			started = append(started, id)
			return fakeexec.Step{Gate: never}
		}
		wf, err := workflow.Parse(".knotless/workflows/ci.yaml", []byte("on: push\nsteps:\n  - {name: long, run: make}\n  - {name: clean, run: make clean, if: always()}\n"))
		if err != nil {
			t.Fatal(err)
		}
		h.git.SetWorkflows(wf)
		h.lister.Set(rig.Push("3k1", "c1"))
		stop := h.serve(t)
		synctest.Wait()
		start := time.Now()
		stop()
		if waited := time.Since(start); waited != time.Minute {
			t.Errorf("handover took %s, want the stop wait", waited)
		}
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(started, []string{"1"}) {
			t.Errorf("steps started %v, want the first alone", started)
		}
	})
}

// A run that ends within the stop wait is waited for, not released.
func TestServeWaitsForRunsToEnd(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.StopWait = time.Hour })
		h.cfg.Engine.Executor = noResume{h.exec}
		h.rewire(t)
		gate := make(chan struct{})
		h.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: gate} }
		h.git.SetWorkflows(rig.CI("ci", "make"))
		ev := rig.Push("3k1", "c1")
		h.lister.Set(ev)
		stop := h.serve(t)
		synctest.Wait()
		time.AfterFunc(10*time.Second, func() { close(gate) })
		start := time.Now()
		stop()
		if waited := time.Since(start); waited != 10*time.Second {
			t.Errorf("handover took %s, want 10s", waited)
		}
		if c := h.final(ev, "ci"); c.Status != "success" {
			t.Errorf("a run that ended by itself: %q", c.Status)
		}
	})
}

// A final check the PDS does not take is owed and paid by the serving
// daemon once the PDS takes writes again.
func TestServePaysOwedChecks(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.git.SetWorkflows(rig.CI("ci", "make"))
		ev := rig.Push("3k1", "c1")
		h.lister.Set(ev)
		h.pds.FailNext(nil, rig.ErrDown, rig.ErrDown)
		stop := h.serve(t)
		synctest.Wait()
		key := forge.CheckKey(ev.Subject(), "ci")
		if _, owed := h.saved(t).Owed[key]; !owed {
			t.Fatalf("the final check is not owed: writes %v, state %+v", h.pds.Writes(), h.saved(t).Owed)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		st := h.saved(t)
		if _, owed := st.Owed[key]; owed {
			t.Error("still owed")
		}
		if got := h.statuses(ev, "ci"); !cmp.Equal(got, []string{"running", "success"}) {
			t.Errorf("statuses %v", got)
		}
	})
}

// A final check owed by a process that stopped is the successor's to
// write: known final at its start, so the work does not run again.
func TestSuccessorPaysOwedChecksWithoutRunning(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.git.SetWorkflows(rig.CI("ci", "make"))
		ev := rig.Push("3k1", "c1")
		h.lister.Set(ev)
		h.pds.FailNext(nil, rig.ErrDown, rig.ErrDown)
		h.serveUntilIdle(t)
		key := forge.CheckKey(ev.Subject(), "ci")
		if _, owed := h.saved(t).Owed[key]; !owed {
			t.Fatalf("the final check is not owed: %v", h.saved(t).Owed)
		}
		next := h.successor(t)
		if !next.keeper.Final(key) {
			t.Error("the successor does not know the owed check final")
		}
		stop := serve(t, next)
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if got := h.statuses(ev, "ci"); !cmp.Equal(got, []string{"running", "success"}) {
			t.Errorf("statuses %v, want one run and its final check written once", got)
		}
		if len(h.saved(t).Owed) != 0 {
			t.Errorf("owed %v after the successor", h.saved(t).Owed)
		}
	})
}

// A sweep that fails at start leaves the daemon degraded: runs get an
// error check naming the cause, STATUS= says so, and the sweep is tried
// again until it works.
func TestWatchExecutorRecovers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.exec.SetSweepErr(errors.New("API server unreachable"))
		if err := h.d.begin(t.Context()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { h.d.watchExecutor(ctx); close(done) }()
		synctest.Wait()
		if err := h.d.executorDown(); err == nil || !strings.Contains(err.Error(), "API server unreachable") {
			t.Errorf("executorDown = %v", err)
		}
		h.d.status()
		if !h.notes.has("STATUS=0 running, 0 queued; executor degraded: sweep orphaned sessions: API server unreachable") {
			t.Errorf("status %q", h.notes.msgs)
		}
		h.exec.SetSweepErr(nil)
		time.Sleep(time.Minute)
		synctest.Wait()
		if err := h.d.executorDown(); err != nil {
			t.Errorf("still down after the sweep worked: %v", err)
		}
		cancel()
		<-done
	})
}

// A reconcile that fails is logged and tried again at the next poll; the
// watchdog is fed meanwhile.
func TestServePollsAndFeedsTheWatchdog(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.Watchdog = 10 * time.Second; c.Intake.Poll = time.Minute })
		h.lister.Fail(rig.ErrDown)
		h.git.SetWorkflows(rig.CI("ci", "make"))
		ev := rig.Push("3k1", "c1")
		h.lister.Set(ev)
		stop := h.serve(t)
		synctest.Wait()
		if len(h.pds.Writes()) != 0 {
			t.Fatal("checks written without a listing")
		}
		h.lister.Fail(nil)
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if c := h.final(ev, "ci"); c.Status != "success" {
			t.Errorf("after the next poll: %q", c.Status)
		}
		if !h.notes.has("WATCHDOG=1") {
			t.Error("the watchdog was not fed")
		}
	})
}

// STATUS= says the executor is degraded, and why.
func TestDegradedStatus(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.d.degrade(errors.New("token expired"))
	h.d.status()
	if !h.notes.has("STATUS=0 running, 0 queued; executor degraded: token expired") {
		t.Errorf("status %v", h.notes.msgs)
	}
}
