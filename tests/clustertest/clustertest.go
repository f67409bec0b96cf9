// Package clustertest gives integration tests a real Kubernetes cluster:
// the single-node cluster of tests/cluster (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, containerd, kubelet and
// kube-router for NetworkPolicy, all on this machine).
//
// A test package uses it in two places:
//
//	func TestMain(m *testing.M) { clustertest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		c := clustertest.Start(t) // its own namespace, deleted after the test
//		c.Clientset.BatchV1().Jobs(c.Namespace).Create(...)
//	}
//
// When KNOTLESS_TEST_KUBECONFIG is set (CI starts one cluster for the whole
// run: tests/cluster/up && eval "$(tests/cluster/env)"), tests use that
// cluster. Otherwise Main brings one up with tests/cluster/up before the
// package's tests and takes it down after them. Under -short every test
// that calls Start skips, saying why.
package clustertest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"knotless.dev/run/internal/kube/kubecred"
)

// The environment that tests/cluster/env prints and that describes a
// running test cluster.
const (
	EnvKubeconfig     = "KNOTLESS_TEST_KUBECONFIG"
	EnvImage          = "KNOTLESS_TEST_IMAGE"
	EnvPauseImage     = "KNOTLESS_TEST_PAUSE_IMAGE"
	EnvNodeName       = "KNOTLESS_TEST_NODE_NAME"
	EnvNodeNetns      = "KNOTLESS_TEST_NODE_NETNS"
	EnvNodeIP         = "KNOTLESS_TEST_NODE_IP"
	EnvHostIP         = "KNOTLESS_TEST_HOST_IP"
	EnvPodCIDR        = "KNOTLESS_TEST_POD_CIDR"
	EnvPodBridge      = "KNOTLESS_TEST_POD_BRIDGE"
	EnvContainerdSock = "KNOTLESS_TEST_CONTAINERD_SOCK"
	EnvClusterDir     = "KNOTLESS_TEST_CLUSTER_DIR"
	EnvScripts        = "KNOTLESS_TEST_CLUSTER_SCRIPTS"

	// envUpError carries the failure of Main's `up` to Start, which fails
	// every test with it (a cluster that should be there and is not is a
	// failure, not a skip).
	envUpError = "KNOTLESS_TEST_CLUSTER_UP_ERROR"
)

// LabelTest is set on every namespace Start creates.
const LabelTest = "knotless.dev/test"

// Info describes the running cluster beyond its kubeconfig: what the
// network and fault-injection helpers need. Fields are empty when the
// environment does not say (a cluster not made by tests/cluster).
type Info struct {
	NodeName       string
	NodeNetns      string // network namespace of the node and its pods
	NodeIP         string
	HostIP         string // the host's end of the link to the node: harness servers the node reaches bind here
	PodCIDR        string
	PodBridge      string
	ContainerdSock string // the node's containerd, for ctr
	Dir            string // run directory of the cluster
	Scripts        string // tests/cluster: up, down, env, restart-apiserver
}

// Cluster is one test's view of the test cluster.
type Cluster struct {
	Config     *rest.Config // admin
	Clientset  kubernetes.Interface
	Kubeconfig string // admin kubeconfig path
	Image      string // run image: busybox (sh, tar, sha256sum, nc, ...)
	Namespace  string // this test's own namespace
	Info       Info

	capacityLabelled bool // AddCapacity labelled the nodes: Start's cleanup unlabels them
}

