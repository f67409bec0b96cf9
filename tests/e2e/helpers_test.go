package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/run"
	"knotless.dev/run/internal/workflow"
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
	ctx := context.Background()
	ns := c.Namespace
	if _, err := c.Clientset.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "weak"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clientset.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "weak"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clientset.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "weak"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "weak", Namespace: ns}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "weak"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := c.TokenConfig(ctx, ns, "weak")
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos["weak"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["weak"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "weak", Namespace: ns}
	kc.CurrentContext = "weak"
	path := filepath.Join(t.TempDir(), "weak.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}
