package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/tests/clustertest"
)

// TestCheckRunningWhilePending pins what the NixOS VM test's
// scale-to-zero step asserts (nix/tests/k3s.nix): the daemon writes the
// `running` check beside the Job's creation (the two-phase start: the
// write overlaps the pod's start), so while the run's pod is Pending for
// want of a node, the check says running — never queued (a worker was
// free: its running record is its first). A pod that cannot be
// scheduled (its node selector matches no node) stands in for a cluster
// scaled to zero.
func TestCheckRunningWhilePending(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	_, commit := w.Push(map[string]string{".knotless/workflows/build.yaml": workflowFile(`
on: [push]
steps:
  - name: build
    run: echo never scheduled
`)})
	// A node selector that matches no node: the pod stays Pending.
	w.start(w.config(onCluster(t, c, w, kubernetes.PodOptions{Image: c.Image, NodeSelector: map[string]string{"knotless.test/no-such-node": "true"}})))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	selector := kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(w.Runner.DID.String())
	pending := func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodPending }
	if _, err := c.WaitForPod(ctx, c.Namespace, selector, pending); err != nil {
		t.Fatalf("no Pending pod of the run: %v\n%s", err, w.logText())
	}
	waitUntil(t, "the running check", 30*time.Second, func() bool { return len(w.checkLog.statuses("build", commit)) > 0 })
	if got := strings.Join(w.checkLog.statuses("build", commit), " "); got != "running" {
		t.Errorf("checks written while the pod is Pending: %q, want %q", got, "running")
	}
	if _, err := c.WaitForPod(ctx, c.Namespace, selector, pending); err != nil {
		t.Errorf("the run's pod is no longer Pending: %v", err)
	}
}