// Main runs a test package's tests against a test cluster and exits. Call
// it from TestMain. With KNOTLESS_TEST_KUBECONFIG set, or under -short, it
// only runs the tests. Without it, a cluster that tests/cluster/env finds
// and whose API server answers is used as it is and left up: bringing one
// up again would tear down a cluster other tests are using. Otherwise it
// brings a cluster up with tests/cluster/up first (holding a lock, so test
// binaries that go test runs in parallel take turns) and takes it down
// with tests/cluster/down after.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if testing.Short() || os.Getenv(EnvKubeconfig) != "" {
		return m.Run()
	}
	ctx := context.Background()
	scripts := scriptsDir()
	unlock, err := flock(filepath.Join(os.TempDir(), "knotless-test-cluster-up.lock"), syscall.LOCK_EX)
	if err != nil {
		fmt.Fprintf(os.Stderr, "clustertest: %v\n", err)
		return 1
	}
	defer unlock()

	if env, ok := runningCluster(ctx, scripts); ok {
		fmt.Fprintf(os.Stderr, "clustertest: %s is not set: using the cluster already up at %s, and leaving it up\n", EnvKubeconfig, env[EnvKubeconfig])
		for k, v := range env {
			os.Setenv(k, v)
		}
		return m.Run()
	}
	fmt.Fprintf(os.Stderr, "clustertest: %s is not set: bringing up a test cluster with %s/up\n", EnvKubeconfig, scripts)
	if err := Script(ctx, scripts, "up", nil); err != nil {
		os.Setenv(envUpError, err.Error())
		code := m.Run()
		if err := Script(ctx, scripts, "down", nil); err != nil {
			fmt.Fprintf(os.Stderr, "clustertest: %v\n", err)
		}
		return max(code, 1)
	}
	env, err := ScriptEnv(ctx, scripts, nil)
	if err == nil {
		for k, v := range env {
			if err = os.Setenv(k, v); err != nil {
				break
			}
		}
	}
	if err != nil {
		os.Setenv(envUpError, err.Error())
	}
	code := m.Run()
	if err := Script(ctx, scripts, "down", nil); err != nil {
		fmt.Fprintf(os.Stderr, "clustertest: %v\n", err)
		code = max(code, 1)
	}
	return code
}

// runningCluster returns the environment of a cluster that tests/cluster/env
// knows of and whose API server says it is ready.
func runningCluster(ctx context.Context, scripts string) (map[string]string, bool) {
	env, err := ScriptEnv(ctx, scripts, nil)
	if err != nil {
		return nil, false
	}
	c, err := Connect(env[EnvKubeconfig])
	if err != nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = c.Clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	return env, err == nil
}

// flock takes a flock (LOCK_SH or LOCK_EX) on path, waiting for it, and
// returns its release.
func flock(path string, how int) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open cluster lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("take cluster lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// scriptsDir finds tests/cluster: from the environment of a running
// cluster, else next to this source file.
func scriptsDir() string {
	if d := os.Getenv(EnvScripts); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "cluster")
}

// Script runs tests/cluster/NAME with extra environment (KEY=VALUE), its
// output going to this process's stderr.
func Script(ctx context.Context, scripts, name string, env []string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(scripts, name))
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("run tests/cluster/%s: %w", name, err)
	}
	return nil
}

var exportLine = regexp.MustCompile(`^export ([A-Z_][A-Z0-9_]*)=(.*)$`)

// ScriptEnv runs tests/cluster/env and returns the variables it exports.
func ScriptEnv(ctx context.Context, scripts string, env []string) (map[string]string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(scripts, "env"))
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("run tests/cluster/env: %w", err)
	}
	vars := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := exportLine.FindStringSubmatch(sc.Text()); m != nil {
			vars[m[1]] = m[2]
		}
	}
	if vars[EnvKubeconfig] == "" {
		return nil, fmt.Errorf("tests/cluster/env printed no %s", EnvKubeconfig)
	}
	return vars, nil
}

