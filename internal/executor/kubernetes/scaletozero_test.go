package kubernetes_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/tests/clustertest"
)

// Scale to zero, measured by the node count. The run's pods select the
// tenant pool, which has no node: the run waits Pending (not a failure
// before --schedule-timeout), the harness's scaler adds the pool's node
// for it (the cluster's second kubelet), the run succeeds there, and the
// scaler removes the node once nothing runs on it. Whatever the runner
// left on the node (a pod, a Job's pod not deleted) would keep it, and
// the count after would be 1.
func TestScaleToZero(t *testing.T) {
	c, pool := clustertest.StartNodePool(t)
	ctx := context.Background()
	count := func(stage string) int {
		t.Helper()
		nodes, err := pool.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("nodes in the tenant pool %s: %d %v", stage, len(nodes), nodes)
		return len(nodes)
	}
	before := count("before the push")
	if before != 0 {
		t.Fatalf("the pool has %d nodes before the run, want 0", before)
	}

	runID := randomID("zero")
	done := make(chan *run.Result, 1)
	start := time.Now()
	go func() {
		done <- engine(newExecutor(t, c, func(cfg *kubernetes.Config) {
			cfg.Pod.NodeSelector = pool.Selector()
			cfg.ScheduleTimeout = 5 * time.Minute
		}), c.Image).Run(ctx, run.Request{
			RunID: runID, Workflow: parse(t, holdStep), Checkout: t.TempDir(), Trusted: true,
		})
	}()
	sel := kubernetes.LabelRun + "=" + runID
	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if _, err := c.WaitForPod(waitCtx, c.Namespace, sel, clustertest.PodUnschedulable); err != nil {
		t.Fatalf("the run's pod never waited for a node: %v", err)
	}
	pod, err := c.WaitForPod(waitCtx, c.Namespace, sel, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if err != nil {
		select {
		case res := <-done:
			t.Fatalf("the run ended while it waited for the pool: %s (%s)\n%s", res.Status, res.Error, res.Log)
		default:
		}
		t.Fatalf("the run's pod never ran: %v", err)
	}
	t.Logf("the run's pod ran on node %s %v after the run began", pod.Spec.NodeName, time.Since(start).Round(time.Second))
	during := count("while the run needs a node")
	nodes, err := pool.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if during != 1 || !slices.Contains(nodes, pod.Spec.NodeName) {
		t.Fatalf("while the run holds node %s the pool has %v, want that node alone", pod.Spec.NodeName, nodes)
	}
	release(t, c, pod.Name)
	res := <-done
	if res.Status != run.Success || !strings.Contains(string(res.Log), "released") {
		t.Fatalf("status %s (%s), want success\nlog:\n%s", res.Status, res.Error, res.Log)
	}
	ended := time.Now()
	assertNothingLeft(t, c)

	// The scaler removes the node PoolIdle after the last pod on it went;
	// bounded only to fail a hang.
	var after int
	for deadline := time.Now().Add(3 * time.Minute); ; {
		nodes, err := pool.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if after = len(nodes); after == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	after = count("after the run")
	if after != 0 {
		t.Fatalf("the pool still has %d node(s) 3m after the run ended: something holds it", after)
	}
	t.Logf("node count before/during/after: %d/%d/%d; the run %s; the node went %v after the run ended; scalings: %s",
		before, during, after, res.Status, time.Since(ended).Round(time.Second), scalings(pool.Events(), start))
}

func scalings(events []clustertest.PoolEvent, since time.Time) string {
	var b strings.Builder
	for i, e := range events {
		if i > 0 {
			b.WriteString(", ")
		}
		verb := "down"
		if e.Up {
			verb = "up"
		}
		b.WriteString(verb + " at +" + e.At.Sub(since).Round(time.Second).String())
	}
	return b.String()
}
