package kubernetes_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/conformance"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/kube/kubecred"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/internal/rules/workflow"
	"knotless.dev/run/tests/clustertest"
)

func TestMain(m *testing.M) { clustertest.Main(m) }

func randomID(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// newExecutor returns an executor for the test's own namespace with a
// runner DID of its own.
func newExecutor(t *testing.T, c *clustertest.Cluster, mod func(*kubernetes.Config)) *kubernetes.Executor {
	t.Helper()
	cfg := kubernetes.Config{
		Credentials:     kubernetes.Credentials{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace},
		Runner:          "did:plc:" + randomID("test"),
		Pod:             kubernetes.PodOptions{Image: c.Image},
		ScheduleTimeout: 2 * time.Minute,
		PullGrace:       3 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	ex, err := kubernetes.New(cfg)
	if err != nil {
		t.Fatalf("new executor: %v", err)
	}
	return ex
}

func TestConformance(t *testing.T) {
	// One namespace a case: a second executor of a case is the same
	// runner in another process, with the same credentials.
	var mu sync.Mutex
	clusters := map[*testing.T]*clustertest.Cluster{}
	conformance.Run(t, conformance.Harness{
		New: func(t *testing.T) executor.Executor {
			mu.Lock()
			c := clusters[t]
			mu.Unlock()
			if c == nil {
				c = clustertest.Start(t)
				mu.Lock()
				clusters[t] = c
				mu.Unlock()
			}
			return newExecutor(t, c, func(cfg *kubernetes.Config) { cfg.Runner = "did:plc:conformance" })
		},
		Image:        os.Getenv(clustertest.EnvImage),
		SecretSearch: "/work /steps /outputs /knotless /tmp /etc /root /home /var",
		Fenced:       true,
		Services:     true,
		StepImages:   true,
	})
}

// assertNothingLeft checks that the namespace holds no Job, pod or Secret
// of any run.
func assertNothingLeft(t *testing.T, c *clustertest.Cluster) {
	t.Helper()
	assertNoRunObjects(t, c)
	secrets, err := c.Clientset.CoreV1().Secrets(c.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(secrets.Items) != 0 {
		t.Errorf("left behind: %d secrets", len(secrets.Items))
	}
}

func engine(ex executor.Executor, image string) *run.Engine {
	return run.New(run.Config{Executor: ex, DefaultImage: image, CleanupTimeout: time.Minute})
}

// engineCleaning is engine with the sessions removed after the verdict,
// by a Cleaner the test waits for (as the daemon and `run` do).
func engineCleaning(t *testing.T, ex executor.Executor, image string) (*run.Engine, *run.Cleaner) {
	t.Helper()
	cleaner := run.NewCleaner(nil)
	t.Cleanup(func() { _ = cleaner.Wait(context.Background()) })
	return run.New(run.Config{Executor: ex, DefaultImage: image, CleanupTimeout: time.Minute, Cleaner: cleaner}), cleaner
}

func parse(t *testing.T, src string) *workflow.Workflow {
	t.Helper()
	wf, err := workflow.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return wf
}

func TestExampleWorkflowLeavesNothing(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	wf, err := workflow.Load("../../../examples/hello/.knotless/workflows/build.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	eng, cleaner := engineCleaning(t, newExecutor(t, c, nil), c.Image)
	res := eng.Run(context.Background(), run.Request{
		RunID: randomID("ex"), Workflow: wf, Checkout: "../../../examples/hello", Outputs: out, Trusted: true,
	})
	if res.Status != run.Success {
		t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
	}
	if err := cleaner.Wait(context.Background()); err != nil || cleaner.Failures() != 0 {
		t.Fatalf("clean-up: %v, %d failed", err, cleaner.Failures())
	}
	if b, err := os.ReadFile(filepath.Join(out, "greeting.sha256")); err != nil || !strings.Contains(string(b), "greeting.txt") {
		t.Errorf("output greeting.sha256: %q %v", b, err)
	}
	assertNothingLeft(t, c)
}

// A 100 MiB checkout in and a 10 MiB output out, modes and links kept.
func TestLargeTransfers(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	checkout := t.TempDir()
	big := make([]byte, 100<<20)
	_, _ = rand.Read(big)
	if err := os.WriteFile(filepath.Join(checkout, "big.bin"), big, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("big.bin", filepath.Join(checkout, "link")); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(big)
	src := `on: push
steps:
  - name: check
    run: |
      sha256sum big.bin
      test -L link
      stat -c %a big.bin
      head -c 10485760 big.bin > "$KNOTLESS_RUN_OUTPUTS/part.bin"
      chmod 750 "$KNOTLESS_RUN_OUTPUTS/part.bin"
`
	out := filepath.Join(t.TempDir(), "out")
	res := engine(newExecutor(t, c, nil), c.Image).Run(context.Background(), run.Request{
		RunID: randomID("big"), Workflow: parse(t, src), Checkout: checkout, Outputs: out, Trusted: true,
	})
	if res.Status != run.Success {
		t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
	}
	log := string(res.Log)
	if !strings.Contains(log, hex.EncodeToString(sum[:])) || !strings.Contains(log, "\n640\n") {
		t.Errorf("checkout digest or mode differs in the pod:\n%s", log)
	}
	part, err := os.ReadFile(filepath.Join(out, "part.bin"))
	if err != nil || !bytes.Equal(part, big[:10<<20]) {
		t.Errorf("output part.bin differs (%d bytes, %v)", len(part), err)
	}
	if fi, err := os.Stat(filepath.Join(out, "part.bin")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("output mode %v, %v", fi.Mode(), err)
	}
}

// The secret appears nowhere in the Job, the pod, a Secret or the log.
func TestSecretNeverInSpecs(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	secret := randomID("s3cr3t-")
	ex := newExecutor(t, c, nil)
	src := "on: push\nsecrets: [TOKEN]\nsteps:\n  - {name: use, secrets: [TOKEN], run: 'printf \"%s\\n\" \"$TOKEN\"; sleep 3'}\n"
	done := make(chan *run.Result, 1)
	runID := randomID("sec")
	go func() {
		done <- engine(ex, c.Image).Run(context.Background(), run.Request{
			RunID: runID, Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: true,
			Secrets: map[string]string{"TOKEN": secret},
		})
	}()
	// While the step runs, read every object of the run as the API has it.
	ctx := context.Background()
	var seen []string
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && len(seen) < 2 {
		seen = seen[:0]
		if job, err := c.Clientset.BatchV1().Jobs(c.Namespace).Get(ctx, kubernetes.JobName(runID), metav1.GetOptions{}); err == nil {
			b, _ := json.Marshal(job)
			seen = append(seen, string(b))
		}
		if pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelRun + "=" + runID}); err == nil && len(pods.Items) > 0 {
			b, _ := json.Marshal(pods.Items)
			seen = append(seen, string(b))
		}
		time.Sleep(200 * time.Millisecond)
	}
	res := <-done
	if res.Status != run.Success {
		t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
	}
	if len(seen) < 2 {
		t.Fatalf("never saw the run's Job and pod")
	}
	for _, s := range append(seen, string(res.Log)) {
		if strings.Contains(s, secret) {
			t.Errorf("secret value found in %.200s…", s)
		}
	}
	if !strings.Contains(string(res.Log), "***") {
		t.Errorf("log does not show the masked value:\n%s", res.Log)
	}
	assertNothingLeft(t, c)
}

// The failure matrix: each case ends error, failure or cancelled with
// the cause in the result, and leaves nothing in the namespace: no Job,
// no pod, no Secret.
func TestFailureMatrix(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		src        string
		mod        func(*kubernetes.Config)
		during     func(t *testing.T, c *clustertest.Cluster, runID string)
		cancel     bool // cancel the run after during, as a cancel record or a newer push does
		wantStatus run.Status
		wantError  string
	}{
		{
			name: "image that does not exist", src: "on: push\nimage: " + clustertest.UnavailableImage + "\nsteps: [{run: 'true'}]\n",
			wantStatus: run.Error, wantError: "cannot pull image",
		},
		{
			name: "request above every node", src: "on: push\nresources: {cpu: '512'}\nsteps: [{run: 'true'}]\n",
			mod:        func(cfg *kubernetes.Config) { cfg.ScheduleTimeout = 5 * time.Second },
			wantStatus: run.Error, wantError: "Insufficient cpu",
		},
		{
			name: "job deleted while a step runs", src: "on: push\nsteps: [{name: long, run: 'echo started; sleep 120'}]\n",
			during: func(t *testing.T, c *clustertest.Cluster, runID string) {
				waitForLog(t, c, runID)
				if err := c.DeleteJob(context.Background(), c.Namespace, kubernetes.JobName(runID)); err != nil {
					t.Error(err)
				}
			},
			wantStatus: run.Error, wantError: "was deleted while the step ran",
		},
		{
			// The step's container's keep-alive is its PID 1: the pod
			// ends Succeeded and no event says why. The run ends at
			// once (the pod is terminal), not after the reattaches, and
			// not as lost: the step did it.
			name: "a step ends its own pod", src: "on: push\nsteps: [{name: kill, run: 'echo started; kill 1; sleep 120'}]\n",
			wantStatus: run.Error, wantError: "ended (Succeeded) while the step ran, and no event says why",
		},
		{
			name: "cancelled while a step runs", src: "on: push\nsteps: [{name: long, run: 'echo started; sleep 120'}]\n",
			during: func(t *testing.T, c *clustertest.Cluster, runID string) { waitForLog(t, c, runID) },
			cancel: true, wantStatus: run.Cancelled,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := clustertest.Start(t)
			runID := randomID("fm")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan *run.Result, 1)
			eng, cleaner := engineCleaning(t, newExecutor(t, c, tt.mod), c.Image)
			go func() {
				done <- eng.Run(ctx, run.Request{
					RunID: runID, Workflow: parse(t, tt.src), Checkout: t.TempDir(), Trusted: true,
				})
			}()
			if tt.during != nil {
				tt.during(t, c, runID)
			}
			if tt.cancel {
				cancel()
			}
			res := <-done
			if res.Status != tt.wantStatus || !strings.Contains(res.Error, tt.wantError) {
				t.Errorf("status %s (%s), want %s with %q\nlog:\n%s", res.Status, res.Error, tt.wantStatus, tt.wantError, res.Log)
			}
			// The clean-up goes on after the verdict; the owner waits.
			if err := cleaner.Wait(context.Background()); err != nil {
				t.Error(err)
			}
			assertNothingLeft(t, c)
		})
	}
}

