// Package e2e drives the knotless-run command line end to end against the
// real test cluster: the binary's own flags, files and exit codes.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"knotless.dev/run/internal/cli"
	"knotless.dev/run/internal/kube/kubecred"
	"knotless.dev/run/tests/clustertest"
)

func TestMain(m *testing.M) { clustertest.Main(m) }

const example = "../../examples/hello/.knotless/workflows/build.yaml"

type result struct {
	code           int
	stdout, stderr string
}

func knotlessRun(t *testing.T, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := cli.Main(context.Background(), args, cli.Env{
		Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr,
		Getenv: func(string) string { return "" },
	})
	return result{code, stdout.String(), stderr.String()}
}

func runExample(t *testing.T, kubeconfig, namespace, image string) result {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	r := knotlessRun(t, "run", "--executor", "kubernetes", "--kubeconfig", kubeconfig, "--namespace", namespace,
		"--image", image, "--runner", "did:plc:"+randomID(), "--workflow", example, "--workdir", "../../examples/hello", "--outputs", out)
	if r.code == 0 {
		if _, err := os.Stat(filepath.Join(out, "greeting.sha256")); err != nil {
			t.Errorf("output missing after a successful run: %v", err)
		}
	}
	return r
}

func randomID() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func assertEmpty(t *testing.T, c *clustertest.Cluster) {
	t.Helper()
	ctx := context.Background()
	jobs, _ := c.Clientset.BatchV1().Jobs(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "dev.knotless.run"})
	pods, _ := c.Clientset.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "dev.knotless.run"})
	secrets, _ := c.Clientset.CoreV1().Secrets(c.Namespace).List(ctx, metav1.ListOptions{})
	if len(jobs.Items)+len(pods.Items)+len(secrets.Items) != 0 {
		t.Errorf("left behind: %d jobs, %d pods, %d secrets", len(jobs.Items), len(pods.Items), len(secrets.Items))
	}
}

// `knotless-run run --executor kubernetes` runs the example in a Job,
// brings its output back, and leaves no Job, pod or Secret.
func TestRunExampleOnKubernetes(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	if r := runExample(t, c.Kubeconfig, c.Namespace, c.Image); r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	assertEmpty(t, c)
}

func mint(t *testing.T, c *clustertest.Cluster, admin, out string, extra ...string) result {
	t.Helper()
	args := append([]string{"kubeconfig", "--admin-kubeconfig", admin, "--out", out, "--namespace", c.Namespace}, extra...)
	return knotlessRun(t, args...)
}