// Connect returns an admin Cluster (without a namespace of its own) for
// the kubeconfig at path.
func Connect(kubeconfig string) (*Cluster, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("make clientset: %w", err)
	}
	image := os.Getenv(EnvImage)
	if image == "" {
		image = "knotless.test/busybox:1"
	}
	return &Cluster{
		Config:     cfg,
		Clientset:  cs,
		Kubeconfig: kubeconfig,
		Image:      image,
		Info: Info{
			NodeName:       os.Getenv(EnvNodeName),
			NodeNetns:      os.Getenv(EnvNodeNetns),
			NodeIP:         os.Getenv(EnvNodeIP),
			HostIP:         os.Getenv(EnvHostIP),
			PodCIDR:        os.Getenv(EnvPodCIDR),
			PodBridge:      os.Getenv(EnvPodBridge),
			ContainerdSock: os.Getenv(EnvContainerdSock),
			Dir:            os.Getenv(EnvClusterDir),
			Scripts:        scriptsDir(),
		},
	}, nil
}

// Start gives the test the test cluster and a namespace of its own,
// deleted (without waiting for it to go) when the test ends. Under -short
// it skips the test.
//
// The test shares the cluster with every other test of every test binary
// on this machine: while it runs it holds a shared lock that
// StartExclusive waits for.
func Start(t testing.TB) *Cluster {
	t.Helper()
	return start(t, syscall.LOCK_SH)
}

// StartExclusive is Start for a test that disrupts the whole cluster (it
// restarts the API server, say): it waits until no other test that called
// Start or StartExclusive is running, on any test binary of this machine,
// and keeps them waiting until it ends.
func StartExclusive(t testing.TB) *Cluster {
	t.Helper()
	return start(t, syscall.LOCK_EX)
}

func start(t testing.TB, how int) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("clustertest: SKIPPED: this test needs a real Kubernetes cluster and -short is set; " +
			"run without -short (tests/cluster/up && eval \"$(tests/cluster/env)\" && go test ./...)")
	}
	if msg := os.Getenv(envUpError); msg != "" {
		t.Fatalf("clustertest: the test cluster did not come up: %s", msg)
	}
	kubeconfig := os.Getenv(EnvKubeconfig)
	if kubeconfig == "" {
		t.Fatalf("clustertest: no test cluster: set %s (tests/cluster/up && eval \"$(tests/cluster/env)\"), "+
			"or call clustertest.Main from the package's TestMain", EnvKubeconfig)
	}
	unlock, err := flock(useLockPath(kubeconfig), how)
	if err != nil {
		t.Fatalf("clustertest: %v", err)
	}
	t.Cleanup(unlock) // runs last: after the namespace cleanup below
	c, err := Connect(kubeconfig)
	if err != nil {
		t.Fatalf("clustertest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns, err := c.createNamespace(ctx, t.Name())
	if err != nil {
		t.Fatalf("clustertest: %v", err)
	}
	c.Namespace = ns
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c.capacityLabelled {
			if err := c.labelNodes(ctx, c.capacityLabel(), nil); err != nil {
				t.Errorf("clustertest: %v", err)
			}
		}
		bg := metav1.DeletePropagationBackground
		err := c.Clientset.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{PropagationPolicy: &bg})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("clustertest: delete namespace %s: %v", ns, err)
		}
		if err := c.DeleteAdmissionPolicies(ctx, ns); err != nil {
			t.Errorf("clustertest: %v", err)
		}
	})
	return c
}

// DeleteAdmissionPolicies deletes the runner admission policies and
// bindings (cluster-wide: they do not go with a namespace) that
// `knotless-run kubeconfig` or `manifests` made for a service account of
// namespace ns or of one named after it (NS-runs). Start's clean-up calls
// it for the test's namespace; a test that mints into a namespace of
// another name calls it for that one.
func (c *Cluster) DeleteAdmissionPolicies(ctx context.Context, ns string) error {
	mine := func(m metav1.ObjectMeta) bool {
		v := m.Labels[kubecred.LabelServiceAccountNamespace]
		return v == ns || strings.HasPrefix(v, ns+"-")
	}
	list := metav1.ListOptions{LabelSelector: kubecred.LabelServiceAccountNamespace}
	api := c.Clientset.AdmissionregistrationV1()
	bindings, err := api.ValidatingAdmissionPolicyBindings().List(ctx, list)
	if err != nil {
		return fmt.Errorf("list admission policy bindings: %w", err)
	}
	for _, b := range bindings.Items {
		if !mine(b.ObjectMeta) {
			continue
		}
		if err := api.ValidatingAdmissionPolicyBindings().Delete(ctx, b.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete admission policy binding %s: %w", b.Name, err)
		}
	}
	policies, err := api.ValidatingAdmissionPolicies().List(ctx, list)
	if err != nil {
		return fmt.Errorf("list admission policies: %w", err)
	}
	for _, p := range policies.Items {
		if !mine(p.ObjectMeta) {
			continue
		}
		if err := api.ValidatingAdmissionPolicies().Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete admission policy %s: %w", p.Name, err)
		}
	}
	return nil
}

