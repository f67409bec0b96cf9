package daemon

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"knotless.dev/run/internal/parts/rig"
)

// The verdict before the clean-up, in serve: the final check is written
// while the run's session is still being removed; a stop waits for the
// removal (up to cleanupWait), so nothing is left behind.
func TestServeVerdictBeforeCleanup(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		gate := make(chan struct{})
		h.exec.StopGate = gate
		h.git.SetWorkflows(rig.CI("ci", "make"))
		ev := rig.Push("3k1", "c1")
		h.lister.Set(ev)
		stop := h.serve(t)
		synctest.Wait()
		if c := h.final(ev, "ci"); c.Status != "success" {
			t.Fatalf("check %q while the session's removal is held, want success", c.Status)
		}
		runs := h.exec.Running()
		if len(runs) != 1 {
			t.Fatalf("sessions %v, want the run's, still being removed", runs)
		}
		time.AfterFunc(10*time.Second, func() { close(gate) })
		start := time.Now()
		stop()
		if waited := time.Since(start); waited != 10*time.Second {
			t.Errorf("the stop waited %s for the clean-up, want 10s", waited)
		}
		if s := h.exec.Session(runs[0]); !s.Stopped() {
			t.Error("the session is left after the stop")
		}
	})
}

// A clean-up that does not end by cleanupWait does not hold the stop
// longer: it is cut short, and what it left is the next sweep's.
func TestServeStopCutsAHungCleanupShort(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.exec.StopGate = make(chan struct{}) // never opens
		h.git.SetWorkflows(rig.CI("ci", "make"))
		ev := rig.Push("3k1", "c1")
		h.lister.Set(ev)
		stop := h.serve(t)
		synctest.Wait()
		start := time.Now()
		stop()
		if waited := time.Since(start); waited != cleanupWait {
			t.Errorf("the stop waited %s, want cleanupWait (%s)", waited, cleanupWait)
		}
		if c := h.final(ev, "ci"); c.Status != "success" {
			t.Errorf("check %q, want success", c.Status)
		}
	})
}

// A clean-up that fails (the Job's delete refused) keeps the verdict,
// and the daemon sweeps soon after: the session is removed without
// waiting for the next start.
func TestServeSweepsAfterAFailedCleanup(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.exec.StopErr = errors.New(`jobs.batch "knotless-r" is forbidden`)
		h.git.SetWorkflows(rig.CI("ci", "make"))
		ev := rig.Push("3k1", "c1")
		h.lister.Set(ev)
		stop := h.serve(t)
		synctest.Wait()
		if c := h.final(ev, "ci"); c.Status != "success" {
			t.Errorf("check %q, want success: a failed clean-up is not the work's", c.Status)
		}
		sweeps := len(h.exec.Swept())
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if n := len(h.exec.Swept()); n <= sweeps {
			t.Errorf("no sweep after the failed clean-up (%d before, %d after)", sweeps, n)
		}
		if left := h.exec.Running(); len(left) != 0 {
			t.Errorf("sessions left: %v", left)
		}
	})
}
