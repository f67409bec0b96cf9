package kubernetes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/tests/clustertest"
)

// TestResourceMaximums: on the real cluster, an untrusted run whose
// workflow requests more CPU or memory than the operator's maximum ends
// with status error naming the limit, and no Job or pod is made for it;
// one within the maximums runs.
func TestResourceMaximums(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	eng := run.New(run.Config{
		Executor: newExecutor(t, c, nil), DefaultImage: c.Image, CleanupTimeout: time.Minute,
		Max: run.Maximums{MilliCPU: 500, MemoryBytes: 256 << 20},
	})
	const steps = "steps:\n  - name: hi\n    run: echo hi\n"
	for _, tc := range []struct {
		name, wf string
		want     run.Status
		wantErr  string
	}{
		{"cpu over", "on: [pull]\nresources: {cpu: '4'}\n" + steps, run.Error, "cpu 4 exceeds --max-cpu 500m"},
		{"memory over", "on: [pull]\nresources: {memory: 1Gi}\n" + steps, run.Error, "memory 1Gi exceeds --max-memory 256Mi"},
		{"within", "on: [pull]\nresources: {cpu: 100m, memory: 64Mi}\n" + steps, run.Success, ""},
	} {
		res := eng.Run(context.Background(), run.Request{RunID: randomID("max"), Workflow: parse(t, tc.wf), Checkout: t.TempDir()})
		if res.Status != tc.want || !strings.Contains(res.Error, tc.wantErr) {
			t.Errorf("%s: got %s %q, want %s %q\nlog:\n%s", tc.name, res.Status, res.Error, tc.want, tc.wantErr, res.Log)
		}
		assertNothingLeft(t, c)
	}
}
