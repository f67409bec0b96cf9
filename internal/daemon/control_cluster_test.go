package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/tests/clustertest"
)

// Run control on the Kubernetes executor, through serve on the real
// PDS and the test cluster: what a cancel (a record, or a newer push
// with superseded: cancel) stops leaves nothing of its run.

// runObjects lists what is left in the cluster of the runs of the
// world's runner: Jobs, pods, Secrets and NetworkPolicies labelled with
// a run. (The runner's own NetworkPolicies, shared by its runs and
// labelled with no run, are the runner's: they stay.)
func runObjects(t *testing.T, c *clustertest.Cluster, w *world) []string {
	t.Helper()
	ctx := context.Background()
	runner := metav1.ListOptions{LabelSelector: kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(w.Runner.DID.String())}
	ofRun := metav1.ListOptions{LabelSelector: kubernetes.LabelRun}
	var left []string
	jobs, err := c.Clientset.BatchV1().Jobs(c.Namespace).List(ctx, runner)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs.Items {
		left = append(left, "job "+j.Name)
	}
	pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(ctx, runner)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		left = append(left, "pod "+p.Name)
	}
	secrets, err := c.Clientset.CoreV1().Secrets(c.Namespace).List(ctx, ofRun)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		left = append(left, "secret "+s.Name)
	}
	nps, err := c.Clientset.NetworkingV1().NetworkPolicies(c.Namespace).List(ctx, ofRun)
	if err != nil {
		t.Fatal(err)
	}
	for _, np := range nps.Items {
		left = append(left, "networkpolicy "+np.Name)
	}
	return left
}

// waitNothingLeft waits for the runs' objects to be gone (deletion is
// asynchronous: a pod terminates after its Job is deleted).
func waitNothingLeft(t *testing.T, c *clustertest.Cluster, w *world) {
	t.Helper()
	waitGone(t, "in the cluster", func() []string { return runObjects(t, c, w) })
}

// waitGone waits, up to 2 minutes, until list finds nothing: a run's
// clean-up goes on after its final check is written.
func waitGone(t *testing.T, where string, list func() []string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		left := list()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left %s: %s", where, strings.Join(left, ", "))
			return
		}
		time.Sleep(time.Second)
	}
}

// TestServeCancelOnKubernetes: the owner's cancel record stops a check
// running as a Job: it ends cancelled naming the record, and its Job,
// pod and Secrets are gone (the runner's NetworkPolicies stay: they
// are its, not the run's).
func TestServeCancelOnKubernetes(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	_, commit := w.Push(map[string]string{".knotless/workflows/slow.yaml": workflowFile(`
on: [push]
steps:
  - name: slow
    run: echo started; sleep 300
`)})
	w.start(w.config(controlled, onCluster(t, c, w, kubernetes.PodOptions{Image: c.Image})))
	key := w.checkOf("slow", commit, "running", 3*time.Minute)
	w.waitLog(`msg="step started"`, 3*time.Minute)
	if len(runObjects(t, c, w)) == 0 {
		t.Fatal("no Job of the running check")
	}
	by := w.cancel(w.Owner, key)
	_, got := w.waitFinal("slow", commit, 2*time.Minute)
	if got.Status != "cancelled" || got.CancelledBy != by.String() {
		t.Errorf("check: %s by %q (%q)", got.Status, got.CancelledBy, got.Error)
	}
	waitNothingLeft(t, c, w)
	if m := stoppedIn.FindStringSubmatch(w.logText()); m != nil {
		t.Logf("cancel: the run stopped in %s after the record was read (kubernetes executor: its Job deleted)", m[1])
	} else {
		t.Error("no figure of the cancel logged")
	}
}

