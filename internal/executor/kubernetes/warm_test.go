package kubernetes_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/kube/kubecred"
	"knotless.dev/run/tests/clustertest"
)

// Warm pods on the one-node test cluster, with the runner's own
// credential and admission policy: an idle warm pod lets the
// autoscaler take its node (no budget; safe-to-evict "true"); a trusted run takes the Ready
// warm pod and its step runs there; the pool makes another, which the
// next run gets (a pod never serves two runs); an untrusted run (another
// egress) makes its own Job, and the warm pod gives up the node it
// needs; a sweep of this process leaves the pool's Jobs, another
// process's sweep deletes them; when the pool stops, nothing is left.
func TestWarmPods(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	j := newJournal()
	runner := "did:plc:" + randomID("warm")
	kubeconfig, _, _ := withPolicy(t, c, kubecred.Options{Namespace: c.Namespace, ServiceAccount: "knotless-runner", Duration: time.Hour})
	m, reg := observed(t)
	ex := newExecutor(t, c, func(cfg *kubernetes.Config) {
		cfg.Runner, cfg.Logger, cfg.Credentials.Kubeconfig, cfg.Observer = runner, slog.New(j), kubeconfig, m
	})
	ctx, stop := context.WithCancel(context.Background())
	kept := make(chan struct{})
	go func() { defer close(kept); ex.KeepWarm(ctx, 1) }()
	t.Cleanup(func() { stop(); <-kept })
	eng, cleaner := engineCleaning(t, ex, c.Image)
	wf := parse(t, "on: push\nsteps:\n  - name: where\n    run: echo \"pod=$HOSTNAME\"\n")
	runOn := func(trusted bool) *run.Result {
		t.Helper()
		res := eng.Run(context.Background(), run.Request{RunID: randomID("w"), Workflow: wf, Checkout: t.TempDir(), Trusted: trusted})
		if res.Status != run.Success {
			t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
		}
		if err := cleaner.Wait(context.Background()); err != nil || cleaner.Failures() != 0 {
			t.Fatalf("clean-up: %v, %d failed", err, cleaner.Failures())
		}
		return res
	}

	first := readyWarmPod(t, c, ex)
	// Idle, it holds no run: the autoscaler may take its node.
	if got := first.Annotations[kubernetes.AnnotationSafeToEvict]; got != "true" {
		t.Errorf("warm pod annotation %s = %q, want \"true\"", kubernetes.AnnotationSafeToEvict, got)
	}
	if pdbs, err := c.Clientset.PolicyV1().PodDisruptionBudgets(c.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: kubernetes.LabelRunner}); err != nil || len(pdbs.Items) != 0 {
		t.Errorf("disruption budgets beside an idle warm pod: %v, %v; want none", pdbs, err)
	}
	// The run that takes it gets its budget while its step runs.
	held := make(chan *run.Result, 1)
	heldID := randomID("w")
	go func() {
		held <- eng.Run(context.Background(), run.Request{RunID: heldID, Workflow: parse(t, "on: push\nsteps:\n  - name: where\n    run: |\n      echo \"pod=$HOSTNAME\"\n      touch /tmp/started\n      until [ -e /tmp/go ]; do sleep 0.2; done\n"),
			Checkout: t.TempDir(), Trusted: true})
	}()
	wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.WaitForCommand(wctx, c.Namespace, "batch.kubernetes.io/job-name="+first.Labels["batch.kubernetes.io/job-name"], "run", []string{"test", "-e", "/tmp/started"}); err != nil {
		t.Fatalf("the run's step did not start in the warm pod %s: %v", first.Name, err)
	}
	pdb, err := c.Clientset.PolicyV1().PodDisruptionBudgets(c.Namespace).Get(context.Background(), first.Labels["batch.kubernetes.io/job-name"], metav1.GetOptions{})
	if err != nil || pdb.Labels[kubernetes.LabelRun] != heldID {
		t.Errorf("the budget of the run on the warm pod: %v, %v; want one labelled with the run", pdb, err)
	}
	if code, err := c.Exec(context.Background(), c.Namespace, first.Name, "run", []string{"touch", "/tmp/go"}, nil, io.Discard, io.Discard); err != nil || code != 0 {
		t.Fatalf("let the step end: exit %d, %v", code, err)
	}
	if res := <-held; res.Status != run.Success || !strings.Contains(string(res.Log), "pod="+first.Name) {
		t.Fatalf("status %s (%s): the run did not run in the warm pod %s; log:\n%s", res.Status, res.Error, first.Name, res.Log)
	}
	if err := cleaner.Wait(context.Background()); err != nil || cleaner.Failures() != 0 {
		t.Fatalf("clean-up: %v, %d failed", err, cleaner.Failures())
	}
	second := readyWarmPod(t, c, ex)
	if second.UID == first.UID {
		t.Fatalf("the pool offered the pod %s again", first.Name)
	}
	if res := runOn(true); !strings.Contains(string(res.Log), "pod="+second.Name) {
		t.Fatalf("the second run did not run in the new warm pod %s; log:\n%s", second.Name, res.Log)
	}
	if got, metric := ex.Counters().WarmStarts, counterValue(t, reg, "knotless_run_warm_starts_total"); got != 2 || metric != 2 {
		t.Errorf("WarmStarts = %d, knotless_run_warm_starts_total = %g after two runs on warm pods", got, metric)
	}
	j.has(t, "warm pod taken", 2, map[string]string{"run": "", "job": "", "pod": "", "warm_for": ""})

	third := readyWarmPod(t, c, ex)
	res := runOn(false)
	if strings.Contains(string(res.Log), "pod="+third.Name) || ex.Counters().WarmStarts != 2 {
		t.Fatalf("an untrusted run ran in a trusted run's warm pod; log:\n%s", res.Log)
	}
	given := j.find("warm pod deleted")
	if len(given) != 1 || given[0].attrs["why"].String() != "a run waits for a node" || given[0].attrs["job"].String() != third.Labels["batch.kubernetes.io/job-name"] {
		t.Errorf("the warm pod did not give up its node once to the run; journal:\n%s", j.dump())
	}

	// The pool goes on after the run; a sweep of this process leaves its
	// Jobs, another process's deletes them.
	fourth := readyWarmPod(t, c, ex)
	if swept, err := ex.Sweep(context.Background(), nil); err != nil || len(swept) != 0 {
		t.Fatalf("this process's sweep = %v, %v; want the warm Job left", swept, err)
	}
	other := newExecutor(t, c, func(cfg *kubernetes.Config) { cfg.Runner, cfg.Credentials.Kubeconfig = runner, kubeconfig })
	swept, err := other.Sweep(context.Background(), nil)
	if err != nil || len(swept) != 1 || swept[0].Name != fourth.Labels["batch.kubernetes.io/job-name"] {
		t.Fatalf("another process's sweep = %v, %v; want the warm Job of %s", swept, err, fourth.Name)
	}

	stop()
	<-kept
	waitGone(t, c)
	assertNothingLeft(t, c)
}

