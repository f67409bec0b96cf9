package appliance_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/tests/clustertest"
	systemdtest "knotless.dev/run/tests/systemd"
)

// kubeAppliance is the module's Kubernetes runner booted in a machine,
// its runs in a namespace of its own (deleted when the test ends).
type kubeAppliance struct {
	*appliance
	c  *clustertest.Cluster
	w  *world
	ns string
}

// bootKube boots the module's units with the Kubernetes executor, the
// operator's files in place, and starts the service. extra overrides
// settings.
func bootKube(t *testing.T, c *clustertest.Cluster, w *world, extra map[string]any) *kubeAppliance {
	t.Helper()
	return bootKubeWith(t, c, w, extra, nil)
}

// bootKubeWith is bootKube with more systemd-nspawn binds.
func bootKubeWith(t *testing.T, c *clustertest.Cluster, w *world, extra map[string]any, binds []string) *kubeAppliance {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	ns := "knotless-chaos-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		_ = c.Clientset.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		// The refresh minted the runner's admission policy: cluster-scoped,
		// it outlives the namespace.
		if err := c.DeleteAdmissionPolicies(context.Background(), ns); err != nil {
			t.Error(err)
		}
	})
	namespaced := func(s string) string { return strings.ReplaceAll(s, "--namespace "+runsNamespace, "--namespace "+ns) }
	units := map[string]string{
		service:        strings.ReplaceAll(unit(t, "knotless-run.service"), docsRepo, w.Owner.DID.String()+"/hello"),
		refreshService: namespaced(unit(t, refreshService)),
	}
	if !strings.Contains(units[refreshService], "--namespace "+ns) {
		t.Fatalf("the refresh unit names no namespace to replace:\n%s", units[refreshService])
	}
	settings := map[string]any{
		"executor":   "kubernetes",
		"kubeconfig": "/var/lib/knotless/kubeconfig",
		"namespace":  ns,
		"image":      c.Image,
		"discover":   false,
	}
	for k, v := range extra {
		settings[k] = v
	}
	a := bootWith(t, w, units, w.settings(settings), w.Password, binds)
	a.writeFile("/etc/rancher/k3s/k3s.yaml", adminKubeconfig(t, c.Kubeconfig), 0o600)
	a.writeFile("/run/secrets/knotless-run/secrets.json", []byte(`{"DEPLOY_TOKEN": "`+secretValue+`"}`), 0o600)
	a.writeFile("/run/secrets/knotless-run/env", nil, 0o600)
	if out, err := a.systemctl("start", service); err != nil {
		t.Fatalf("systemctl start: %v\n%s", err, out)
	}
	return &kubeAppliance{appliance: a, c: c, w: w, ns: ns}
}

// selector selects the runner's objects.
func (k *kubeAppliance) selector() string {
	return kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(k.w.Runner.DID.String())
}

// jobsAndPods counts the runner's Jobs and pods.
func (k *kubeAppliance) jobsAndPods() (int, int) {
	k.t.Helper()
	ctx := context.Background()
	opts := metav1.ListOptions{LabelSelector: k.selector()}
	jobs, err := k.c.Clientset.BatchV1().Jobs(k.ns).List(ctx, opts)
	if err != nil {
		k.t.Fatal(err)
	}
	pods, err := k.c.Clientset.CoreV1().Pods(k.ns).List(ctx, opts)
	if err != nil {
		k.t.Fatal(err)
	}
	return len(jobs.Items), len(pods.Items)
}