// TestServeSupersedeOnKubernetes: with superseded: cancel (the default)
// a newer push cancels the older run's Job mid-step: its check ends
// cancelled, superseded by the newer push, and nothing of it is left;
// the newer run succeeds.
func TestServeSupersedeOnKubernetes(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	_, old := w.Push(map[string]string{".knotless/workflows/build.yaml": workflowFile(`
on: [push]
steps:
  - name: build
    run: echo started; sleep 300
`)})
	w.start(w.config(onCluster(t, c, w, kubernetes.PodOptions{Image: c.Image}), func(cfg *daemon.Config) { cfg.Scheduler.Concurrency = 2 }))
	w.checkOf("build", old, "running", 3*time.Minute)
	w.waitLog(`msg="step started"`, 3*time.Minute)
	newer, commit := w.Push(map[string]string{".knotless/workflows/build.yaml": workflowFile(`
on: [push]
steps:
  - name: build
    run: echo newer
`)})
	_, got := w.waitFinal("build", old, 2*time.Minute)
	if got.Status != "cancelled" || got.Error != "superseded by "+newer.String() {
		t.Errorf("the older check: %s (%q)", got.Status, got.Error)
	}
	if _, n := w.waitFinal("build", commit, 3*time.Minute); n.Status != "success" {
		t.Errorf("the newer check: %s (%s)", n.Status, n.Error)
	}
	waitNothingLeft(t, c, w)
	var kinds []string
	for _, r := range w.Checks() {
		kinds = append(kinds, r.Value.Subject.Commit[:7]+" "+r.Value.Status)
	}
	if len(kinds) != 2 {
		t.Errorf("checks %v, want one per push", kinds)
	}
}

// TestServeDispatchAndScheduleOnKubernetes: a dispatch with an input, a
// re-run of it with a variable, and a schedule's tick, each run as a Job
// on the test cluster through serve: the inputs and variables reach the
// step on the payload, and nothing is left.
func TestServeDispatchAndScheduleOnKubernetes(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	_, commit := w.Push(map[string]string{".knotless/workflows/ops.yaml": workflowFile(`
on:
  dispatch:
    inputs:
      target: {type: choice, options: [staging, production]}
  schedule:
    - cron: "* * * * *"
steps:
  - name: ops
    run: echo "ops target=${target:-none} again=${AGAIN:-no}"
`)})
	w.start(w.config(controlled, onCluster(t, c, w, kubernetes.PodOptions{Image: c.Image})))
	d := w.Put(w.Owner, forge.CollectionDispatch, "", forge.Dispatch{Type: forge.CollectionDispatch, Repo: w.RepoURI.String(),
		Ref: "refs/heads/main", Workflow: "ops", Inputs: []forge.Variable{{Name: "target", Value: "production"}}, CreatedAt: forge.Now()})
	key := forge.CheckKey(forge.Subject{Kind: forge.KindDispatch, Event: d.String()}, "ops")
	got := w.waitKey(key, 3*time.Minute)
	if got.Status != "success" || got.Subject.Commit != commit || !strings.Contains(w.runLog(got), "ops target=production again=no") {
		t.Errorf("the dispatch: %s (%s)\n%s", got.Status, got.Error, w.runLog(got))
	}
	w.rerun(w.Owner, key, forge.Rerun{Env: []forge.Variable{{Name: "AGAIN", Value: "yes"}}})
	again := w.waitKey(forge.AttemptKey(got.Subject, "ops", 2), 3*time.Minute)
	if again.Status != "success" || !strings.Contains(w.runLog(again), "ops target=production again=yes") {
		t.Errorf("the dispatch's re-run: %s (%s)\n%s", again.Status, again.Error, w.runLog(again))
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var tick *forge.Check
		for _, r := range w.Checks() {
			if r.Value.Subject.Kind == forge.KindSchedule && r.Value.Final() {
				tick = &r.Value
			}
		}
		if tick != nil {
			if tick.Status != "success" || !strings.Contains(w.runLog(*tick), "ops target=none again=no") {
				t.Errorf("the tick: %s (%s)\n%s", tick.Status, tick.Error, w.runLog(*tick))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no tick ran\n%s", w.logText())
		}
		time.Sleep(time.Second)
	}
	waitNothingLeft(t, c, w)
}
