package run_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/shell"
	"knotless.dev/run/internal/rules/workflow"
)

func parse(t *testing.T, src string) *workflow.Workflow {
	t.Helper()
	wf, err := workflow.Parse("limits.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return wf
}

// maximums is what an operator of a public runner would set.
var maximums = run.Maximums{
	Timeout:     time.Hour,
	MilliCPU:    2000,
	MemoryBytes: 4 << 30,
	Images:      []string{"registry.example/ci/*", "busybox:*"},
}

// TestMaximums: an untrusted run whose workflow asks for more than a
// maximum ends with status error naming the limit and the value, before
// any step runs; a trusted run is not bound unless the maximums apply to
// all runs. The shell executor ignores images and resources, so a run
// that is let through succeeds.
func TestMaximums(t *testing.T) {
	t.Parallel()
	const steps = "steps:\n  - name: hello\n    run: echo hello\n"
	for _, tc := range []struct {
		name    string
		wf      string
		trusted bool
		all     bool
		want    run.Status
		wantErr string
	}{
		{name: "timeout over", wf: "on: [pull]\ntimeout: 6h\n" + steps, want: run.Error, wantErr: "timeout 6h0m0s exceeds --max-timeout 1h0m0s"},
		{name: "step timeout over", wf: "on: [pull]\nsteps:\n  - name: long\n    timeout: 2h\n    run: 'true'\n", want: run.Error, wantErr: "step long timeout 2h0m0s exceeds --max-timeout 1h0m0s"},
		{name: "cpu over", wf: "on: [pull]\nresources: {cpu: 2500m}\n" + steps, want: run.Error, wantErr: "cpu 2500m exceeds --max-cpu 2"},
		{name: "memory over", wf: "on: [pull]\nresources: {memory: 5Gi}\n" + steps, want: run.Error, wantErr: "memory 5Gi exceeds --max-memory 4Gi"},
		{name: "memory over in decimal", wf: "on: [pull]\nresources: {memory: 4.5G}\n" + steps, want: run.Error, wantErr: "memory 4.5G exceeds --max-memory 4Gi"},
		{name: "image not allowed", wf: "on: [pull]\nimage: evil.example/miner:latest\n" + steps, want: run.Error,
			wantErr: "image evil.example/miner:latest is not allowed by --allow-image registry.example/ci/*, busybox:*"},
		{name: "image glob stops at a slash", wf: "on: [pull]\nimage: registry.example/ci/deep/x\n" + steps, want: run.Error,
			wantErr: "image registry.example/ci/deep/x is not allowed"},
		{name: "service image not allowed", wf: "on: [pull]\nservices:\n  db: {image: evil.example/db:1}\n" + steps, want: run.Error,
			wantErr: "service db image evil.example/db:1 is not allowed by --allow-image registry.example/ci/*, busybox:*"},
		{name: "step image not allowed", wf: "on: [pull]\nsteps:\n  - {name: lint, image: evil.example/lint:1, run: 'true'}\n", want: run.Error,
			wantErr: "step lint image evil.example/lint:1 is not allowed by --allow-image registry.example/ci/*, busybox:*"},
		{name: "within every limit", wf: "on: [pull]\ntimeout: 1h\nimage: registry.example/ci/go:1.26\nresources: {cpu: '2', memory: 4Gi}\n" + steps, want: run.Success},
		{name: "default image always allowed", wf: "on: [pull]\n" + steps, want: run.Success},
		{name: "trusted not bound", wf: "on: [push]\ntimeout: 6h\nimage: evil.example/miner\nresources: {cpu: '64', memory: 1Ti}\n" + steps, trusted: true, want: run.Success},
		{name: "trusted bound when all", wf: "on: [push]\nresources: {cpu: '64'}\n" + steps, trusted: true, all: true, want: run.Error, wantErr: "cpu 64 exceeds --max-cpu 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := maximums
			m.All = tc.all
			eng := run.New(run.Config{Executor: shell.New(shell.Config{Root: t.TempDir()}), DefaultImage: "busybox:stable", Max: m})
			res := eng.Run(context.Background(), run.Request{RunID: "limits", Workflow: parse(t, tc.wf), Checkout: t.TempDir(), Trusted: tc.trusted})
			if res.Status != tc.want || !strings.Contains(res.Error, tc.wantErr) {
				t.Fatalf("got %s %q, want %s %q\nlog:\n%s", res.Status, res.Error, tc.want, tc.wantErr, res.Log)
			}
			if tc.want == run.Error {
				if res.Steps[0].Status != run.Skipped {
					t.Errorf("step %s: %s, want skipped: nothing runs over a limit", res.Steps[0].Name, res.Steps[0].Status)
				}
				if !strings.Contains(string(res.Log), tc.wantErr) {
					t.Errorf("the run log does not name the limit:\n%s", res.Log)
				}
			}
		})
	}
}

// TestMaxTimeoutBoundsAWorkflowWithoutOne: an untrusted workflow that
// sets no timeout runs under the maximum, not forever.
func TestMaxTimeoutBoundsAWorkflowWithoutOne(t *testing.T) {
	t.Parallel()
	eng := run.New(run.Config{Executor: shell.New(shell.Config{Root: t.TempDir(), Path: os.Getenv("PATH")}), Max: run.Maximums{Timeout: time.Second}})
	start := time.Now()
	res := eng.Run(context.Background(), run.Request{RunID: "forever", Workflow: parse(t, "on: [pull]\nsteps:\n  - name: forever\n    run: sleep 60\n"), Checkout: t.TempDir()})
	if res.Status != run.Failure || !res.Steps[0].TimedOut || !strings.Contains(res.Error, "timed out after 1s") {
		t.Fatalf("got %s %q (step timed out: %v), want failure: timed out after 1s\nlog:\n%s", res.Status, res.Error, res.Steps[0].TimedOut, res.Log)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the run took %s", d)
	}
}
