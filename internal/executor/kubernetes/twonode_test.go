package kubernetes_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/kube/kubecred"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/tests/clustertest"
)

// The tests of this file need the cluster's second node
// (tests/cluster/add-node): tests/run-all.sh runs them in a phase of
// their own, after adding it.

// holdStep is a step that runs until the test touches /work/release.
const holdStep = "on: push\nsteps: [{run: 'echo holding; while [ ! -e release ]; do sleep 0.2; done; echo released'}]\n"

// release lets a run of holdStep end.
func release(t *testing.T, c *clustertest.Cluster, pod string) {
	t.Helper()
	var out bytes.Buffer
	if code, err := c.Exec(context.Background(), c.Namespace, pod, "run", []string{"touch", "/work/release"}, nil, &out, &out); err != nil || code != 0 {
		t.Fatalf("release the run in pod %s: exit %d, %v: %s", pod, code, err, out.String())
	}
}

// Two runs of one runner at once land on the two nodes (one run per
// node); a third waits Pending, unschedulable for the anti-affinity,
// which the runner logs as the scale-up signal; when one node frees, the
// third runs there.
func TestTwoNodesOneRunPerNode(t *testing.T) {
	t.Parallel()
	c, node2 := clustertest.StartTwoNodes(t)
	ctx := context.Background()
	var logs syncbuf.Buffer
	runner := "did:plc:" + randomID("spread")
	mod := func(cfg *kubernetes.Config) {
		cfg.Runner = runner
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}
	type result struct {
		id  string
		res *run.Result
	}
	results := make(chan result, 3)
	start := func(id string) {
		go func() {
			ex := newExecutor(t, c, mod)
			results <- result{id, engine(ex, c.Image).Run(ctx, run.Request{RunID: id, Workflow: parse(t, holdStep), Checkout: t.TempDir(), Trusted: true})}
		}()
	}
	waitCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	ready := func(id string) *corev1.Pod {
		t.Helper()
		pod, err := c.WaitForPod(waitCtx, c.Namespace, kubernetes.LabelRun+"="+id, clustertest.PodReady)
		if err != nil {
			t.Fatal(err)
		}
		return pod
	}

	firstID, secondID, thirdID := randomID("one"), randomID("two"), randomID("three")
	start(firstID)
	start(secondID)
	first, second := ready(firstID), ready(secondID)
	t.Logf("run %s on node %s, run %s on node %s", firstID, first.Spec.NodeName, secondID, second.Spec.NodeName)
	nodes := map[string]bool{first.Spec.NodeName: true, second.Spec.NodeName: true}
	if !nodes[c.Info.NodeName] || !nodes[node2.Name] {
		t.Fatalf("two runs at once are on nodes %s and %s, want %s and %s", first.Spec.NodeName, second.Spec.NodeName, c.Info.NodeName, node2.Name)
	}

	start(thirdID)
	pending, err := c.WaitForPod(waitCtx, c.Namespace, kubernetes.LabelRun+"="+thirdID, clustertest.PodUnschedulable)
	if err != nil {
		t.Fatalf("the third run's pod never waited for a node: %v", err)
	}
	for _, cond := range pending.Status.Conditions {
		if cond.Type == corev1.PodScheduled {
			t.Logf("third run's pod: %s: %s", cond.Reason, cond.Message)
			if !strings.Contains(cond.Message, "0/2 nodes are available") || !strings.Contains(cond.Message, "anti-affinity") {
				t.Errorf("the third run's pod waits for %q, want both nodes refusing it for the anti-affinity", cond.Message)
			}
		}
	}
	signal := func() string {
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, "run="+thirdID) && strings.Contains(l, "Pending is the scale-up signal") {
				return l
			}
		}
		return ""
	}
	for signal() == "" && waitCtx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
	}
	if line := signal(); !strings.Contains(line, "one run per node") || !strings.Contains(line, "anti-affinity") {
		t.Fatalf("no scale-up signal naming one run per node for the third run in the runner's log:\n%s", logs.String())
	} else {
		t.Logf("runner's log: %s", strings.TrimSpace(line))
	}
	select {
	case r := <-results:
		t.Fatalf("run %s ended while the nodes were held: %s (%s)", r.id, r.res.Status, r.res.Error)
	default:
	}

	// The first run's node frees: the third run gets it.
	release(t, c, first.Name)
	third := ready(thirdID)
	if third.Spec.NodeName != first.Spec.NodeName {
		t.Errorf("the third run went to node %s, want %s, the one the first run freed", third.Spec.NodeName, first.Spec.NodeName)
	}
	release(t, c, second.Name)
	release(t, c, third.Name)
	for range 3 {
		r := <-results
		if r.res.Status != run.Success || !strings.Contains(string(r.res.Log), "released") {
			t.Errorf("run %s: status %s (%s)\nlog:\n%s", r.id, r.res.Status, r.res.Error, r.res.Log)
		}
	}
	assertNothingLeft(t, c)
}

