package kubernetes_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/run"
	"knotless.dev/run/tests/clustertest"
)

// syncBuffer is a bytes.Buffer that goroutines may write and read.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// More runs of one runner at once than the cluster has nodes (serve
// --concurrency 3 on the one-node test cluster): one run per node, so
// while the first runs the others' pods wait Pending, and the runner's
// log says so with the scale-up signal and the scheduler's words. The
// run with the default --schedule-timeout runs once the node frees; the
// one with a short --schedule-timeout ends error quoting the wait, and
// leaves nothing.
func TestConcurrencyAboveNodes(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	var logs syncBuffer
	runner := "did:plc:" + randomID("conc")
	withLog := func(timeout time.Duration) func(*kubernetes.Config) {
		return func(cfg *kubernetes.Config) {
			cfg.Runner = runner
			cfg.ScheduleTimeout = timeout
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		}
	}
	holdID, waitID, giveUpID := randomID("hold"), randomID("wait"), randomID("giveup")
	type result struct {
		id  string
		res *run.Result
	}
	results := make(chan result, 3)
	start := func(id string, timeout time.Duration, src string) {
		go func() {
			ex := newExecutor(t, c, withLog(timeout))
			results <- result{id, engine(ex, c.Image).Run(ctx, run.Request{RunID: id, Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: true})}
		}()
	}
	// The first run holds the node until it has seen both others wait.
	start(holdID, 2*time.Minute, "on: push\nsteps: [{run: 'echo holding; sleep 20'}]\n")
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := c.WaitForPod(waitCtx, c.Namespace, kubernetes.LabelRun+"="+holdID, clustertest.PodReady); err != nil {
		t.Fatal(err)
	}
	start(waitID, 2*time.Minute, "on: push\nsteps: [{run: 'echo ran after the node freed'}]\n")
	start(giveUpID, 4*time.Second, "on: push\nsteps: [{run: 'echo never'}]\n")
	got := map[string]*run.Result{}
	for range 3 {
		r := <-results
		got[r.id] = r.res
	}
	if r := got[holdID]; r.Status != run.Success {
		t.Errorf("holding run: status %s (%s)", r.Status, r.Error)
	}
	if r := got[waitID]; r.Status != run.Success || !strings.Contains(string(r.Log), "ran after the node freed") {
		t.Errorf("waiting run: status %s (%s), want success\nlog:\n%s", r.Status, r.Error, r.Log)
	}
	t.Logf("short --schedule-timeout: %s", got[giveUpID].Error)
	if r := got[giveUpID]; r.Status != run.Error || !strings.Contains(r.Error, "not ready after --schedule-timeout 4s") ||
		!strings.Contains(r.Error, "one run per node") || !strings.Contains(r.Error, "anti-affinity") {
		t.Errorf("run with a short --schedule-timeout: status %s (%s), want error quoting the wait for a node", r.Status, r.Error)
	}
	for _, id := range []string{waitID, giveUpID} {
		var line string
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, "run="+id) && strings.Contains(l, "Pending is the scale-up signal") {
				line = l
				break
			}
		}
		if !strings.Contains(line, "one run per node") || !strings.Contains(line, "anti-affinity") {
			t.Errorf("run %s: no scale-up signal naming one run per node in the runner's log:\n%s", id, logs.String())
		}
		t.Logf("runner's log: %s", strings.TrimSpace(line))
	}
	assertNothingLeft(t, c)
}