// waitForLog waits until the run's pod is Ready and a step has had time
// to start.
func waitForLog(t *testing.T, c *clustertest.Cluster, runID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.WaitForPod(ctx, c.Namespace, kubernetes.LabelRun+"="+runID, clustertest.PodReady); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
}

// A runner without the right to create NetworkPolicies stops the run with
// an error that names RBAC.
func TestNetworkPolicyDenied(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	kubeconfig := c.ScopedKubeconfig(t, "runner", []rbacv1.PolicyRule{
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "list", "watch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: []string{"create", "get"}},
	})
	ex := newExecutor(t, c, func(cfg *kubernetes.Config) { cfg.Credentials.Kubeconfig = kubeconfig })
	res := engine(ex, c.Image).Run(ctx, run.Request{RunID: randomID("np"), Workflow: parse(t, "on: push\nsteps: [{run: 'true'}]\n"), Checkout: t.TempDir(), Trusted: true})
	if res.Status != run.Error || !strings.Contains(res.Error, "RBAC denies it") {
		t.Errorf("status %s (%s), want error naming RBAC", res.Status, res.Error)
	}
	assertNothingLeft(t, c)
}

// A runner killed mid-run leaves its Job; the next start sweeps it.
func TestOrphanSwept(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	runner := "did:plc:" + randomID("orphan")
	mod := func(cfg *kubernetes.Config) { cfg.Runner = runner }
	first := newExecutor(t, c, mod)
	if _, err := first.Start(ctx, executor.Spec{RunID: randomID("o"), Runner: runner, Image: c.Image, Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	// The first process is gone without stopping its session.
	m, reg := observed(t)
	j := newJournal()
	second := newExecutor(t, c, func(cfg *kubernetes.Config) { mod(cfg); cfg.Logger, cfg.Observer = slog.New(j), m })
	swept, err := second.Sweep(ctx, nil)
	if err != nil || len(swept) != 1 || second.Counters().Swept != 1 {
		t.Fatalf("Sweep = %v, %v (counted %d); want the one orphan", swept, err, second.Counters().Swept)
	}
	// The sweep's lines and counts, in the journal and the metrics.
	j.has(t, "orphan swept", 1, map[string]string{"run": swept[0].RunID, "job": swept[0].Name, "namespace": c.Namespace, "image": c.Image, "swept_total": "1"})
	j.has(t, "sweep finished", 1, map[string]string{"namespace": c.Namespace, "swept": "1", "failed": "0", "duration": "", "swept_total": "1", "cleanup_failures_total": "0"})
	for name, want := range map[string]float64{"knotless_run_sweeps_total": 1, "knotless_run_swept_objects_total": 1, "knotless_run_sweep_errors_total": 0} {
		if got := counterValue(t, reg, name); got != want {
			t.Errorf("%s = %g, want %g", name, got, want)
		}
	}
	waitGone(t, c)
	assertNothingLeft(t, c)
}

func waitGone(t *testing.T, c *clustertest.Cluster) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: kubernetes.LabelRunner})
		if err == nil && len(pods.Items) == 0 {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// An exec stream cut mid-step (the API server restarts) while the step
// goes on: the step's real exit code is reported, and its whole output.
func TestStreamCutMidStep(t *testing.T) {
	c := clustertest.StartExclusive(t)
	src := "on: push\nsteps:\n  - name: survive\n    run: |\n      echo before\n      sleep 8\n      echo after\n      exit 7\n"
	runID := randomID("cut")
	done := make(chan *run.Result, 1)
	go func() {
		done <- engine(newExecutor(t, c, nil), c.Image).Run(context.Background(), run.Request{
			RunID: runID, Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: true,
		})
	}()
	waitForLog(t, c, runID)
	if err := c.RestartAPIServer(context.Background()); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.Status != run.Failure || res.Steps[0].ExitCode == nil || *res.Steps[0].ExitCode != 7 {
		t.Fatalf("status %s (%s), steps %+v; want failure with exit 7\nlog:\n%s", res.Status, res.Error, res.Steps, res.Log)
	}
	if log := string(res.Log); !strings.Contains(log, "before") || !strings.Contains(log, "after") || strings.Count(log, "before") != 1 {
		t.Errorf("output lost or repeated across the cut:\n%s", log)
	}
	assertNothingLeft(t, c)
}

// Credentials that stop working mid-run (the token is revoked) end the
// run with an error that names the refusal; the Job's active deadline
// lets the cluster reap what the runner can no longer delete. Step a
// outlasts the API server's 10 s cache of successful authentications,
// so step b meets the revocation.
func TestTokenRevokedMidRun(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	kubeconfig := c.ScopedKubeconfig(t, "runner", kubecred.Rules())
	ex := newExecutor(t, c, func(cfg *kubernetes.Config) { cfg.Credentials.Kubeconfig = kubeconfig })
	runID := randomID("rev")
	done := make(chan *run.Result, 1)
	go func() {
		done <- engine(ex, c.Image).Run(context.Background(), run.Request{
			RunID: runID, Workflow: parse(t, "on: push\ntimeout: 2m\nsteps:\n  - {name: a, run: 'sleep 12'}\n  - {name: b, run: 'echo b'}\n"),
			Checkout: t.TempDir(), Trusted: true,
		})
	}()
	waitForLog(t, c, runID)
	if err := c.RevokeToken(context.Background(), c.Namespace, "runner"); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.Status != run.Error || !strings.Contains(res.Error, "Unauthorized") {
		t.Errorf("status %s (%s), want an error naming the refused credentials\nlog:\n%s", res.Status, res.Error, res.Log)
	}
	job, err := c.Clientset.BatchV1().Jobs(c.Namespace).Get(context.Background(), kubernetes.JobName(runID), metav1.GetOptions{})
	if err == nil && (job.Spec.ActiveDeadlineSeconds == nil || *job.Spec.ActiveDeadlineSeconds > int64((2*time.Minute+15*time.Minute)/time.Second)) {
		t.Errorf("a Job the runner cannot delete has no bounded deadline: %v", job.Spec.ActiveDeadlineSeconds)
	}
}

// Pending because no node fits is the scale-up signal: the run waits,
// and completes once a node for it appears.
func TestWaitsForScaleUp(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	if err := c.RemoveCapacity(ctx); err != nil {
		t.Fatal(err)
	}
	runID := randomID("scale")
	done := make(chan *run.Result, 1)
	go func() {
		done <- engine(newExecutor(t, c, nil), c.Image).Run(ctx, run.Request{
			RunID: runID, Workflow: parse(t, "on: push\nsteps: [{run: 'echo scaled'}]\n"), Checkout: t.TempDir(), Trusted: true,
		})
	}()
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := c.WaitForPod(waitCtx, c.Namespace, kubernetes.LabelRun+"="+runID, clustertest.PodUnschedulable); err != nil {
		t.Fatalf("the run's pod never waited for a node: %v", err)
	}
	select {
	case res := <-done:
		t.Fatalf("the run ended while no node could take it: %s %s", res.Status, res.Error)
	case <-time.After(3 * time.Second):
	}
	if err := c.AddCapacity(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.Status != run.Success || !strings.Contains(string(res.Log), "scaled") {
		t.Errorf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
	}
	assertNothingLeft(t, c)
}

// A run detached mid-step (its runner process stops) goes on in its Job;
// the next process adopts it: it keeps the Job out of its sweep, follows
// the step from where the log stopped, gets its real exit, runs the rest,
// and leaves nothing. The log holds every line exactly once.
func TestDetachAndAdopt(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	runner := "did:plc:" + randomID("adopt")
	sameRunner := func(cfg *kubernetes.Config) { cfg.Runner = runner }
	wf := parse(t, "on: push\nsteps:\n  - name: long\n    run: |\n      echo before\n      sleep 10\n      echo after\n  - name: next\n    run: echo next\n")
	req := run.Request{RunID: randomID("adopt"), Workflow: wf, Checkout: t.TempDir(), Trusted: true}

	res := detachMidStep(t, newExecutor(t, c, sameRunner), c.Image, req)
	h := res.Handover
	if res.Status != run.Detached || h == nil || h.Step != 0 || !h.Started || h.Offset != int64(len("before\n")) || h.SessionStartedAt.IsZero() {
		t.Fatalf("status %s (%s), handover %+v; want detached in step 1 after its first line\nlog:\n%s", res.Status, res.Error, h, res.Log)
	}

	var logs syncbuf.Buffer
	next := newExecutor(t, c, func(cfg *kubernetes.Config) {
		sameRunner(cfg)
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	swept, err := next.Sweep(context.Background(), []string{req.RunID})
	if err != nil || len(swept) != 0 {
		t.Fatalf("sweep keeping the detached run: swept %v, %v", swept, err)
	}
	adopted := engine(next, c.Image).Adopt(context.Background(), req, *h, res.Log)
	if adopted.Status != run.Success {
		t.Fatalf("adopted: status %s (%s)\nlog:\n%s", adopted.Status, adopted.Error, adopted.Log)
	}
	log := string(adopted.Log)
	for _, line := range []string{"before", "after", "next", "==> step 1/2: long"} {
		if n := countLines(log, line); n != 1 {
			t.Errorf("line %q %d times in the log, want once:\n%s", line, n, log)
		}
	}
	if !strings.Contains(log, "adopted by a new runner process") {
		t.Errorf("the log does not say the run was adopted:\n%s", log)
	}
	if s := adopted.Steps[0]; s.ExitCode == nil || *s.ExitCode != 0 || s.Duration < 10*time.Second {
		t.Errorf("step long: %+v, want exit 0 and its whole duration", s)
	}
	if !adopted.StartedAt.Equal(res.StartedAt) {
		t.Errorf("adopted run started at %v, want the first start %v", adopted.StartedAt, res.StartedAt)
	}
	// A clean adoption is no fault: the new process logs no warning
	// (it said "step stream dropped; reattaching", issue 35).
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("the adopting process logged: %s", line)
		}
	}
	assertNothingLeft(t, c)
}

func countLines(text, line string) int {
	n := 0
	for _, l := range strings.Split(text, "\n") {
		if l == line {
			n++
		}
	}
	return n
}

// detachMidStep runs req and detaches it once the live log has the
// step's first line ("before"), as a stopping runner would mid-step.
func detachMidStep(t *testing.T, ex executor.Executor, image string, req run.Request) *run.Result {
	t.Helper()
	detach := make(chan struct{})
	live := &liveLog{want: "before\n", seen: make(chan struct{})}
	req.Detach, req.Live = detach, live
	done := make(chan *run.Result, 1)
	go func() { done <- engine(ex, image).Run(context.Background(), req) }()
	select {
	case <-live.seen: // mid-step: its first line is out, the sleep goes on
	case res := <-done:
		t.Fatalf("the run ended before its first line: %s (%s)\n%s", res.Status, res.Error, res.Log)
	}
	close(detach)
	return <-done
}

// liveLog is a run's live log that says when a line has been written.
type liveLog struct {
	mu   sync.Mutex
	buf  strings.Builder
	want string
	seen chan struct{}
	once sync.Once
}

func (l *liveLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if strings.Contains(l.buf.String(), l.want) {
		l.once.Do(func() { close(l.seen) })
	}
	return len(p), nil
}

// An adopted run that cannot go on (here a granted secret has no value
// in the new process) ends with an error and still deletes its Job.
func TestAdoptThatFailsStopsTheSession(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	runner := "did:plc:" + randomID("adoptfail")
	sameRunner := func(cfg *kubernetes.Config) { cfg.Runner = runner }
	wf := parse(t, "on: push\nsecrets: [TOKEN]\nsteps:\n  - name: long\n    run: |\n      echo before\n      sleep 30\n")
	req := run.Request{RunID: randomID("adoptfail"), Workflow: wf, Checkout: t.TempDir(), Trusted: true, Secrets: map[string]string{"TOKEN": "t0k3n"}}
	res := detachMidStep(t, newExecutor(t, c, sameRunner), c.Image, req)
	if res.Status != run.Detached || res.Handover == nil {
		t.Fatalf("status %s (%s), want detached", res.Status, res.Error)
	}
	req.Secrets = nil
	adopted := engine(newExecutor(t, c, sameRunner), c.Image).Adopt(context.Background(), req, *res.Handover, res.Log)
	if adopted.Status != run.Error || !strings.Contains(adopted.Error, "TOKEN") {
		t.Fatalf("adopted without the secret: %s (%s), want an error naming it", adopted.Status, adopted.Error)
	}
	assertNothingLeft(t, c)
}

// TestTransferDigestMismatch: when the pod's digest of the outputs differs
// from the runner's, the transfer is sent once more, and a second
// mismatch ends the run `error` with nothing unpacked. A step puts an `sh`
// ahead of busybox's in PATH (the runtime looks up the exec's `sh` there)
// that drops get.sh's digest line the given number of times: writing
// /usr/local/sbin needs root, so these runs use the operator's
// allow-root opt-out.
func TestTransferDigestMismatch(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		lies       int
		wantStatus run.Status
	}{{1, run.Success}, {2, run.Error}} {
		t.Run(fmt.Sprintf("%d mismatches", tt.lies), func(t *testing.T) {
			t.Parallel()
			c := clustertest.Start(t)
			src := fmt.Sprintf(`on: push
steps:
  - name: lie
    run: |
      echo kept > "$KNOTLESS_RUN_OUTPUTS/file"
      mkdir -p /usr/local/sbin
      cat > /usr/local/sbin/sh <<'EOF'
      #!/bin/busybox sh
      if [ "$3" = knotless-get ]; then
        n=$(cat /knotless/lies 2>/dev/null || echo 0)
        if [ "$n" -lt %d ]; then
          echo $((n + 1)) > /knotless/lies
          /bin/busybox sh "$@" 2>/dev/null
          exit
        fi
      fi
      exec /bin/busybox sh "$@"
      EOF
      chmod +x /usr/local/sbin/sh
`, tt.lies)
			outputs := filepath.Join(t.TempDir(), "out")
			asRoot := func(cfg *kubernetes.Config) { cfg.Pod.AllowRoot = true }
			res := engine(newExecutor(t, c, asRoot), c.Image).Run(context.Background(), run.Request{
				RunID: randomID("dm"), Workflow: parse(t, src), Checkout: t.TempDir(), Outputs: outputs, Trusted: true,
			})
			log := string(res.Log)
			if res.Status != tt.wantStatus {
				t.Fatalf("status %s (%s), want %s\nlog:\n%s", res.Status, res.Error, tt.wantStatus, log)
			}
			if !strings.Contains(log, "outputs transfer corrupted") || !strings.Contains(log, "sending it once more") {
				t.Errorf("the log does not tell of the retry:\n%s", log)
			}
			got, err := os.ReadFile(filepath.Join(outputs, "file"))
			switch tt.wantStatus {
			case run.Success:
				if err != nil || string(got) != "kept\n" {
					t.Errorf("output after the retry: %q, %v", got, err)
				}
			default:
				if !strings.Contains(res.Error, "transfer corrupted") {
					t.Errorf("error %q does not name the corruption", res.Error)
				}
				if err == nil {
					t.Errorf("a corrupted transfer was unpacked into the outputs")
				}
			}
			assertNothingLeft(t, c)
		})
	}
}

// rulesWithoutJobVerb is the runner's Role without verb on jobs.
func rulesWithoutJobVerb(verb string) []rbacv1.PolicyRule {
	var rules []rbacv1.PolicyRule
	for _, r := range kubecred.Rules() {
		if slices.Contains(r.Resources, "jobs") {
			r.Verbs = slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return v == verb })
		}
		rules = append(rules, r)
	}
	return rules
}