// pinnedPod starts a plain pod (not a run's) running script on node and
// waits until it is Ready.
func pinnedPod(t *testing.T, c *clustertest.Cluster, name, node, script string) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	grace := int64(1)
	_, err := c.Clientset.CoreV1().Pods(c.Namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  new(bool),
			Containers: []corev1.Container{{
				Name: "run", Image: c.Image, ImagePullPolicy: corev1.PullNever, Command: []string{"sh", "-c", script},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	pod, err := c.WaitForPod(ctx, c.Namespace, "app="+name, clustertest.PodReady)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// The runner's NetworkPolicy holds across nodes: a pod on the other node
// reaches a plain pod beside the run (so the path between the nodes is
// open) but not the run's pod.
func TestTwoNodesNetworkPolicy(t *testing.T) {
	t.Parallel()
	c, node2 := clustertest.StartTwoNodes(t)
	ctx := context.Background()
	runID := randomID("np2")
	done := make(chan *run.Result, 1)
	src := "on: push\nsteps: [{run: 'nc -ll -p 8080 -e echo pong & while [ ! -e release ]; do sleep 0.2; done; kill $!; echo released'}]\n"
	go func() {
		done <- engine(newExecutor(t, c, nil), c.Image).Run(ctx, run.Request{RunID: runID, Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: true})
	}()
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	runPod, err := c.WaitForPod(waitCtx, c.Namespace, kubernetes.LabelRun+"="+runID, clustertest.PodReady)
	if err != nil {
		t.Fatal(err)
	}
	other := node2.Name
	if runPod.Spec.NodeName == node2.Name {
		other = c.Info.NodeName
	}
	t.Logf("run pod %s (%s) on node %s; prober on node %s", runPod.Name, runPod.Status.PodIP, runPod.Spec.NodeName, other)
	beside := pinnedPod(t, c, "beside", runPod.Spec.NodeName, "exec nc -ll -p 8080 -e echo pong")
	prober := pinnedPod(t, c, "prober", other, "exec sleep 3600")
	probe := func(ip string) (string, int) {
		var out bytes.Buffer
		code, err := c.Exec(ctx, c.Namespace, prober.Name, "run",
			[]string{"sh", "-c", "(sleep 1 | nc -w 2 " + ip + " 8080) 2>&1"}, nil, &out, &out)
		if err != nil {
			t.Fatalf("probe %s: %v", ip, err)
		}
		return strings.TrimSpace(out.String()), code
	}
	// A plain pod's nc may listen a moment after Ready: a few tries.
	var out string
	var code int
	for try := 1; try <= 5; try++ {
		if out, code = probe(beside.Status.PodIP); code == 0 && out == "pong" {
			break
		}
		t.Logf("pod beside the run, try %d: %q, exit %d", try, out, code)
		time.Sleep(time.Second)
	}
	if code != 0 || out != "pong" {
		t.Fatalf("a pod on node %s does not reach a plain pod on node %s (%q, exit %d): the path between the nodes is closed", other, runPod.Spec.NodeName, out, code)
	}
	t.Logf("the pod beside the run answered %q across the nodes", out)
	// The run's listener answers inside its pod (it started with the
	// step, after Ready: a few tries), so a refusal from the other node
	// is the policy's.
	for try := 1; ; try++ {
		var local bytes.Buffer
		code, err := c.Exec(ctx, c.Namespace, runPod.Name, "run", []string{"sh", "-c", "(sleep 1 | nc -w 2 127.0.0.1 8080) 2>&1"}, nil, &local, &local)
		if err == nil && code == 0 && strings.TrimSpace(local.String()) == "pong" {
			break
		}
		if try == 10 {
			t.Fatalf("the run's listener does not answer inside its pod: exit %d, %v: %q", code, err, local.String())
		}
		time.Sleep(time.Second)
	}
	for try := 1; try <= 5; try++ {
		out, code := probe(runPod.Status.PodIP)
		if code == 0 || strings.Contains(out, "pong") {
			t.Fatalf("a pod on the other node reached the run's pod (try %d): %q", try, out)
		}
		t.Logf("run pod, try %d: refused (exit %d, %q)", try, code, out)
		time.Sleep(time.Second)
	}
	release(t, c, runPod.Name)
	res := <-done
	if res.Status != run.Success || !strings.Contains(string(res.Log), "released") {
		t.Errorf("status %s (%s)\nlog:\n%s", res.Status, res.Error, res.Log)
	}
	assertNothingLeft(t, c)
}

// A node lost mid-run (its machine gone: every process of it killed, its
// Node deleted as a cloud would): the run ends error naming the node,
// and nothing of it is left. The runner here has the cluster's admin
// credential: it reads the Node and force-deletes the pod.
func TestTwoNodesNodeLost(t *testing.T) {
	c, node2 := clustertest.StartTwoNodesExclusive(t)
	loseNodeMidRun(t, c, node2, false, "its Node was deleted")
}

// TestTwoNodesNodeLostScoped is TestTwoNodesNodeLost with the runner's
// own credential (kubecred.Rules: no Nodes, no pod deletes): the node is
// named from the API server's refusal of the reattach (it has no such
// Node), and the pod goes when the pod garbage collector deletes it.
func TestTwoNodesNodeLostScoped(t *testing.T) {
	c, node2 := clustertest.StartTwoNodesExclusive(t)
	loseNodeMidRun(t, c, node2, true, "the API server has no Node")
}

// TestTwoNodesNodeLostPodGC is TestTwoNodesNodeLostScoped with the
// exec's NotFound overlooked, as from an API server that answers
// otherwise: the node is named from the pod garbage collector's
// DisruptionTarget mark (up to 80 s after the loss), and Stop waits the
// moment the collector's force-delete takes.
func TestTwoNodesNodeLostPodGC(t *testing.T) {
	c, node2 := clustertest.StartTwoNodesExclusive(t)
	t.Cleanup(kubernetes.IgnoreExecNoNode())
	loseNodeMidRun(t, c, node2, true, "PodGC: node no longer exists")
}

// loseNodeMidRun loses the node of a running step; the run's error must
// name the node and say how the runner knew (why). The waits are bounded
// only to fail a hang; the test logs how long each took. Each test
// calls StartTwoNodesExclusive itself: tests/run-all.sh picks the
// two-node tests by that call in their own body.
func loseNodeMidRun(t *testing.T, c *clustertest.Cluster, node2 *clustertest.Node, scoped bool, why string) {
	ctx := context.Background()
	// Only the second node may take the run.
	if err := c.RemoveCapacity(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.AddCapacityOn(ctx, node2.Name); err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	mod := func(cfg *kubernetes.Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}
	if scoped {
		kubeconfig := c.ScopedKubeconfig(t, "runner", kubecred.Rules())
		mod = func(cfg *kubernetes.Config) {
			cfg.Credentials.Kubeconfig = kubeconfig
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		}
	}
	runID := randomID("lost")
	live := &liveLog{want: "before\n", seen: make(chan struct{})}
	done := make(chan *run.Result, 1)
	go func() {
		done <- engine(newExecutor(t, c, mod), c.Image).Run(ctx, run.Request{
			RunID: runID, Workflow: parse(t, "on: push\nsteps: [{run: 'echo before; sleep 600; echo after'}]\n"),
			Checkout: t.TempDir(), Trusted: true, Live: live,
		})
	}()
	select {
	case <-live.seen:
	case res := <-done:
		t.Fatalf("the run ended before its step's first line: %s (%s)\n%s", res.Status, res.Error, res.Log)
	case <-time.After(2 * time.Minute):
		t.Fatal("the run's step did not start within 2m")
	}
	pod, err := c.WaitForPod(ctx, c.Namespace, kubernetes.LabelRun+"="+runID, func(*corev1.Pod) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != node2.Name {
		t.Fatalf("the run is on node %s, want %s", pod.Spec.NodeName, node2.Name)
	}

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := c.AddSecondNode(ctx); err != nil {
			t.Errorf("bring the second node back: %v", err)
		}
	})
	lost := time.Now()
	if err := c.LoseSecondNode(ctx); err != nil {
		t.Fatal(err)
	}
	var res *run.Result
	select {
	case res = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatalf("the run did not end within 5m of losing its node; runner's log:\n%s", logs.String())
	}
	t.Logf("the run ended %v after its node was lost: %s (%s)", time.Since(lost).Round(time.Millisecond), res.Status, res.Error)
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "node") && (strings.Contains(l, "lost") || strings.Contains(l, "gone") || strings.Contains(l, "PodGC") || strings.Contains(l, "job deleted")) {
			t.Logf("runner's log: %s", strings.TrimSpace(l))
		}
	}
	if res.Status != run.Error || !strings.Contains(res.Error, "node "+node2.Name) || !strings.Contains(res.Error, why) {
		t.Errorf("status %s (%s), want error naming the lost node %s (%s)\nlog:\n%s\nrunner's log:\n%s", res.Status, res.Error, node2.Name, why, res.Log, logs.String())
	}
	if strings.Contains(string(res.Log), "after") {
		t.Errorf("the step went on after its node was lost:\n%s", res.Log)
	}
	if strings.Contains(logs.String(), "delete job") {
		t.Errorf("the runner failed to delete the run's Job:\n%s", logs.String())
	}
	if scoped {
		// The runner may not delete the pod of the lost node: its Stop
		// deleted the Job and left the pod to the pod garbage collector,
		// which must delete it (up to 80 s after the Node went).
		waitPodGC(t, c, runID, lost)
	}
	// With the admin credential Stop returned once the run's pod was
	// gone: nothing may be left for anyone to wait on.
	assertNothingLeft(t, c)
}

// waitPodGC waits (bounded only to fail a hang) until the run's pods are
// gone, and logs how long after the node's loss.
func waitPodGC(t *testing.T, c *clustertest.Cluster, runID string, lost time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelRun + "=" + runID})
		if err == nil && len(pods.Items) == 0 {
			t.Logf("the run's pod was gone %v after its node was lost", time.Since(lost).Round(time.Second))
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the run's pods are still there %v after its node was lost: %v %v", time.Since(lost).Round(time.Second), pods, err)
		}
		time.Sleep(time.Second)
	}
}
