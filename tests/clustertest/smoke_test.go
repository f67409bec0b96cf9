package clustertest_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"knotless.dev/run/tests/clustertest"
)

func TestMain(m *testing.M) { clustertest.Main(m) }

// job is a one-pod Job running script in the run image, labelled
// app=name, that never restarts.
func job(c *clustertest.Cluster, name, image, script string) *batchv1.Job {
	var zero int32
	grace := int64(1)
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: &zero,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: &grace,
					AutomountServiceAccountToken:  new(bool),
					Containers: []corev1.Container{{
						Name:            "run",
						Image:           image,
						ImagePullPolicy: corev1.PullNever,
						Command:         []string{"sh", "-c", script},
					}},
				},
			},
		},
	}
}

// runJob creates the Job and waits until its pod is Ready.
func runJob(ctx context.Context, t *testing.T, c *clustertest.Cluster, j *batchv1.Job) *corev1.Pod {
	t.Helper()
	if _, err := c.Clientset.BatchV1().Jobs(c.Namespace).Create(ctx, j, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create job %s: %v", j.Name, err)
	}
	start := time.Now()
	pod, err := c.WaitForPod(ctx, c.Namespace, "app="+j.Name, clustertest.PodReady)
	if err != nil {
		t.Fatalf("job %s: %v", j.Name, err)
	}
	t.Logf("job %s: pod %s Ready after %v", j.Name, pod.Name, time.Since(start).Round(time.Millisecond))
	return pod
}