// A runner whose Job delete is refused still reports the work's verdict:
// the run ends success, the refused clean-up is logged and counted, and
// the Job it left is removed by the next sweep (here of an executor that
// may delete it).
func TestCleanupFailureKeepsVerdict(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	kubeconfig := c.ScopedKubeconfig(t, "nodelete", rulesWithoutJobVerb("delete"))
	runner := "did:plc:" + randomID("nodelete")
	ex := newExecutor(t, c, func(cfg *kubernetes.Config) { cfg.Credentials.Kubeconfig = kubeconfig; cfg.Runner = runner })
	eng, cleaner := engineCleaning(t, ex, c.Image)
	runID := randomID("nd")
	res := eng.Run(context.Background(), run.Request{RunID: runID, Workflow: parse(t, "on: push\nsteps: [{name: hi, run: 'echo hi'}]\n"),
		Checkout: t.TempDir(), Outputs: filepath.Join(t.TempDir(), "out"), Trusted: true})
	if res.Status != run.Success || res.Error != "" {
		t.Fatalf("status %s (%s), want success: the refused delete is not the work's\nlog:\n%s", res.Status, res.Error, res.Log)
	}
	if err := cleaner.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if cleaner.Failures() != 1 || ex.Counters().CleanupFailures != 1 {
		t.Errorf("clean-up failures: cleaner %d, executor %d; want 1 each", cleaner.Failures(), ex.Counters().CleanupFailures)
	}
	if _, err := c.Clientset.BatchV1().Jobs(c.Namespace).Get(context.Background(), kubernetes.JobName(runID), metav1.GetOptions{}); err != nil {
		t.Fatalf("the Job whose delete was refused is not there: %v", err)
	}
	sweeper := newExecutor(t, c, func(cfg *kubernetes.Config) { cfg.Runner = runner })
	swept, err := sweeper.Sweep(context.Background(), nil)
	if err != nil || len(swept) != 1 || swept[0].RunID != runID {
		t.Fatalf("Sweep = %v, %v; want the run's Job", swept, err)
	}
	waitGone(t, c)
	assertNothingLeft(t, c)
}

