package kubernetes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/rules/workflow"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/registry"
)

// A run whose image is in a registry that needs credentials (Debian's
// docker-registry with htpasswd, tests/registry). Without a pull secret
// it ends error at the first denied pull, naming the image and the
// denial: the pull grace is set far past the test's own timeout, so only
// the denial can end it. With ImagePullSecrets (--image-pull-secret)
// naming a Secret the test made, for a pattern matching the image, the
// node pulls the image and the run succeeds. A pull's run (untrusted)
// naming the same image, now on the node, gets no secret unless it is
// marked untrusted: it pulls Always, so the registry refuses it instead
// of the kubelet starting the node's copy; marked, it runs. None leaves
// a Job or pod, and the runner creates no Secret.
func TestImagePullDenied(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	reg := registry.Start(t, c)
	image := reg.Push(t, c.Namespace)
	src := "on: push\nimage: " + image + "\nsteps: [{run: 'echo pulled from the registry'}]\n"
	ctx := context.Background()
	noGrace := func(cfg *kubernetes.Config) { cfg.PullGrace = time.Hour }

	t.Run("without credentials", func(t *testing.T) {
		res := engine(newExecutor(t, c, noGrace), c.Image).Run(ctx, run.Request{
			RunID: randomID("deny"), Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: true,
		})
		if res.Status != run.Error || !strings.Contains(res.Error, "cannot pull image "+image) ||
			!strings.Contains(res.Error, "the registry denied access") || !strings.Contains(res.Error, "401 Unauthorized") {
			t.Errorf("status %s (%s), want error naming the image %s and the 401 denial\nlog:\n%s", res.Status, res.Error, image, res.Log)
		}
		t.Logf("without credentials: %s", res.Error)
		assertNoRunObjects(t, c)
	})

	t.Run("with a pull secret", func(t *testing.T) {
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "registry-pull"},
			Type:       corev1.SecretTypeDockerConfigJson,
			Data:       map[string][]byte{corev1.DockerConfigJsonKey: reg.DockerConfigJSON()},
		}
		if _, err := c.Clientset.CoreV1().Secrets(c.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		withSecret := func(cfg *kubernetes.Config) {
			noGrace(cfg)
			cfg.Pod.ImagePullSecrets = []kubernetes.PullSecret{{Name: secret.Name, Image: image}}
		}
		res := engine(newExecutor(t, c, withSecret), c.Image).Run(ctx, run.Request{
			RunID: randomID("pull"), Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: true,
		})
		if res.Status != run.Success || !strings.Contains(string(res.Log), "pulled from the registry") {
			t.Errorf("status %s (%s), want success\nlog:\n%s", res.Status, res.Error, res.Log)
		}
		assertNoRunObjects(t, c)
		secrets, err := c.Clientset.CoreV1().Secrets(c.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(secrets.Items) != 1 || secrets.Items[0].Name != secret.Name {
			t.Errorf("secrets in the namespace: %d, want only the test's %s", len(secrets.Items), secret.Name)
		}

		// The image is on the node now. A stranger's pull naming it gets
		// no secret, and the registry refuses the pull.
		untrustedSrc := "on: pull\nimage: " + image + "\nsteps: [{run: 'echo pulled from the registry'}]\n"
		res = engine(newExecutor(t, c, withSecret), c.Image).Run(ctx, run.Request{
			RunID: randomID("stranger"), Workflow: parse(t, untrustedSrc), Checkout: t.TempDir(), Trusted: false,
		})
		if res.Status != run.Error || !strings.Contains(res.Error, "cannot pull image "+image) || !strings.Contains(res.Error, "the registry denied access") {
			t.Errorf("a pull's run with the secret not given to pulls: status %s (%s), want error naming the image and the denial\nlog:\n%s", res.Status, res.Error, res.Log)
		}
		t.Logf("a pull without the secret: %s", res.Error)
		assertNoRunObjects(t, c)

		// Marked untrusted, the operator gives it to pulls too.
		forPulls := func(cfg *kubernetes.Config) {
			noGrace(cfg)
			cfg.Pod.ImagePullSecrets = []kubernetes.PullSecret{{Name: secret.Name, Image: image, Untrusted: true}}
		}
		res = engine(newExecutor(t, c, forPulls), c.Image).Run(ctx, run.Request{
			RunID: randomID("pullok"), Workflow: parse(t, untrustedSrc), Checkout: t.TempDir(), Trusted: false,
		})
		if res.Status != run.Success || !strings.Contains(string(res.Log), "pulled from the registry") {
			t.Errorf("a pull's run with the secret marked untrusted: status %s (%s), want success\nlog:\n%s", res.Status, res.Error, res.Log)
		}
		assertNoRunObjects(t, c)
	})
}

// assertNoRunObjects checks that the namespace holds no Job or pod of any
// run (Secrets may be the test's own).
func assertNoRunObjects(t *testing.T, c *clustertest.Cluster) {
	t.Helper()
	ctx := context.Background()
	// Every object of a runner, warm Jobs (no run yet) among them.
	sel := metav1.ListOptions{LabelSelector: kubernetes.LabelRunner}
	jobs, err := c.Clientset.BatchV1().Jobs(c.Namespace).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	budgets, err := c.Clientset.PolicyV1().PodDisruptionBudgets(c.Namespace).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items)+len(pods.Items)+len(budgets.Items) != 0 {
		t.Errorf("left behind: %d jobs, %d pods, %d disruption budgets", len(jobs.Items), len(pods.Items), len(budgets.Items))
	}
}

// An image in a registry nobody answers for (an address on the node's
// loopback where nothing listens: no DNS query, no wait for a timeout)
// ends the run at the kubelet's first failed pull, with an error naming
// the image and the workflow. The pull grace is set far past the
// schedule timeout: before issue 35 the run waited out the grace (20 s
// by default; 22.5 s measured) and said nothing of the workflow, and
// here it would end at the schedule timeout instead.
func TestImagePullFailsAtOnce(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	const image = "127.0.0.1:1/knotless/unreachable:1"
	wf, err := workflow.Parse("nightly.yaml", []byte("on: push\nimage: "+image+"\nsteps: [{run: 'echo never'}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	ex := newExecutor(t, c, func(cfg *kubernetes.Config) { cfg.PullGrace, cfg.ScheduleTimeout = time.Hour, 3*time.Minute })
	called := time.Now()
	res := engine(ex, c.Image).Run(context.Background(), run.Request{RunID: randomID("unreach"), Workflow: wf, Checkout: t.TempDir(), Trusted: true})
	ended := time.Now()
	if res.Status != run.Error || !strings.Contains(res.Error, "workflow nightly") || !strings.Contains(res.Error, "cannot pull image "+image) {
		t.Errorf("status %s (%s), want error naming the workflow nightly and the image %s\nlog:\n%s", res.Status, res.Error, image, res.Log)
	}
	t.Logf("an unreachable registry: %s", res.Error)
	// The figure of docs/performance.md: the run's end against the
	// kubelet's first failed pull (its event's time is to the second).
	failed := time.Time{}
	if evs, err := c.Clientset.CoreV1().Events(c.Namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=Failed"}); err == nil {
		for _, e := range evs.Items {
			if at := e.FirstTimestamp.Time; failed.IsZero() || at.Before(failed) {
				failed = at
			}
		}
	}
	t.Logf("an unreachable registry: the run ended error %s after Run's call; the kubelet's first failed pull at %s, the end at %s",
		ended.Sub(called).Round(time.Millisecond), failed.Format("15:04:05"), ended.Format("15:04:05.000"))
	assertNoRunObjects(t, c)
}
