package daemon_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/tests/clustertest"
)

// TestStopWhilePending: SIGTERM while a run's pod is still Pending (no
// node takes it) does not wait the stop wait for it: the session is
// stopped (its Job deleted), the run is released (its check back to
// queued, nothing in state.json to adopt), and the next process runs
// the work from the start under the same check key.
func TestStopWhilePending(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	_, commit := w.Push(map[string]string{".knotless/workflows/wait.yaml": workflowFile(`
on: [push]
steps:
  - name: hello
    run: echo hello from the successor
`)})
	selector := kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(w.Runner.DID.String())
	runnerJobs := func() int {
		jobs, err := c.Clientset.BatchV1().Jobs(c.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		return len(jobs.Items)
	}
	unschedulable := func(cfg *daemon.Config) {
		// No node has this label: the pod stays Pending.
		onCluster(t, c, w, kubernetes.PodOptions{Image: c.Image, NodeSelector: map[string]string{"knotless.dev/test-no-such-node": "x"}})(cfg)
		cfg.StopWait = 10 * time.Minute // a stop that waited for the pod would show
	}
	stop := w.start(w.config(unschedulable))
	deadline := time.Now().Add(2 * time.Minute)
	for runnerJobs() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no Job made:\n%s", w.logText())
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	log := w.logText()
	if !strings.Contains(log, "run released: its session had not started") {
		t.Errorf("the stopping daemon did not release the pending run:\n%s", log)
	}
	if strings.Contains(log, "stop wait over") {
		t.Errorf("the stopping daemon waited the stop wait for a pending run:\n%s", log)
	}
	if got := w.checkLog.statuses("wait", commit); strings.Join(got, " ") != "running queued" {
		// A worker was free: no queued record before the running one.
		t.Errorf("checks written: %v, want running queued (released)", got)
	}
	st, err := state.Load(w.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Runs) != 0 {
		b, _ := json.MarshalIndent(st.Runs, "", "  ")
		t.Errorf("state.json keeps runs after a release: %s", b)
	}
	deadline = time.Now().Add(time.Minute)
	for runnerJobs() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the pending run's Job is still there after the stop")
		}
		time.Sleep(250 * time.Millisecond)
	}

	w.start(w.config(onCluster(t, c, w, kubernetes.PodOptions{Image: c.Image})))
	_, got := w.waitFinal("wait", commit, 3*time.Minute)
	if got.Status != "success" {
		t.Fatalf("the successor's run: %s (%s)\n%s", got.Status, got.Error, w.logText())
	}
	if s := w.checkLog.statuses("wait", commit); strings.Join(s, " ") != "running queued running success" {
		t.Errorf("checks written: %v, want running queued running success", s)
	}
}
