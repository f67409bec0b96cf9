package cli

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
)

// TestReplicasTakeOverAKilledDriver: three real serve processes with
// --replicas, one runner, on the real cluster and PDS. The replica that
// drives a push's run is killed with SIGKILL while the run's first step
// sleeps; a survivor claims the run (the Job's driver becomes it) and
// goes on with it where it stands: the step is not started again (the
// pod's own log, the witness, says each step started once), the next
// step runs in the same pod, the check ends success, once, and the Job
// is deleted.
func TestReplicasTakeOverAKilledDriver(t *testing.T) {
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	c := clustertest.Start(t)
	if err := pds.Installed(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	srv, err := pds.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	w := forgeworld.New(t, srv, forgeworld.Options{App: "replicas"})
	_, commit := w.Push(map[string]string{".knotless/workflows/ci.yaml": `on: [push]
steps:
  - name: long
    run: |
      echo "witness $KNOTLESS_RUN_STEP" > /proc/1/fd/1 2>/dev/null || :
      touch "$KNOTLESS_RUN_WORK/step-started"
      sleep 20
      echo long ends
  - name: after
    run: |
      echo "witness $KNOTLESS_RUN_STEP" > /proc/1/fd/1 2>/dev/null || :
      echo after the long step
`})
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "app-password")
	writeFile(t, pwFile, w.Password+"\n")
	type replica struct {
		cmd  *exec.Cmd
		logs *syncbuf.Buffer
	}
	procs := map[string]*replica{}
	for _, name := range []string{"r1", "r2", "r3"} {
		cfg := filepath.Join(dir, name+".json")
		writeFile(t, cfg, fmt.Sprintf(`{"executor": "kubernetes", "did": %q, "pds": %q, "plc-url": %q, "state-dir": %q, "cache-dir": %q,
  "kubeconfig": %q, "namespace": %q, "image": %q, "schedule-timeout": "2m", "replicas": true, "replica-name": %q,
  "stop-wait": "10m", "poll": "500ms", "app-password-file": %q, "allow-local-sources": true}`,
			w.Runner.DID, srv.URL, srv.PLCURL, filepath.Join(dir, name+"-state"), filepath.Join(dir, name+"-cache"),
			c.Kubeconfig, c.Namespace, c.Image, name, pwFile))
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestServeHelperProcess$", "--", "--config", cfg, w.Owner.DID.String()+"/hello")
		cmd.Env = append(cmd.Environ(), "KNOTLESS_SERVE_HELPER=1")
		logs := &syncbuf.Buffer{}
		cmd.Stderr, cmd.Stdout = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[name] = &replica{cmd, logs}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("replica %s:\n%s", name, logs.String())
			}
		})
	}

	sel := kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(w.Runner.DID.String())
	if err := c.WaitForCommand(ctx, c.Namespace, sel, "run", []string{"test", "-e", "/work/step-started"}); err != nil {
		t.Fatalf("the first step did not start: %v", err)
	}
	jobs, err := c.Clientset.BatchV1().Jobs(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil || len(jobs.Items) != 1 {
		t.Fatalf("runner's Jobs: %v, %v; want 1", jobs, err)
	}
	job := jobs.Items[0]
	driver := job.Annotations[kubernetes.AnnotationDriver]
	victim, ok := procs[driver]
	if !ok {
		t.Fatalf("Job %s names driver %q, none of the replicas", job.Name, driver)
	}
	pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("runner's pods: %v, %v; want 1", pods, err)
	}
	witness := followWitness(ctx, t, c, pods.Items[0].Name)

	killed := time.Now()
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = victim.cmd.Wait()
	t.Logf("killed the driver %s (pid %d)", driver, victim.cmd.Process.Pid)

	// A survivor claims the run.
	var taker string
	var claimedAfter time.Duration
	for taker == "" {
		j, err := c.Clientset.BatchV1().Jobs(c.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the run's Job before a survivor claimed it: %v", err)
		}
		if d := j.Annotations[kubernetes.AnnotationDriver]; d != driver {
			taker, claimedAfter = d, time.Since(killed)
			if j.UID != job.UID {
				t.Fatalf("the run's Job was made again (uid %s, was %s): want the same Job taken over", j.UID, job.UID)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, ok := procs[taker]; !ok || taker == driver {
		t.Fatalf("the Job's driver became %q: want a survivor", taker)
	}
	t.Logf("survivor %s claimed the run %s after the kill", taker, claimedAfter.Round(time.Millisecond))

	deadline := time.Now().Add(3 * time.Minute)
	for {
		var finals []string
		for _, r := range w.Checks() {
			if r.Value.Subject.Commit == commit && r.Value.Final() {
				finals = append(finals, r.Value.Status)
			}
		}
		if len(finals) > 0 {
			if len(finals) != 1 || finals[0] != "success" {
				t.Fatalf("final checks of the push: %v, want one success", finals)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no final check 3 min after the kill\n%s", procs[taker].logs.String())
		}
		time.Sleep(300 * time.Millisecond)
	}
	if !strings.Contains(procs[taker].logs.String(), "took over a run whose driver is gone, where it stands") {
		t.Errorf("the survivor's log does not say it took the run over:\n%s", procs[taker].logs.String())
	}
	// Its Job is deleted at the run's end.
	for {
		jobs, err := c.Clientset.BatchV1().Jobs(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs.Items) == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d Jobs left", len(jobs.Items))
		}
		time.Sleep(200 * time.Millisecond)
	}
	starts := witness()
	if starts["long"] != 1 || starts["after"] != 1 {
		t.Errorf("steps started in the run's pod: %v, want long and after once each", starts)
	}
}

// followWitness follows the run container's log of pod (its PID 1's
// output, which steps write "witness STEP" to and the runner never
// reads) and returns what counts the starts of each step, once the
// log ends.
func followWitness(ctx context.Context, t *testing.T, c *clustertest.Cluster, pod string) func() map[string]int {
	t.Helper()
	rc, err := c.Clientset.CoreV1().Pods(c.Namespace).GetLogs(pod, &corev1.PodLogOptions{Container: "run", Follow: true}).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	starts := map[string]int{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer rc.Close()
		sc := bufio.NewScanner(rc)
		for sc.Scan() {
			if step, ok := strings.CutPrefix(sc.Text(), "witness "); ok {
				mu.Lock()
				starts[step]++
				mu.Unlock()
			}
		}
	}()
	return func() map[string]int {
		select {
		case <-done: // the pod went with its Job
		case <-time.After(30 * time.Second):
			rc.Close()
			<-done
		}
		mu.Lock()
		defer mu.Unlock()
		return starts
	}
}
