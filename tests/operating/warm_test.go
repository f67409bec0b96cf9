package operating

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/kube/kubecred"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
)

// TestServeWarmPods: `serve --warm-pods 1` with the runner's own Role on
// the test cluster and a real PDS. The pool makes its pod once the
// daemon is started; a push's run takes it and makes no Job of its own;
// the pool makes another; on SIGTERM the daemon deletes the warm Job no
// run took, and nothing of the runner is left on the cluster.
func TestServeWarmPods(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	srv, w := startWorld(t, ctx, pds.Options{}, "warm")
	runner := w.Runner.DID.String()
	bin := buildBinary(t)
	kubeconfig := c.ScopedKubeconfig(t, "runner", kubecred.Rules())

	dir := t.TempDir()
	writeFile(t, dir+"/app-password", w.Password+"\n")
	d := &daemon{t: t, bin: bin, args: []string{"--log-format", "json", "serve", "--did", runner, "--pds", srv.URL, "--plc-url", srv.PLCURL,
		"--state-dir", dir + "/state", "--cache-dir", dir + "/cache", "--app-password-file", dir + "/app-password",
		"--executor", "kubernetes", "--kubeconfig", kubeconfig, "--image", c.Image, "--allow-local-sources",
		"--poll", "10s", "--stop-wait", "1m", "--warm-pods", "1", w.Owner.DID.String() + "/" + forgeworld.RepoName}}
	d.start()
	d.waitLine(ctx, "ready", nil)
	warmReady := func() int {
		n := 0
		for _, l := range d.lines() {
			if _, ofRun := l["run"]; l["msg"] == "pod ready" && strings.HasPrefix(l["job"], "knotless-warm-") && !ofRun {
				n++
			}
		}
		return n
	}
	waitUntil(t, ctx, "the warm pod ready", func() bool { return warmReady() == 1 }, d.logs)

	w.Push(map[string]string{".knotless/workflows/build.yaml": "on: [push]\nsteps:\n  - name: hello\n    run: echo hello\n"})
	waitUntil(t, ctx, "the push's final check", func() bool {
		checks := w.Checks()
		return len(checks) == 1 && checks[0].Value.Final()
	}, d.logs)
	if ch := w.Checks()[0].Value; ch.Status != "success" {
		t.Fatalf("check %s: %s\n%s", ch.Status, ch.Error, d.logs())
	}
	d.hasLine("warm pod taken", map[string]string{"run": "", "job": "", "pod": "", "warm_for": "", "warm_starts_total": "1"})
	if n := d.count("job created", nil); n != 0 {
		t.Errorf("%d Jobs created; the run should have taken the warm pod\n%s", n, d.logs())
	}
	waitUntil(t, ctx, "another warm pod", func() bool { return d.count("warm pod made", nil) == 2 }, d.logs)

	d.stop()
	d.hasLine("warm pod deleted", map[string]string{"job": "", "why": ""})
	sel := metav1.ListOptions{LabelSelector: kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(runner)}
	jobs, err := c.Clientset.BatchV1().Jobs(c.Namespace).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items) != 0 {
		t.Errorf("%d Jobs of the runner left after serve stopped", len(jobs.Items))
	}
	waitUntil(t, ctx, "the runner's pods gone", func() bool {
		pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(ctx, sel)
		return err == nil && len(pods.Items) == 0
	}, d.logs)
}
