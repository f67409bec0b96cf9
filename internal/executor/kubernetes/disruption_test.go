package kubernetes_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/kube/kubecred"
	"knotless.dev/run/tests/clustertest"
)

// holdSrc is a run whose one step marks that it started, then waits
// for the test to let it end.
const holdSrc = `on: push
timeout: 3m
steps:
  - name: hold
    run: |
      touch /tmp/started
      until [ -e /tmp/go ]; do sleep 0.2; done
      echo held
`

// startHeld starts a run of holdSrc with the runner's own Role, and
// returns its pod once the step runs, and the run's result to come.
func startHeld(t *testing.T, c *clustertest.Cluster, runID string) (*corev1.Pod, <-chan *run.Result, *run.Cleaner) {
	t.Helper()
	kubeconfig := c.ScopedKubeconfig(t, "runner", kubecred.Rules())
	ex := newExecutor(t, c, func(cfg *kubernetes.Config) { cfg.Credentials.Kubeconfig = kubeconfig })
	eng, cleaner := engineCleaning(t, ex, c.Image)
	done := make(chan *run.Result, 1)
	go func() {
		done <- eng.Run(context.Background(), run.Request{RunID: runID, Workflow: parse(t, holdSrc), Checkout: t.TempDir(), Trusted: true})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sel := kubernetes.LabelRun + "=" + runID
	if err := c.WaitForCommand(ctx, c.Namespace, sel, "run", []string{"test", "-e", "/tmp/started"}); err != nil {
		t.Fatalf("the step did not start: %v", err)
	}
	pod, err := c.WaitForPod(ctx, c.Namespace, sel, clustertest.PodReady)
	if err != nil {
		t.Fatal(err)
	}
	return pod, done, cleaner
}

// evict asks the Eviction API for pod, as a node drain does for each
// pod of the node.
func evict(ctx context.Context, c *clustertest.Cluster, pod *corev1.Pod) error {
	return c.Clientset.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}})
}

// TestRunPodNotEvicted: while a step runs, an eviction of the run's pod
// (what a node drain does to each pod) is refused, 429, naming the
// run's budget; the step goes on and the run succeeds. The pod tells the
// cluster autoscaler to keep its node. After the run nothing of it is
// left, its budget neither. The runner has its own Role only.
func TestRunPodNotEvicted(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	runID := randomID("pdb")
	pod, done, cleaner := startHeld(t, c, runID)

	if got := pod.Annotations[kubernetes.AnnotationSafeToEvict]; got != "false" {
		t.Errorf("pod annotation %s = %q, want \"false\"", kubernetes.AnnotationSafeToEvict, got)
	}
	name := kubernetes.JobName(runID)
	budgets := c.Clientset.PolicyV1().PodDisruptionBudgets(c.Namespace)
	// The disruption controller counts the pod first: an eviction before
	// that is refused too, but not for the count.
	var pdb *policyv1.PodDisruptionBudget
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := wait.PollUntilContextCancel(wctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var err error
		pdb, err = budgets.Get(ctx, name, metav1.GetOptions{})
		return err == nil && pdb.Status.ObservedGeneration == pdb.Generation && pdb.Status.ExpectedPods == 1 && pdb.Status.CurrentHealthy == 1, nil
	}); err != nil {
		t.Fatalf("budget %s never counted the run's pod: %+v, %v", name, pdb, err)
	}
	if pdb.Labels[kubernetes.LabelRun] != runID || pdb.Labels[kubernetes.LabelRunner] != pod.Labels[kubernetes.LabelRunner] ||
		pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.String() != "1" || pdb.Status.DisruptionsAllowed != 0 {
		t.Errorf("budget %s: labels %v, minAvailable %v, disruptions allowed %d; want the run's, 1, 0",
			name, pdb.Labels, pdb.Spec.MinAvailable, pdb.Status.DisruptionsAllowed)
	}

	err := evict(ctx, c, pod)
	if !apierrors.IsTooManyRequests(err) {
		t.Fatalf("eviction of the run's pod while its step runs: %v, want 429", err)
	}
	var causes []string
	if st, ok := err.(apierrors.APIStatus); ok && st.Status().Details != nil {
		for _, cause := range st.Status().Details.Causes {
			causes = append(causes, string(cause.Type)+": "+cause.Message)
		}
	}
	if !strings.Contains(strings.Join(causes, "; "), name) {
		t.Errorf("the refusal %v (causes %q) does not name the budget %s", err, causes, name)
	}
	t.Logf("eviction refused: %v (%s)", err, strings.Join(causes, "; "))
	if p, err := c.Clientset.CoreV1().Pods(c.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("the run's pod after the refused eviction: %v, being deleted: %v", err, p != nil && p.DeletionTimestamp != nil)
	}

	var out bytes.Buffer
	if code, err := c.Exec(ctx, c.Namespace, pod.Name, "run", []string{"touch", "/tmp/go"}, nil, &out, &out); err != nil || code != 0 {
		t.Fatalf("let the step end: exit %d, %v: %s", code, err, out.String())
	}
	res := <-done
	if res.Status != run.Success || !strings.Contains(string(res.Log), "held") {
		t.Fatalf("status %s (%s), want success with the step's output\nlog:\n%s", res.Status, res.Error, res.Log)
	}
	if err := cleaner.Wait(ctx); err != nil || cleaner.Failures() != 0 {
		t.Fatalf("clean-up: %v, %d failed", err, cleaner.Failures())
	}
	if _, err := budgets.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("budget %s after the run: %v, want it gone", name, err)
	}
	waitGone(t, c)
	assertNothingLeft(t, c)
}