func clientsetFor(t *testing.T, kubeconfig string) *kubernetes.Clientset {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// The minted kubeconfig runs a workflow, and the real API server refuses
// it nodes and secrets. A second mint rotates the token and leaves one of
// each object.
func TestKubeconfigScopedAndIdempotent(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "runner.kubeconfig")
	if r := mint(t, c, c.Kubeconfig, out); r.code != 0 {
		t.Fatalf("kubeconfig: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig file: %v %v", fi, err)
	}
	cs := clientsetFor(t, out)
	if _, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list nodes with the runner credential: %v, want forbidden", err)
	}
	if _, err := cs.CoreV1().Secrets(c.Namespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list secrets with the runner credential: %v, want forbidden", err)
	}
	if r := runExample(t, out, c.Namespace, c.Image); r.code != 0 {
		t.Fatalf("run with the runner credential: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	first, _ := os.ReadFile(out)
	if r := mint(t, c, c.Kubeconfig, out); r.code != 0 {
		t.Fatalf("second kubeconfig: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	second, _ := os.ReadFile(out)
	if bytes.Equal(first, second) {
		t.Errorf("second mint did not rotate the token")
	}
	roles, _ := c.Clientset.RbacV1().Roles(c.Namespace).List(ctx, metav1.ListOptions{})
	bindings, _ := c.Clientset.RbacV1().RoleBindings(c.Namespace).List(ctx, metav1.ListOptions{})
	sas, _ := c.Clientset.CoreV1().ServiceAccounts(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=knotless-run"})
	if len(roles.Items) != 1 || len(bindings.Items) != 1 || len(sas.Items) != 1 {
		t.Errorf("after two mints: %d roles, %d bindings, %d service accounts; want one each", len(roles.Items), len(bindings.Items), len(sas.Items))
	}
	if n, m := admissionPolicies(t, c); n != 1 || m != 1 {
		t.Errorf("after two mints: %d admission policies and %d bindings, want one each", n, m)
	}
	if r := knotlessRun(t, "kubeconfig", "--check", out); r.code != 0 || !strings.Contains(r.stdout, "get nodes") {
		t.Errorf("--check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	assertEmpty(t, c)
}

// admissionPolicies counts the admission policies and bindings made for
// the test namespace's service accounts.
func admissionPolicies(t *testing.T, c *clustertest.Cluster) (int, int) {
	t.Helper()
	ctx := context.Background()
	selector := metav1.ListOptions{LabelSelector: kubecred.LabelServiceAccountNamespace + "=" + c.Namespace}
	policies, err := c.Clientset.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, selector)
	if err != nil {
		t.Fatal(err)
	}
	bindings, err := c.Clientset.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, selector)
	if err != nil {
		t.Fatal(err)
	}
	return len(policies.Items), len(bindings.Items)
}

// `kubeconfig` says which admission policy holds the credential, and
// with --skip-admission-policy installs none and says so.
func TestKubeconfigAdmissionPolicy(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	out := filepath.Join(t.TempDir(), "runner.kubeconfig")
	r := mint(t, c, c.Kubeconfig, out, "--skip-admission-policy")
	if r.code != 0 || !strings.Contains(r.stdout, ", no admission policy\n") || !strings.Contains(r.stderr, "stolen runner credential can mount") {
		t.Fatalf("kubeconfig --skip-admission-policy: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n, m := admissionPolicies(t, c); n != 0 || m != 0 {
		t.Errorf("--skip-admission-policy: %d admission policies and %d bindings, want none", n, m)
	}
	r = mint(t, c, c.Kubeconfig, out, "--allow-image-pull-secret", "ci-pull")
	if want := ", admission policy knotless-run." + c.Namespace + ".knotless-runner\n"; r.code != 0 || !strings.Contains(r.stdout, want) {
		t.Fatalf("kubeconfig: exit %d, want stdout saying %q\n%s%s", r.code, want, r.stdout, r.stderr)
	}
	if n, m := admissionPolicies(t, c); n != 1 || m != 1 {
		t.Errorf("%d admission policies and %d bindings, want one each", n, m)
	}
	if r := knotlessRun(t, "kubeconfig", "--check", out); r.code != 0 || !strings.Contains(r.stdout, "delete validatingadmissionpolicies") {
		t.Errorf("--check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// One executor crosses a refresh: after the old token is revoked and the
// file replaced, its next Job uses the new token with no restart.
func TestRefreshWithoutRestart(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "runner.kubeconfig")
	if r := mint(t, c, c.Kubeconfig, out); r.code != 0 {
		t.Fatalf("kubeconfig: %s%s", r.stdout, r.stderr)
	}
	wf := filepath.Join(t.TempDir(), "loop.tsv")
	if err := os.WriteFile(wf, []byte("hello\techo hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A run loop in one process: the same cli.Main process would reuse its
	// executor; here one executor is exercised through two engine runs.
	ex := newExecutor(t, out, c)
	if res := runOnce(t, ex, c); res != "success" {
		t.Fatalf("first run: %s", res)
	}
	// Revoke every token of the old service account, then refresh.
	if err := c.RevokeToken(ctx, c.Namespace, "knotless-runner"); err != nil {
		t.Fatal(err)
	}
	if r := mint(t, c, c.Kubeconfig, out); r.code != 0 {
		t.Fatalf("refresh: %s%s", r.stdout, r.stderr)
	}
	if res := runOnce(t, ex, c); res != "success" {
		t.Fatalf("run after refresh: %s", res)
	}
}

// An expired token gives a clear error run; replacing the file makes the
// next run succeed. The expired credential is a JWT whose exp has passed,
// written as a refresh timer that stopped would leave it.
func TestExpiredTokenThenRecovery(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	out := filepath.Join(t.TempDir(), "runner.kubeconfig")
	if r := mint(t, c, c.Kubeconfig, out); r.code != 0 {
		t.Fatalf("kubeconfig: %s%s", r.stdout, r.stderr)
	}
	good, _ := os.ReadFile(out)
	enc := base64.RawURLEncoding.EncodeToString
	expired := enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(`{"exp":1000000000}`)) + ".c2ln"
	kc, err := clientcmd.Load(good)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Token = expired
	}
	if err := clientcmd.WriteToFile(*kc, out); err != nil {
		t.Fatal(err)
	}
	ex := newExecutor(t, out, c)
	if res := runOnce(t, ex, c); !strings.Contains(res, "runner credentials expired at 2001-09-09T01:46:40Z; the refresh timer may have failed") {
		t.Errorf("run with an expired token: %s", res)
	}
	if err := os.WriteFile(out, good, 0o600); err != nil {
		t.Fatal(err)
	}
	if res := runOnce(t, ex, c); res != "success" {
		t.Errorf("run after the file was replaced: %s", res)
	}
}

// An admin credential without the rights fails naming the missing one
// and writes nothing.
func TestKubeconfigAdminWithoutRights(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	weak := weakKubeconfig(t, c)
	out := filepath.Join(t.TempDir(), "runner.kubeconfig")
	r := mint(t, c, weak, out)
	// The first right minting needs is labelling the runs namespace
	// Pod Security restricted.
	if r.code == 0 || !strings.Contains(r.stderr, "the admin credential may not patch namespace "+c.Namespace+" to label it pod-security.kubernetes.io/enforce=restricted (RBAC") {
		t.Errorf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("a kubeconfig was written")
	}
}
