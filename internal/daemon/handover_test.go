package daemon_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/tests/clustertest"
)

// TestHandoverAdopts: SIGTERM while a step runs on the Kubernetes
// executor hands the run over at once (no waiting for it): the Job goes
// on, the check stays running, state.json says where the run was. The
// next process adopts it before READY=1 and writes the one final check,
// success, with every line of the step's output once in the log blob.
func TestHandoverAdopts(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	_, commit := w.Push(map[string]string{".knotless/workflows/long.yaml": workflowFile(`
on: [push]
steps:
  - name: long
    run: |
      echo before
      touch "$KNOTLESS_RUN_WORK/step-started"
      sleep 15
      echo after
  - name: next
    run: echo next step
`)})
	kube := func(cfg *daemon.Config) {
		onCluster(t, c, w, kubernetes.PodOptions{Image: c.Image})(cfg)
		cfg.StopWait = 10 * time.Minute // a handover that waited would show
	}
	runnerJobs := func() int {
		jobs, err := c.Clientset.BatchV1().Jobs(c.Namespace).List(context.Background(), metav1.ListOptions{
			LabelSelector: kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(w.Runner.DID.String()),
		})
		if err != nil {
			t.Fatal(err)
		}
		return len(jobs.Items)
	}

	stop := w.start(w.config(kube))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	selector := kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(w.Runner.DID.String())
	if err := c.WaitForCommand(ctx, c.Namespace, selector, "run", []string{"test", "-e", "/work/step-started"}); err != nil {
		t.Fatalf("the step did not start: %v\n%s", err, w.logText())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if log := w.logText(); !strings.Contains(log, "handed over 1 runs") || !strings.Contains(log, "going_on=1") {
		t.Fatalf("the stopping daemon did not hand the run over:\n%s", log)
	}
	if got := w.checkLog.statuses("long", commit); strings.Join(got, " ") != "running" {
		// A worker was free: the check's first record is its running one.
		t.Errorf("checks written before the handover: %v, want running", got)
	}
	if n := runnerJobs(); n != 1 {
		t.Fatalf("%d Jobs of the runner after the handover, want the run's 1", n)
	}
	st, err := state.Load(w.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	var handed []state.Run
	for _, r := range st.Runs {
		if r.Handover != nil {
			handed = append(handed, r)
		}
	}
	if len(handed) != 1 || handed[0].Handover.Step != 0 || !handed[0].Handover.Started {
		b, _ := json.MarshalIndent(st.Runs, "", "  ")
		t.Fatalf("state.json runs: %s; want the run handed over in step 1", b)
	}
	if _, err := os.Stat(filepath.Join(w.cacheDir, "runs", handed[0].RunID, "handover.log")); err != nil {
		t.Errorf("the log so far: %v", err)
	}

	second := len(w.logText())
	w.start(w.config(kube))
	_, got := w.waitFinal("long", commit, 2*time.Minute)
	log := w.logText()[second:]
	if got.Status != "success" {
		t.Fatalf("adopted run: %s (%s)\n%s", got.Status, got.Error, log)
	}
	adopted, ready := strings.Index(log, "adopted 1 runs"), strings.Index(log, "msg=ready")
	if adopted < 0 || ready < 0 || adopted > ready {
		t.Errorf("want %q before READY in the second process's log:\n%s", "adopted 1 runs", log)
	}
	if got.Log == nil {
		t.Fatal("no log blob")
	}
	blob := string(w.Blob(got.Log.Ref.String()))
	for _, line := range []string{"before", "after", "next step", "==> step 1/2: long"} {
		if n := strings.Count("\n"+blob, "\n"+line+"\n"); n != 1 {
			t.Errorf("line %q %d times in the log blob, want once:\n%s", line, n, blob)
		}
	}
	if s := w.checkLog.statuses("long", commit); strings.Join(s, " ") != "running success" {
		t.Errorf("checks written: %v, want running success", s)
	}
	deadline := time.Now().Add(time.Minute)
	for runnerJobs() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the adopted run's Job is still there")
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// onCluster has the daemon run w's workflows as Jobs in c's namespace,
// with pod.
func onCluster(t *testing.T, c *clustertest.Cluster, w *world, pod kubernetes.PodOptions) func(*daemon.Config) {
	return func(cfg *daemon.Config) {
		ex, err := kubernetes.New(kubernetes.Config{
			Credentials:     kubernetes.Credentials{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace},
			Runner:          w.Runner.DID.String(),
			Pod:             pod,
			ScheduleTimeout: 2 * time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Engine.Executor, cfg.Engine.DefaultImage = ex, c.Image
	}
}
