package run_test

import (
	"errors"
	"testing"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/fakeexec"
)

// TestResultLost: a run ended by an error the executor marked the
// infrastructure's is Lost; a failing step, or a fault of the runner's,
// is not.
func TestResultLost(t *testing.T) {
	t.Parallel()
	evicted := executor.Lost(errors.New("pod p was disrupted while the step ran (Evicted)"))
	for _, tc := range []struct {
		name   string
		exec   *fakeexec.Executor
		status run.Status
		lost   bool
	}{
		{"a step's pod is lost", &fakeexec.Executor{Script: func(string, string) fakeexec.Step { return fakeexec.Step{Err: evicted} }}, run.Error, true},
		{"the session's start is lost", &fakeexec.Executor{StartErr: evicted}, run.Error, true},
		{"a step's stream breaks", &fakeexec.Executor{Script: func(string, string) fakeexec.Step { return fakeexec.Step{Err: errors.New("stream broke")} }}, run.Error, false},
		{"a step fails", &fakeexec.Executor{Script: func(string, string) fakeexec.Step { return fakeexec.Step{Code: 1} }}, run.Failure, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wf := twoSteps()
			eng := run.New(run.Config{Executor: tc.exec, DefaultImage: "alpine"})
			res := eng.Run(t.Context(), run.Request{RunID: "r1", Workflow: wf, Checkout: checkout(t, map[string]string{"a": "b"})})
			if res.Status != tc.status || res.Lost != tc.lost {
				t.Errorf("status %s, lost %v; want %s, %v (error %q)", res.Status, res.Lost, tc.status, tc.lost, res.Error)
			}
		})
	}
}
