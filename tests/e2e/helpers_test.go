package e2e

import (
	"context"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/rules/workflow"
	"knotless.dev/run/tests/clustertest"
)

func newExecutor(t *testing.T, kubeconfig string, c *clustertest.Cluster) *kubernetes.Executor {
	t.Helper()
	ex, err := kubernetes.New(kubernetes.Config{
		Credentials:     kubernetes.Credentials{Kubeconfig: kubeconfig},
		Runner:          "did:plc:" + randomID(),
		Pod:             kubernetes.PodOptions{Image: c.Image},
		ScheduleTimeout: 2 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// runOnce runs a one-step workflow and returns "success" or the status and
// error.
func runOnce(t *testing.T, ex *kubernetes.Executor, c *clustertest.Cluster) string {
	t.Helper()
	wf, err := workflow.Parse("once.yaml", []byte("on: push\nsteps: [{run: 'echo once'}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	res := run.New(run.Config{Executor: ex, DefaultImage: c.Image}).Run(context.Background(), run.Request{
		RunID: "r" + randomID(), Workflow: wf, Checkout: t.TempDir(), Trusted: true,
	})
	if res.Status == run.Success {
		return "success"
	}
	return string(res.Status) + ": " + res.Error
}

// weakKubeconfig is a credential that may read but create nothing.
func weakKubeconfig(t *testing.T, c *clustertest.Cluster) string {
	t.Helper()
	return c.ScopedKubeconfig(t, "weak", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}})
}