// A runner whose Role predates warm pods (no patch on jobs) cannot take
// one: the run makes its own Job and succeeds, the pool stops for good
// with an error that says what to do, and nothing is left.
func TestWarmPodsWithoutPatch(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	kubeconfig := c.ScopedKubeconfig(t, "nopatch", rulesWithoutJobVerb("patch"))
	j := newJournal()
	ex := newExecutor(t, c, func(cfg *kubernetes.Config) { cfg.Credentials.Kubeconfig, cfg.Logger = kubeconfig, slog.New(j) })
	ctx, stop := context.WithCancel(context.Background())
	kept := make(chan struct{})
	go func() { defer close(kept); ex.KeepWarm(ctx, 1) }()
	t.Cleanup(func() { stop(); <-kept })
	eng, cleaner := engineCleaning(t, ex, c.Image)

	warm := readyWarmPod(t, c, ex)
	res := eng.Run(context.Background(), run.Request{RunID: randomID("np"), Checkout: t.TempDir(), Trusted: true,
		Workflow: parse(t, "on: push\nsteps:\n  - name: where\n    run: echo \"pod=$HOSTNAME\"\n")})
	if res.Status != run.Success || strings.Contains(string(res.Log), "pod="+warm.Name) {
		t.Fatalf("status %s (%s), want success in a pod of its own; log:\n%s", res.Status, res.Error, res.Log)
	}
	if err := cleaner.Wait(context.Background()); err != nil || cleaner.Failures() != 0 {
		t.Fatalf("clean-up: %v, %d failed", err, cleaner.Failures())
	}
	for _, e := range j.has(t, "warm pods stopped", 1, map[string]string{"why": ""}) {
		if why := e.attrs["why"].String(); !strings.Contains(why, "patch on jobs") || !strings.Contains(why, "knotless-run kubeconfig") {
			t.Errorf("the pool stopped saying %q; want what the Role lacks and how to mint it again", why)
		}
	}
	// A warm pod still starting when the pool stopped is cancelled and
	// leaves the count once its start has given up.
	for deadline := time.Now().Add(30 * time.Second); ex.Warm() != (kubernetes.WarmPods{}); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("warm pods 30 s after the pool stopped: %+v", ex.Warm())
			break
		}
	}
	stop()
	<-kept
	waitGone(t, c)
	assertNothingLeft(t, c)
}

// readyWarmPod waits until the pool has one Ready warm pod and returns it.
func readyWarmPod(t *testing.T, c *clustertest.Cluster, ex *kubernetes.Executor) corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if ex.Warm().Ready == 1 {
			pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: kubernetes.LabelWarm})
			if err != nil {
				t.Fatal(err)
			}
			var ready []corev1.Pod
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
					ready = append(ready, p)
				}
			}
			if len(ready) != 1 {
				t.Fatalf("%d warm pods running, want 1", len(ready))
			}
			return ready[0]
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no warm pod ready in 2m: %+v", ex.Warm())
	return corev1.Pod{}
}