// waitNoRunObjects waits (bounded) until the runner has no Job and no
// pod left; it returns false when some are still there.
func (k *kubeAppliance) waitNoRunObjects(within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		jobs, pods := k.jobsAndPods()
		if jobs == 0 && pods == 0 {
			return true
		}
		if time.Now().After(deadline) {
			k.t.Logf("after %s: %d Jobs and %d pods of the runner left", within, jobs, pods)
			return false
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// restarted waits until the service runs again under a PID other than
// old and is active (READY=1), and returns the new PID.
func (k *kubeAppliance) restarted(old string, within time.Duration) string {
	k.t.Helper()
	deadline := time.Now().Add(within)
	for {
		pid := k.show(service, "MainPID")
		if pid != old && pid != "0" && k.show(service, "ActiveState") == "active" {
			return pid
		}
		if time.Now().After(deadline) {
			st, _ := k.systemctl("status", service)
			k.t.Fatalf("the service did not come back within %s (PID %s, was %s)\n%s", within, pid, old, st)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// fieldSum adds up an integer field of journal entries.
func fieldSum(entries []systemdtest.JournalEntry, field string) int {
	n := 0
	for _, e := range entries {
		v, _ := strconv.Atoi(e[field])
		n += v
	}
	return n
}

const longWorkflow = `
on: [push]
steps:
  - name: long
    run: |
      echo before
      touch "$KNOTLESS_RUN_WORK/step-started"
      sleep 15
      echo after
`

// killedWorkflow counts its first step's starts in the pod, where the
// runner never writes: the witness of "never started twice".
const killedWorkflow = `
on: [push]
steps:
  - name: deploy
    run: |
      echo start >> "$KNOTLESS_RUN_WORK/starts"
      echo before
      touch "$KNOTLESS_RUN_WORK/step-started"
      sleep 15
      echo after
  - name: report
    run: echo "deploy started $(wc -l < "$KNOTLESS_RUN_WORK/starts") times"
`

// TestKillMidJob: SIGKILL of the daemon while a step runs as a Job under
// the module's real systemd unit: Restart=always brings it back, and the
// new process takes the run up where it stands (its checkpoint, the
// pod's step ledger) before READY=1: the step that was going is followed
// from its first byte, never started again, and the next step runs:
// exactly one check, one final status, each line of the step once in the
// log, and no Job left.
func TestKillMidJob(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	k := bootKube(t, c, w, nil)

	commit := w.push(map[string]string{".knotless/workflows/long.yaml": killedWorkflow})
	w.waitCheck("long", commit, 3*time.Minute, running)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.WaitForCommand(ctx, k.ns, k.selector(), "run", []string{"test", "-e", "/work/step-started"}); err != nil {
		t.Fatalf("the step did not start: %v", err)
	}
	oldPID := k.show(service, "MainPID")
	restarts, _ := strconv.Atoi(k.show(service, "NRestarts"))
	killedAt := time.Now()
	if out, err := k.systemctl("kill", "--signal=KILL", service); err != nil {
		t.Fatalf("systemctl kill: %v\n%s", err, out)
	}
	newPID := k.restarted(oldPID, 2*time.Minute)
	if n, _ := strconv.Atoi(k.show(service, "NRestarts")); n != restarts+1 {
		t.Errorf("NRestarts %d, want %d: Restart=always brought it back once", n, restarts+1)
	}

	got := w.waitCheck("long", commit, 5*time.Minute, final)
	if got.Status != "success" {
		t.Fatalf("the run after the kill: %s (%s)", got.Status, got.Error)
	}
	if n := len(w.checks("long", commit)); n != 1 {
		t.Errorf("%d check records, want one", n)
	}
	journal := k.journal(service)
	byPID := func(msg, pid string) int {
		n := 0
		for _, e := range find(journal, msg) {
			if e["_PID"] == pid {
				n++
			}
		}
		return n
	}
	if n := byPID("a run of a process that died is taken up where it stands", newPID); n != 1 {
		t.Errorf("the new process took up %d runs, want the killed one", n)
	}
	// The takeover: from the SIGKILL to the new process following the
	// run in its pod (the unit's RestartSec as shipped included); the
	// figure of docs/performance.md.
	for _, e := range find(journal, "session resumed") {
		if e["_PID"] != newPID {
			continue
		}
		if us, err := strconv.ParseInt(e["__REALTIME_TIMESTAMP"], 10, 64); err == nil {
			t.Logf("takeover after SIGKILL: %s from the kill to the new process following the run (RestartSec=%s)",
				time.UnixMicro(us).Sub(killedAt).Round(10*time.Millisecond), k.show(service, "RestartUSec"))
		}
	}
	if n := byPID("swept orphaned session", newPID); n != 0 {
		t.Errorf("the new process swept %d sessions; the killed run's Job is its to go on with", n)
	}
	var started, finished int
	for _, e := range journal {
		if e["CHECK"] == "" || e["COMPONENT"] != "daemon" {
			continue
		}
		switch e["MESSAGE"] {
		case "run started":
			started++
		case "run finished":
			finished++
		}
	}
	if started != 1 || finished != 1 {
		t.Errorf("runs started %d, finished %d; want 1 and 1 (the killed run, taken up)", started, finished)
	}
	blob := w.blob(t, got)
	for _, line := range []string{"before", "after", "deploy started 1 times", "==> step 1/2: deploy"} {
		if n := strings.Count("\n"+blob, "\n"+line+"\n"); n != 1 {
			t.Errorf("line %q %d times in the log blob, want once:\n%s", line, n, blob)
		}
	}
	if !k.waitNoRunObjects(time.Minute) {
		t.Error("Jobs or pods of the runner are left")
	}
}

// TestStopThenJobGone: a run handed over at a stop whose Job is deleted
// before the next start (a cluster operator, a node lost) is not
// adopted: the new process sees the session gone, sweeps it and runs
// the work again, one final check.
func TestStopThenJobGone(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	k := bootKube(t, c, w, nil)

	commit := w.push(map[string]string{".knotless/workflows/long.yaml": longWorkflow})
	w.waitCheck("long", commit, 3*time.Minute, running)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.WaitForCommand(ctx, k.ns, k.selector(), "run", []string{"test", "-e", "/work/step-started"}); err != nil {
		t.Fatalf("the step did not start: %v", err)
	}
	if out, err := k.systemctl("stop", service); err != nil {
		t.Fatalf("systemctl stop: %v\n%s", err, out)
	}
	if e := find(k.journal(service), "handed over 1 runs"); len(e) != 1 || e[0]["GOING_ON"] != "1" {
		t.Fatalf("the stopping daemon did not hand the run over: %v", e)
	}
	policy := metav1.DeletePropagationBackground
	jobs, err := c.Clientset.BatchV1().Jobs(k.ns).List(ctx, metav1.ListOptions{LabelSelector: k.selector()})
	if err != nil || len(jobs.Items) != 1 {
		t.Fatalf("the handed-over Job: %v, %v", jobs, err)
	}
	if err := c.Clientset.BatchV1().Jobs(k.ns).Delete(ctx, jobs.Items[0].Name, metav1.DeleteOptions{PropagationPolicy: &policy}); err != nil {
		t.Fatal(err)
	}
	if out, err := k.systemctl("start", service); err != nil {
		t.Fatalf("systemctl start: %v\n%s", err, out)
	}
	got := w.waitCheck("long", commit, 5*time.Minute, final)
	if got.Status != "success" {
		t.Fatalf("the run after its Job was deleted: %s (%s)", got.Status, got.Error)
	}
	journal := k.journal(service)
	if e := find(journal, "the session of a handed-over run is gone"); len(e) != 1 {
		t.Errorf("want the new process to find the session gone once; got %v", e)
	}
	if e := find(journal, "adopted"); len(e) != 0 {
		t.Errorf("the new process adopted a run whose Job is gone: %v", e)
	}
	if !k.waitNoRunObjects(time.Minute) {
		t.Error("Jobs or pods of the runner are left")
	}
}