func TestJobExec(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	pod := runJob(ctx, t, c, job(c, "exec", c.Image, "exec sleep 3600"))

	// A tar stream in on stdin, unpacked in the pod, its file's digest
	// taken there, and packed back out on stdout.
	payload := make([]byte, 1<<20)
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(payload)
	want := hex.EncodeToString(sum[:])
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	if err := tw.WriteHeader(&tar.Header{Name: "dir/payload.bin", Mode: 0o644, Size: int64(len(payload)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(payload); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	start := time.Now()
	code, err := c.Exec(ctx, c.Namespace, pod.Name, "run",
		[]string{"sh", "-c", "mkdir -p /tmp/in && tar -x -C /tmp/in && sha256sum /tmp/in/dir/payload.bin >&2 && tar -c -C /tmp/in dir"},
		&in, &out, &errOut)
	if err != nil || code != 0 {
		t.Fatalf("exec tar round trip: code %d, err %v, stderr %q", code, err, errOut.String())
	}
	t.Logf("tar round trip of %d bytes: %v", len(payload), time.Since(start).Round(time.Millisecond))
	if got := strings.Fields(errOut.String()); len(got) == 0 || got[0] != want {
		t.Errorf("digest in the pod: got %q, want %s", errOut.String(), want)
	}
	tr := tar.NewReader(&out)
	h, err := tr.Next()
	for err == nil && h.Typeflag != tar.TypeReg {
		h, err = tr.Next()
	}
	if err != nil {
		t.Fatalf("read tar from the pod: %v", err)
	}
	back := sha256.New()
	if _, err := io.Copy(back, tr); err != nil {
		t.Fatalf("read tar from the pod: %v", err)
	}
	if got := hex.EncodeToString(back.Sum(nil)); h.Name != "dir/payload.bin" || got != want {
		t.Errorf("tar back from the pod: got %s %s, want dir/payload.bin %s", h.Name, got, want)
	}

	// An exit code comes back as itself, and the command runs once (a
	// fallback after a non-zero exit would run it again).
	code, err = c.Exec(ctx, c.Namespace, pod.Name, "run", []string{"sh", "-c", "echo once >>/tmp/runs; exit 42"}, nil, io.Discard, io.Discard)
	if err != nil || code != 42 {
		t.Errorf("exit 42: got code %d, err %v", code, err)
	}
	out.Reset()
	start = time.Now()
	code, err = c.Exec(ctx, c.Namespace, pod.Name, "run", []string{"cat", "/tmp/runs"}, nil, &out, io.Discard)
	if err != nil || code != 0 || out.String() != "once\n" {
		t.Errorf("the failing command ran %q (code %d, err %v), want once", out.String(), code, err)
	}
	t.Logf("exec round trip: %v", time.Since(start).Round(time.Millisecond))

	// The Job deletes, its pod with it.
	if err := c.DeleteJob(ctx, c.Namespace, "exec"); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=exec"})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Errorf("the deleted Job's pod did not go: %v", err)
	}
}

func TestRBAC(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cs := c.Clientset
	if _, err := cs.CoreV1().ServiceAccounts(c.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().Roles(c.Namespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "runner"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "list", "delete"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(c.Namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "runner"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "runner"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "runner", Namespace: c.Namespace}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := c.TokenConfig(ctx, c.Namespace, "runner")
	if err != nil {
		t.Fatal(err)
	}
	runner, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	j := job(c, "rbac", c.Image, "true")
	if _, err := runner.BatchV1().Jobs(c.Namespace).Create(ctx, j, metav1.CreateOptions{}); err != nil {
		t.Errorf("the runner's token cannot create a Job in its namespace: %v", err)
	}
	node := c.Info.NodeName
	if node == "" {
		node = "any" // authorization comes before the lookup
	}
	if _, err := runner.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("get nodes with the runner's token: got %v, want Forbidden", err)
	}
	if _, err := runner.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list Jobs of another namespace with the runner's token: got %v, want Forbidden", err)
	}

	// Revoked, the token is refused (once the API server's cache of
	// successful authentications, 10 s, has let it go).
	if err := c.RevokeToken(ctx, c.Namespace, "runner"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := runner.BatchV1().Jobs(c.Namespace).List(ctx, metav1.ListOptions{})
		return apierrors.IsUnauthorized(err), nil
	})
	if err != nil {
		t.Errorf("the revoked token is still accepted: %v", err)
	}
	t.Logf("the revoked token was refused %v after the revocation", time.Since(start).Round(time.Millisecond))
}

func TestNetworkPolicy(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	server := runJob(ctx, t, c, job(c, "run", c.Image, "exec nc -ll -p 8080 -e echo pong"))
	client := runJob(ctx, t, c, job(c, "prober", c.Image, "exec sleep 3600"))
	probe := func() (string, int) {
		// The shell joins the streams: the exec copies two concurrently.
		var out bytes.Buffer
		code, err := c.Exec(ctx, c.Namespace, client.Name, "run",
			[]string{"sh", "-c", "(sleep 1 | nc -w 2 " + server.Status.PodIP + " 8080) 2>&1"}, nil, &out, io.Discard)
		if err != nil {
			t.Fatalf("probe: %v", err)
		}
		return strings.TrimSpace(out.String()), code
	}
	// The server pod has no readiness probe: Ready can come a moment
	// before nc listens, so the baseline gets a few tries.
	var out string
	var code int
	for try := 1; try <= 5; try++ {
		if out, code = probe(); code == 0 && out == "pong" {
			break
		}
		t.Logf("without a policy, try %d: probe got %q, exit %d", try, out, code)
		time.Sleep(time.Second)
	}
	if code != 0 || out != "pong" {
		t.Fatalf("without a policy: probe got %q, exit %d; want pong, 0", out, code)
	}

	if _, err := c.Clientset.NetworkingV1().NetworkPolicies(c.Namespace).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "default-deny-ingress"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "run"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		out, code := probe()
		if code != 0 {
			t.Logf("with default-deny-ingress: probe refused (exit %d, %q) %v after the policy", code, out, time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("with default-deny-ingress: the probe still connects after %v", time.Since(start))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// testHostCIDR is the link prefix of the egress test's own "outside"
// host: a network namespace this test makes. It must not be the pod or
// link prefix of the cluster.
func testHostCIDR() string {
	if v := os.Getenv("KNOTLESS_TEST_TESTHOST_CIDR"); v != "" {
		return v
	}
	return "10.223.254.0/30"
}

func TestEgressGuard(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	host := c.NewTestHost(t, testHostCIDR())
	const port = 9000
	host.Listen(t, port, c.Info.PodCIDR)

	// The link works: the node itself (not a pod) reaches the listener.
	out, err := host.InNode(ctx, "busybox", "nc", "-w", "2", host.IP, fmt.Sprint(port))
	if err != nil || strings.TrimSpace(string(out)) != "hello" {
		t.Fatalf("from the node to the test host: %q, %v; want hello", out, err)
	}

	pod := runJob(ctx, t, c, job(c, "egress", c.Image, "exec sleep 3600"))
	before, err := host.GuardDrops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var probeOut bytes.Buffer
	code, err := c.Exec(ctx, c.Namespace, pod.Name, "run",
		[]string{"sh", "-c", fmt.Sprintf("nc -w 3 %s %d </dev/null", host.IP, port)}, nil, &probeOut, &probeOut)
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	after, err := host.GuardDrops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	arrived, err := host.Arrived(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod -> test host: exit %d %q; guard drops %d -> %d; packets at the test host %d",
		code, strings.TrimSpace(probeOut.String()), before, after, arrived)
	if code == 0 || strings.Contains(probeOut.String(), "hello") {
		t.Errorf("a pod reached the test host off the pod network (exit %d, %q)", code, probeOut.String())
	}
	if after <= before {
		t.Errorf("the egress guard's counter did not rise (%d -> %d)", before, after)
	}
	if arrived != 0 {
		t.Errorf("%d packets from the pod network arrived at the test host", arrived)
	}
}

// TestServeOnNodeAddress: a pod reaches an address the node serves on
// its loopback (what egress tests use as the public internet and the
// metadata service: the egress guard drops everything a pod sends past
// the node), and the address is gone from the node after the test.
func TestServeOnNodeAddress(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	pod := runJob(ctx, t, c, job(c, "served", c.Image, "exec sleep 3600"))
	// Not an address the executor's egress test serves: the two may run
	// at once, and the first to end would take it from the other.
	const ip = "198.51.100.8"
	t.Run("served", func(t *testing.T) {
		addr := c.ServeOnNodeAddress(t, ip)
		host, port, _ := strings.Cut(addr, ":")
		// Up to three tries: once, under load, a try got exit 0 and no
		// bytes (the answer lost between the pod and this process, or
		// a connection closed early); the address must answer one.
		var tries []string
		for range 3 {
			var stdout, stderr bytes.Buffer
			code, err := c.Exec(ctx, c.Namespace, pod.Name, "run",
				[]string{"sh", "-c", fmt.Sprintf("nc -w 3 %s %s </dev/null", host, port)}, nil, &stdout, &stderr)
			if err == nil && code == 0 && strings.TrimSpace(stdout.String()) == "hello from "+ip {
				return
			}
			tries = append(tries, fmt.Sprintf("exit %d, %q, %q, %v", code, stdout.String(), stderr.String(), err))
			t.Logf("pod -> %s: %s", addr, tries[len(tries)-1])
		}
		t.Errorf("pod -> %s: no try answered hello from %s: %s", addr, ip, strings.Join(tries, "; "))
	})
	out, err := exec.CommandContext(ctx, "ip", "-n", c.Info.NodeNetns, "-o", "addr", "show", "dev", "lo").CombinedOutput()
	if err != nil {
		t.Fatalf("node addresses: %v: %s", err, out)
	}
	if strings.Contains(string(out), " "+ip+"/") {
		t.Errorf("%s is still on the node's loopback after the test:\n%s", ip, out)
	}
}

func TestScaleSignal(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := c.RemoveCapacity(ctx); err != nil {
		t.Fatal(err)
	}
	waits := job(c, "waits", c.Image, "exec sleep 3600")
	// The kubelet may refuse the first pod the scheduler places once the
	// label is back, by its older view of the node (NodeAffinity); the
	// Job makes another, as the runner's Jobs do.
	waits.Spec.BackoffLimit = ptr.To[int32](2)
	if _, err := c.Clientset.BatchV1().Jobs(c.Namespace).Create(ctx, waits, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := c.WaitForPod(ctx, c.Namespace, "app=waits", clustertest.PodUnschedulable)
	if err != nil {
		t.Fatalf("with no capacity: %v", err)
	}
	t.Logf("with no capacity: %s", pod.Status.Conditions[0].Message)
	if err := c.AddCapacity(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitForPod(ctx, c.Namespace, "app=waits", clustertest.PodReady); err != nil {
		t.Fatalf("with capacity back: %v", err)
	}
}

func TestUnavailableImages(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	never := func(p *corev1.Pod) bool { return clustertest.PodWaitingReason(p) == "ErrImageNeverPull" }

	if _, err := c.Clientset.BatchV1().Jobs(c.Namespace).Create(ctx, job(c, "absent", clustertest.UnavailableImage, "true"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitForPod(ctx, c.Namespace, "app=absent", never); err != nil {
		t.Errorf("an image never imported: %v", err)
	}

	img, err := c.TempImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	runJob(ctx, t, c, job(c, "present", img, "exec sleep 3600"))
	if err := c.RemoveImage(ctx, img); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clientset.BatchV1().Jobs(c.Namespace).Create(ctx, job(c, "removed", img, "true"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitForPod(ctx, c.Namespace, "app=removed", never); err != nil {
		t.Errorf("an image removed from the node: %v", err)
	}
}

// TestRestartAPIServer is disruptive: it holds the cluster alone.
func TestRestartAPIServer(t *testing.T) {
	c := clustertest.StartExclusive(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	pod := runJob(ctx, t, c, job(c, "stream", c.Image, "exec sleep 3600"))

	done := make(chan error, 1)
	streaming := make(chan struct{})
	go func() {
		pr, pw := io.Pipe()
		defer pw.Close()
		go func() {
			_, _ = io.Copy(io.Discard, pr) // drains the exec's output
		}()
		w := &signalWriter{w: pw, first: streaming}
		_, err := c.Exec(ctx, c.Namespace, pod.Name, "run", []string{"sh", "-c", "echo started; exec sleep 60"}, nil, w, io.Discard)
		done <- err
	}()
	select {
	case <-streaming:
	case <-ctx.Done():
		t.Fatal("the exec stream did not start")
	}
	start := time.Now()
	if err := c.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server restarted in %v", time.Since(start).Round(time.Millisecond))
	select {
	case err := <-done:
		if err == nil {
			t.Error("the exec stream ended without an error across an API server restart")
		} else {
			t.Logf("the exec stream dropped: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("the exec stream survived an API server restart")
	}
	if _, err := c.Clientset.CoreV1().Pods(c.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the API server after the restart: %v", err)
	}
}

// signalWriter closes first on the first write.
type signalWriter struct {
	w     io.Writer
	first chan struct{}
	seen  bool
}

func (s *signalWriter) Write(p []byte) (int, error) {
	if !s.seen {
		s.seen = true
		close(s.first)
	}
	return s.w.Write(p)
}