// A transfer in that the pod does not get whole never succeeds: here the
// pod's sh hands put.sh only the stream's first 1024 bytes (its first
// entry, whole), so tar ends without error at a clean entry boundary,
// as it does when an exec's stdin is closed early and the exec still
// reports success. Put must say the stream was cut, not that it was put.
// Writing /usr/local/sbin needs root: the session uses the operator's
// allow-root opt-out.
func TestPutCutShortIsCorrupt(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	ex := newExecutor(t, c, func(cfg *kubernetes.Config) { cfg.Pod.AllowRoot = true })
	sess, err := ex.Start(ctx, executor.Spec{RunID: randomID("cut"), Image: c.Image, Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sess.Stop(context.Background()) }()
	// The exec's sh is looked up in PATH, where /usr/local/sbin comes first.
	wrapper := `mkdir -p /usr/local/sbin
cat > /usr/local/sbin/sh <<'WRAPPER'
#!/bin/busybox sh
if [ "$3" = knotless-put ]; then
  head -c 1024 | /bin/busybox sh "$@"
  exit
fi
exec /bin/busybox sh "$@"
WRAPPER
chmod +x /usr/local/sbin/sh
`
	if err := sess.StartStep(ctx, "1", []byte(wrapper)); err != nil {
		t.Fatal(err)
	}
	if exit, err := sess.FollowStep(ctx, "1", 0, io.Discard); err != nil || exit.Code != 0 {
		t.Fatalf("install the wrapper: exit %v, %v", exit, err)
	}
	var stream bytes.Buffer
	tw := tar.NewWriter(&stream)
	for _, name := range []string{"first", "second"} {
		body := []byte(name + "\n")
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(body)
	}
	_ = tw.Close()
	err = sess.Put(ctx, "/work/cut", &stream)
	if !errors.Is(err, executor.ErrTransferCorrupt) {
		t.Fatalf("Put of a stream the pod got only the first entry of: %v, want ErrTransferCorrupt", err)
	}
	t.Logf("Put: %v", err)
}
