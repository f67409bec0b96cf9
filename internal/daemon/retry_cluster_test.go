package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/parts/scheduler"
	"knotless.dev/run/tests/clustertest"
)

// runPods lists the pods of the world's runner with the run they are of.
func runPods(t *testing.T, c *clustertest.Cluster, w *world) map[string]string {
	t.Helper()
	pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(w.Runner.DID.String())})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]string{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			byName[p.Name] = p.Labels[kubernetes.LabelRun]
		}
	}
	return byName
}

// TestServeRetriesARunLostOnKubernetes: with retry: {max: 1}, a run
// whose pod is deleted while its step runs (as a drain or a lost node
// takes it) is tried again, through serve on the real PDS and the test
// cluster, as a run of its own (its own Job, named from the retry's
// id), within the one check: it ends success, says it took 2 tries and
// its log says why the second ran; nothing of either try is left.
func TestServeRetriesARunLostOnKubernetes(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	_, commit := w.Push(map[string]string{".knotless/workflows/flaky.yaml": workflowFile(`
on: [push]
retry: {max: 1}
steps:
  - name: work
    run: echo started; sleep 20; echo done
`)})
	w.start(w.config(onCluster(t, c, w, kubernetes.PodOptions{Image: c.Image})))
	key := w.checkOf("flaky", commit, "running", 3*time.Minute)
	first := run.IDFor(w.Runner.DID.String(), key)
	second := run.IDFor(w.Runner.DID.String(), scheduler.TryKey(key, 2))
	w.waitLog(`msg="step started"`, 3*time.Minute)
	var deleted bool
	for name, runID := range runPods(t, c, w) {
		if runID != first {
			t.Fatalf("pod %s is of run %q, want the first try's %s", name, runID, first)
		}
		zero := int64(0)
		if err := c.Clientset.CoreV1().Pods(c.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		deleted = true
	}
	if !deleted {
		t.Fatal("no pod of the running check to delete")
	}
	_, got := w.waitFinal("flaky", commit, 5*time.Minute)
	log := w.runLog(got)
	if got.Status != "success" || got.Tries != 2 {
		t.Errorf("check: %s after %d tries (%q), want success after 2\n%s", got.Status, got.Tries, got.Error, log)
	}
	for _, s := range []string{"knotless-run: attempt 2 of 2: attempt 1 was lost to the infrastructure: ", "run " + second, "done"} {
		if !strings.Contains(log, s) {
			t.Errorf("the check's log lacks %q:\n%s", s, log)
		}
	}
	if !strings.Contains(w.logText(), `msg="run tried again"`) {
		t.Error("the daemon's log does not say the run was tried again")
	}
	waitNothingLeft(t, c, w)
}