// useLockPath is the lock that Start and StartExclusive take for the
// cluster of a kubeconfig.
func useLockPath(kubeconfig string) string {
	sum := sha256.Sum256([]byte(kubeconfig))
	return filepath.Join(os.TempDir(), "knotless-test-cluster-use-"+hex.EncodeToString(sum[:6])+".lock")
}

var nonName = regexp.MustCompile(`[^a-z0-9-]+`)

// createNamespace makes a namespace named after the test and waits for
// its default service account, without which no pod is admitted.
func (c *Cluster) createNamespace(ctx context.Context, testName string) (string, error) {
	base := strings.Trim(nonName.ReplaceAllString(strings.ToLower(testName), "-"), "-")
	if len(base) > 40 {
		base = strings.TrimRight(base[:40], "-")
	}
	ns, err := c.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "kt-" + base + "-",
			Labels:       map[string]string{LabelTest: "true"},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create test namespace: %w", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := c.Clientset.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return "", fmt.Errorf("wait for the default service account of %s: %w", ns.Name, err)
	}
	return ns.Name, nil
}

// WaitForPod waits until a pod in namespace matching selector (a label
// selector) satisfies cond, and returns it.
func (c *Cluster) WaitForPod(ctx context.Context, namespace, selector string, cond func(*corev1.Pod) bool) (*corev1.Pod, error) {
	var found *corev1.Pod
	var last []corev1.Pod
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, err := c.Clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, nil // the API server may be restarting
		}
		last = pods.Items
		for i := range pods.Items {
			if cond(&pods.Items[i]) {
				found = &pods.Items[i]
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("wait for a pod %q in %s: %w; last seen: %s", selector, namespace, err, describePods(last))
	}
	return found, nil
}

// describePods says where each pod stands: node, phase, conditions and
// why its containers wait, for a wait's timeout message.
func describePods(pods []corev1.Pod) string {
	if len(pods) == 0 {
		return "no pod"
	}
	var b strings.Builder
	for i, p := range pods {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "pod %s on node %q, phase %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		if p.Status.Reason != "" || p.Status.Message != "" {
			fmt.Fprintf(&b, " (%s: %s)", p.Status.Reason, p.Status.Message)
		}
		for _, c := range p.Status.Conditions {
			fmt.Fprintf(&b, ", %s=%s", c.Type, c.Status)
			if c.Reason != "" || c.Message != "" {
				fmt.Fprintf(&b, " (%s: %s, at %s)", c.Reason, c.Message, c.LastTransitionTime.Format(time.TimeOnly))
			}
		}
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil {
				fmt.Fprintf(&b, ", container %s waiting (%s: %s)", cs.Name, w.Reason, w.Message)
			}
		}
	}
	return b.String()
}

// PodReady reports whether the pod's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// PodUnschedulable reports whether the scheduler found no node for the pod.
func PodUnschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
		}
	}
	return false
}

// errNoNodeInfo is returned by helpers that need to know the cluster's
// node when the environment does not describe it.
var errNoNodeInfo = errors.New("the environment does not describe the node (" + EnvNodeName + ", " + EnvNodeNetns + "): not a tests/cluster cluster")
