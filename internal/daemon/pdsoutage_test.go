package daemon_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/tests/pds"
)

// TestPDSOutage: the runner's PDS itself goes away (its process killed,
// not a proxy answering for it) while a run goes on, and the run ends
// during the outage. Its final check is owed: state.json says so, and it
// is tried again with backoff while the PDS is down. Once the PDS is back
// on the same port and data, the check lands: exactly one final check,
// and the work ran once.
func TestPDSOutage(t *testing.T) {
	t.Parallel()
	needPDS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	own, err := pds.StartSplit(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Stop)
	w := newWorldOn(t, own)
	gate := t.TempDir()
	_, commit := w.Push(map[string]string{".knotless/workflows/gated.yaml": gatedWorkflow(gate)})
	w.start(w.config(func(c *daemon.Config) {
		c.Retry = daemon.Retry{Backoff: 200 * time.Millisecond, MaxBackoff: time.Second}
	}))
	waitUntil(t, "the running check", 90*time.Second, func() bool { return slices.Contains(w.checkLog.statuses("gated", commit), "running") })

	if err := own.StopPDS(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gate, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	owed := func() (state.Owed, bool) {
		st, err := state.Load(w.stateDir)
		if err != nil || len(st.Owed) != 1 {
			return state.Owed{}, false
		}
		for _, o := range st.Owed {
			return o, true
		}
		return state.Owed{}, false
	}
	waitUntil(t, "the final check to be owed and tried again", 60*time.Second, func() bool {
		o, ok := owed()
		return ok && o.Tries >= 3
	})
	o, _ := owed()
	t.Logf("owed during the outage: %d tries, last error %s", o.Tries, o.LastError)
	if n := runsIn(t, gate); n != 1 {
		t.Fatalf("the work ran %d times during the outage, want 1", n)
	}

	if err := own.StartPDS(ctx); err != nil {
		t.Fatal(err)
	}
	_, got := w.waitFinal("gated", commit, 60*time.Second)
	if got.Status != "success" {
		t.Fatalf("final check %s (%s), want success", got.Status, got.Error)
	}
	waitUntil(t, "the owed list to empty", 30*time.Second, func() bool {
		st, err := state.Load(w.stateDir)
		return err == nil && len(st.Owed) == 0
	})
	finals := 0
	for _, r := range w.Checks() {
		if r.Value.Workflow == "gated" && r.Value.Subject.Commit == commit {
			finals++
		}
	}
	if finals != 1 {
		t.Errorf("%d check records of the push on the PDS, want exactly 1", finals)
	}
	written := 0
	w.checkLog.mu.Lock()
	for _, cw := range w.checkLog.writes {
		if cw.check.Workflow == "gated" && cw.check.Subject.Commit == commit && cw.check.Final() {
			written++
		}
	}
	w.checkLog.mu.Unlock()
	if written != 1 {
		t.Errorf("the final check was written %d times, want once", written)
	}
	if n := runsIn(t, gate); n != 1 {
		t.Errorf("the work ran %d times, want 1", n)
	}
}
