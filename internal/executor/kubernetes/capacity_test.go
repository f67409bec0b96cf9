package kubernetes_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/tests/clustertest"
)

// More runs of one runner at once than the cluster has nodes (serve
// --concurrency 3 on the one-node test cluster): one run per node, so
// while the first runs the others' pods wait Pending, and the runner's
// log says so with the scale-up signal and the scheduler's words. The
// run with a short --schedule-timeout ends error quoting the wait and
// leaves nothing; the other runs once the node frees. The first run
// holds the node until the test releases it, after both waits were seen.
func TestConcurrencyAboveNodes(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	var logs syncbuf.Buffer
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
		id   string
		res  *run.Result
		took time.Duration // from Run's call
	}
	results := make(chan result, 3)
	start := func(id string, timeout time.Duration, src string) {
		go func() {
			ex := newExecutor(t, c, withLog(timeout))
			called := time.Now()
			res := engine(ex, c.Image).Run(ctx, run.Request{RunID: id, Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: true})
			results <- result{id, res, time.Since(called)}
		}()
	}
	start(holdID, 2*time.Minute, "on: push\nsteps: [{run: 'echo holding; while [ ! -e release ]; do sleep 0.2; done'}]\n")
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	holder, err := c.WaitForPod(waitCtx, c.Namespace, kubernetes.LabelRun+"="+holdID, clustertest.PodReady)
	if err != nil {
		t.Fatal(err)
	}
	start(waitID, 2*time.Minute, "on: push\nsteps: [{run: 'echo ran after the node freed'}]\n")
	start(giveUpID, 4*time.Second, "on: push\nsteps: [{run: 'echo never'}]\n")

	// Neither other run can end before the holder: the first result is
	// the one that gave up.
	first := <-results
	if first.id != giveUpID {
		t.Fatalf("run %s ended first (%s: %s), want the one with the short --schedule-timeout", first.id, first.res.Status, first.res.Error)
	}
	t.Logf("short --schedule-timeout: ended %s after Run's call: %s", first.took.Round(time.Millisecond), first.res.Error)
	if r := first.res; r.Status != run.Error || !strings.Contains(r.Error, "not ready after --schedule-timeout 4s") ||
		!strings.Contains(r.Error, "one run per node") || !strings.Contains(r.Error, "anti-affinity") {
		t.Errorf("run with a short --schedule-timeout: status %s (%s), want error quoting the wait for a node", r.Status, r.Error)
	}
	signal := func(id string) string {
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, "run="+id) && strings.Contains(l, "Pending is the scale-up signal") {
				return l
			}
		}
		return ""
	}
	for _, id := range []string{giveUpID, waitID} {
		for signal(id) == "" && waitCtx.Err() == nil {
			time.Sleep(200 * time.Millisecond)
		}
		line := signal(id)
		if !strings.Contains(line, "one run per node") || !strings.Contains(line, "anti-affinity") {
			t.Fatalf("run %s: no scale-up signal naming one run per node in the runner's log:\n%s", id, logs.String())
		}
		t.Logf("runner's log: %s", strings.TrimSpace(line))
	}

	// The node frees: the waiting run gets it.
	var out bytes.Buffer
	if code, err := c.Exec(waitCtx, c.Namespace, holder.Name, "run", []string{"touch", "/work/release"}, nil, &out, &out); err != nil || code != 0 {
		t.Fatalf("release the holding run: exit %d, %v: %s", code, err, out.String())
	}
	got := map[string]*run.Result{}
	for range 2 {
		r := <-results
		got[r.id] = r.res
	}
	if r := got[holdID]; r.Status != run.Success {
		t.Errorf("holding run: status %s (%s)", r.Status, r.Error)
	}
	if r := got[waitID]; r.Status != run.Success || !strings.Contains(string(r.Log), "ran after the node freed") {
		t.Errorf("waiting run: status %s (%s), want success\nlog:\n%s", r.Status, r.Error, r.Log)
	}
	assertNothingLeft(t, c)
}
