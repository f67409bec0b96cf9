package run_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/fakeexec"
)

// A session that cannot be removed (its Job's delete refused) leaves the
// verdict as the work made it: success stays success, with the engine
// cleaning up before Run returns and with a Cleaner after it.
func TestFailedCleanupKeepsTheVerdict(t *testing.T) {
	t.Parallel()
	refused := errors.New(`jobs.batch "knotless-r" is forbidden`)
	for _, withCleaner := range []bool{false, true} {
		name := "inline"
		if withCleaner {
			name = "cleaner"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ex := &fakeexec.Executor{StopErr: refused, Outputs: map[string]string{"out.txt": "x"}}
			cfg := run.Config{Executor: ex}
			if withCleaner {
				cfg.Cleaner = run.NewCleaner(nil)
			}
			res := run.New(cfg).Run(t.Context(), run.Request{RunID: "r", Workflow: twoSteps(), Checkout: t.TempDir(), Outputs: t.TempDir()})
			if withCleaner {
				if err := cfg.Cleaner.Wait(t.Context()); err != nil {
					t.Fatal(err)
				}
				if got := cfg.Cleaner.Failures(); got != 1 {
					t.Errorf("cleaner counted %d failures, want 1", got)
				}
			}
			if res.Status != run.Success || res.Error != "" {
				t.Errorf("status %s (%q), want success: a failed clean-up is not the work's", res.Status, res.Error)
			}
			if s := ex.Session("r"); s.Stops() != 1 || s.Stopped() {
				t.Errorf("Stop called %d times, stopped %v; want one failed Stop", s.Stops(), s.Stopped())
			}
		})
	}
}

// With a Cleaner, Run returns the complete result while the session's
// removal is still going; the Cleaner's Wait returns once it has ended.
func TestVerdictBeforeCleanup(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	ex := &fakeexec.Executor{StopGate: gate, Outputs: map[string]string{"out.txt": "x"},
		Script: func(_, id string) fakeexec.Step { return fakeexec.Step{Output: "step " + id + "\n"} }}
	cleaner := run.NewCleaner(nil)
	res := run.New(run.Config{Executor: ex, Cleaner: cleaner}).Run(t.Context(), run.Request{
		RunID: "r", Workflow: twoSteps(), Checkout: t.TempDir(), Outputs: t.TempDir()})
	if res.Status != run.Success || len(res.Outputs) != 1 || len(res.Log) == 0 || res.FinishedAt.IsZero() {
		t.Fatalf("result before the clean-up: status %s, outputs %v, %d log bytes, finished %v; want it complete",
			res.Status, res.Outputs, len(res.Log), res.FinishedAt)
	}
	s := ex.Session("r")
	if s.Stopped() {
		t.Fatal("the session was stopped before Run returned, though its Stop is held")
	}
	waited := make(chan error, 1)
	go func() { waited <- cleaner.Wait(context.Background()) }()
	close(gate)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if !s.Stopped() || cleaner.Done() != 1 || cleaner.Failures() != 0 {
		t.Errorf("after Wait: stopped %v, %d done, %d failed; want the one clean-up done", s.Stopped(), cleaner.Done(), cleaner.Failures())
	}
}

// Wait whose context ends first cuts the clean-ups short (their context
// ends) and says so; it returns only once they have.
func TestCleanerWaitCutsShort(t *testing.T) {
	t.Parallel()
	ex := &fakeexec.Executor{StopGate: make(chan struct{})} // never opens
	cleaner := run.NewCleaner(nil)
	eng := run.New(run.Config{Executor: ex, Cleaner: cleaner})
	for _, id := range []string{"a", "b"} {
		if res := eng.Run(t.Context(), run.Request{RunID: id, Workflow: twoSteps(), Checkout: t.TempDir()}); res.Status != run.Success {
			t.Fatalf("run %s: %s (%s)", id, res.Status, res.Error)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := cleaner.Wait(ctx)
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v, want it cut short", err)
	}
	if cleaner.Done() != 2 || cleaner.Failures() != 2 {
		t.Errorf("%d clean-ups done, %d failed; want both ended, failed", cleaner.Done(), cleaner.Failures())
	}
	// One handed over after the cut starts cut: it ends at once.
	if res := eng.Run(t.Context(), run.Request{RunID: "c", Workflow: twoSteps(), Checkout: t.TempDir()}); res.Status != run.Success {
		t.Fatalf("run c: %s", res.Status)
	}
	if err := cleaner.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if cleaner.Failures() != 3 {
		t.Errorf("%d failed, want 3", cleaner.Failures())
	}
}

// A held session (Request.HoldSession, with replicas: kept until the
// run's final check is written) is not stopped while held: a Cleaner cut
// short meanwhile leaves it to the sweep; once released, it is stopped.
func TestHeldSessionOutlivesTheRun(t *testing.T) {
	t.Parallel()
	for _, release := range []bool{false, true} {
		ex := &fakeexec.Executor{Outputs: map[string]string{"out.txt": "x"}}
		cleaner := run.NewCleaner(nil)
		hold := make(chan struct{})
		res := run.New(run.Config{Executor: ex, Cleaner: cleaner}).Run(t.Context(), run.Request{
			RunID: "r", Workflow: twoSteps(), Checkout: t.TempDir(), Outputs: t.TempDir(), HoldSession: hold})
		if res.Status != run.Success {
			t.Fatalf("status %s (%q), want success", res.Status, res.Error)
		}
		s := ex.Session("r")
		if !release {
			ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
			err := cleaner.Wait(ctx)
			cancel()
			if err == nil || s.Stops() != 0 || s.Stopped() {
				t.Errorf("held: Wait %v, Stop called %d times, stopped %v; want the clean-up cut short and no Stop", err, s.Stops(), s.Stopped())
			}
			continue
		}
		close(hold)
		if err := cleaner.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
		if !s.Stopped() || cleaner.Failures() != 0 {
			t.Errorf("released: stopped %v, %d failed; want it stopped", s.Stopped(), cleaner.Failures())
		}
	}
}