// TestEvictedMidStepEndsError: a pod taken away while a step runs (here
// evicted through the API once its budget is deleted: a forced drain,
// or what the kubelet's node-pressure eviction does without asking)
// ends the run error, never success, with Kubernetes' reason and
// message in the result.
func TestEvictedMidStepEndsError(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	runID := randomID("evict")
	pod, done, cleaner := startHeld(t, c, runID)

	if err := c.Clientset.PolicyV1().PodDisruptionBudgets(c.Namespace).Delete(ctx, kubernetes.JobName(runID), metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete the run's budget: %v", err)
	}
	if err := evict(ctx, c, pod); err != nil {
		t.Fatalf("eviction of the run's pod without its budget: %v", err)
	}
	res := <-done
	if res.Status != run.Error {
		t.Fatalf("status %s (%s), want error: the pod was evicted mid-step\nlog:\n%s", res.Status, res.Error, res.Log)
	}
	for _, want := range []string{"was disrupted while the step ran", "EvictionByEvictionAPI", "Eviction API: evicting"} {
		if !strings.Contains(res.Error, want) {
			t.Errorf("error %q lacks %q", res.Error, want)
		}
	}
	t.Logf("run ended %s: %s", res.Status, res.Error)
	if err := cleaner.Wait(ctx); err != nil || cleaner.Failures() != 0 {
		t.Fatalf("clean-up: %v, %d failed", err, cleaner.Failures())
	}
	waitGone(t, c)
	assertNothingLeft(t, c)
}

// TestOrphanBudgetSwept: a budget of the runner's whose run is not
// going on is deleted by the sweep and logged, even one no Job owns
// (whatever deletes a Job deletes its budget with it, but for a Job
// deleted leaving its dependents); one whose run is going on stays.
func TestOrphanBudgetSwept(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	runner := "did:plc:" + randomID("orphanpdb")
	kubeconfig := c.ScopedKubeconfig(t, "runner", kubecred.Rules())
	j := newJournal()
	ex := newExecutor(t, c, func(cfg *kubernetes.Config) {
		cfg.Runner, cfg.Credentials.Kubeconfig, cfg.Logger = runner, kubeconfig, slog.New(j)
	})
	budgets := c.Clientset.PolicyV1().PodDisruptionBudgets(c.Namespace)
	runs := []string{randomID("gone"), randomID("going")}
	for _, id := range runs {
		job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: kubernetes.JobName(id), Namespace: c.Namespace,
			Labels: map[string]string{kubernetes.LabelRunner: kubernetes.RunnerLabel(runner)}}}
		pdb := kubernetes.BuildDisruptionBudget(job, id)
		pdb.OwnerReferences = nil
		if _, err := budgets.Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ex.Sweep(ctx, runs[1:]); err != nil {
		t.Fatal(err)
	}
	j.has(t, "orphan budget swept", 1, map[string]string{"run": runs[0], "budget": kubernetes.JobName(runs[0]), "namespace": c.Namespace})
	if _, err := budgets.Get(ctx, kubernetes.JobName(runs[0]), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the orphan budget after the sweep: %v, want it gone", err)
	}
	if _, err := budgets.Get(ctx, kubernetes.JobName(runs[1]), metav1.GetOptions{}); err != nil {
		t.Errorf("the going run's budget after the sweep: %v, want it there", err)
	}
	if _, err := ex.Sweep(ctx, nil); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, c)
}
