package kubernetes_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"knotless.dev/run/internal/engine/run"
	knotlesskube "knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/kube/kubecred"
	"knotless.dev/run/tests/clustertest"
)

// Steps run as UID 1000, not root, and can still write every run
// directory, the transfer volume and /tmp; checkout in and outputs out
// work as that user.
func TestStepsRunAsNonRoot(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	src := `on: push
steps:
  - name: who
    run: |
      echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"
      cat checked-out.txt
      echo w > /work/new && echo s > /steps/new && echo t > /tmp/new
      echo out > "$KNOTLESS_RUN_OUTPUTS/out.txt"
`
	checkout := t.TempDir()
	if err := writeFile(filepath.Join(checkout, "checked-out.txt"), "in\n"); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	res := engine(newExecutor(t, c, nil), c.Image).Run(context.Background(), run.Request{
		RunID: randomID("uid"), Workflow: parse(t, src), Checkout: checkout, Outputs: out, Trusted: true,
	})
	if res.Status != run.Success {
		t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
	}
	if log := string(res.Log); !strings.Contains(log, "uid=1000 gid=1000") || !strings.Contains(log, "\nin\n") {
		t.Errorf("the step did not run as 1000:1000 with the checkout readable:\n%s", log)
	}
	if b, err := readFile(filepath.Join(out, "out.txt")); err != nil || b != "out\n" {
		t.Errorf("output out.txt: %q, %v", b, err)
	}
	assertNothingLeft(t, c)
}

// The runs namespace that `knotless-run kubeconfig` makes enforces Pod
// Security "restricted": with the runner's own scoped credential, a Job
// whose pod is privileged is refused at the pod's admission, so a stolen
// runner kubeconfig cannot make a privileged pod. The runner's own Jobs
// are admitted.
func TestRunsNamespaceRestricted(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	opts := kubecred.Options{Namespace: c.Namespace, ServiceAccount: "knotless-runner", Duration: time.Hour}
	if err := kubecred.Ensure(ctx, adminClient(t, c), opts); err != nil {
		t.Fatal(err)
	}
	ns, err := c.Clientset.CoreV1().Namespaces().Get(ctx, c.Namespace, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ns.Labels[kubecred.LabelPodSecurityEnforce]; got != "restricted" {
		t.Errorf("namespace label %s = %q, want restricted", kubecred.LabelPodSecurityEnforce, got)
	}
	kc, _, err := kubecred.Mint(ctx, adminClient(t, c), c.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "runner.kubeconfig")
	if err := kubecred.WriteKubeconfig(path, kc); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*kc, nil).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	warnings := &warningRecorder{}
	cfg.WarningHandler = warnings
	runner, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// A privileged Job, as a stolen credential would make it.
	zero := int32(0)
	evil := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "privileged"},
		Spec: batchv1.JobSpec{BackoffLimit: &zero, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "privileged"}},
			Spec: corev1.PodSpec{
				RestartPolicy:                corev1.RestartPolicyNever,
				AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{
					Name: "run", Image: c.Image, ImagePullPolicy: corev1.PullNever,
					Command:         []string{"sh", "-c", "sleep 3600"},
					SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
				}},
			},
		}},
	}
	if _, err := runner.BatchV1().Jobs(c.Namespace).Create(ctx, evil, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the Job with the runner's credential: %v", err)
	}
	t.Logf("warnings on create: %q", warnings.all())
	refused := ""
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) && refused == "" {
		events, err := c.Clientset.CoreV1().Events(c.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=privileged"})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range events.Items {
			if e.Reason == "FailedCreate" && strings.Contains(e.Message, "violates PodSecurity") {
				refused = e.Message
			}
		}
		pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=privileged"})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) > 0 {
			t.Fatalf("a privileged pod was admitted in the runs namespace: %s", pods.Items[0].Name)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if refused == "" {
		t.Fatalf("no FailedCreate event naming PodSecurity for the privileged Job")
	}
	t.Logf("refused: %s", refused)
	if !strings.Contains(warnings.all(), "PodSecurity") {
		t.Errorf("the API server did not warn the creator: %q", warnings.all())
	}

	// The runner's own Jobs pass.
	ex := newExecutor(t, c, func(cfg *knotlesskube.Config) { cfg.Credentials.Kubeconfig = path })
	res := engine(ex, c.Image).Run(ctx, run.Request{RunID: randomID("pss"), Workflow: parse(t, "on: push\nsteps: [{run: 'id -u'}]\n"), Checkout: t.TempDir(), Trusted: true})
	if res.Status != run.Success {
		t.Errorf("a run in the restricted namespace: %s (%s)\n%s", res.Status, res.Error, res.Log)
	}
}

type warningRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningRecorder) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warningRecorder) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.msgs, "; ")
}

// runnerPolicies returns the runner's ingress policy and the egress
// policy of mode as the API has them, and the ones the runner wants.
func runnerPolicies(t *testing.T, c *clustertest.Cluster, runner string, mode knotlesskube.EgressMode) (got, want []*networkingv1.NetworkPolicy) {
	t.Helper()
	ctx := context.Background()
	block, err := knotlesskube.DefaultEgressBlock(ctx, c.Config.Host, nil)
	if err != nil {
		t.Fatal(err)
	}
	want = []*networkingv1.NetworkPolicy{
		knotlesskube.BuildNetworkPolicy(c.Namespace, runner),
		knotlesskube.BuildEgressPolicy(c.Namespace, runner, mode, block),
	}
	for _, w := range want {
		np, err := c.Clientset.NetworkingV1().NetworkPolicies(c.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("policy %s: %v", w.Name, err)
		}
		got = append(got, np)
	}
	return got, want
}

// A policy with the runner's name but an allow-all spec is not trusted:
// the run replaces it with the runner's own, using only the runner's
// scoped credential. So is one named like the egress policy of a pull's
// pods that lets them reach everything.
func TestNetworkPolicyWithWrongSpecReplaced(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	runner := "did:plc:" + randomID("np")
	allowAll := knotlesskube.BuildNetworkPolicy(c.Namespace, runner)
	allowAll.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
	allowAll.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"nothing": "here"}}
	allowEgress := knotlesskube.BuildEgressPolicy(c.Namespace, runner, knotlesskube.EgressPublic, nil)
	allowEgress.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{}}
	for _, np := range []*networkingv1.NetworkPolicy{allowAll, allowEgress} {
		if _, err := c.Clientset.NetworkingV1().NetworkPolicies(c.Namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := c.ScopedKubeconfig(t, "runner", kubecred.Rules())
	ex := newExecutor(t, c, func(cfg *knotlesskube.Config) {
		cfg.Runner = runner
		cfg.Credentials.Kubeconfig = kubeconfig
	})
	res := engine(ex, c.Image).Run(ctx, run.Request{RunID: randomID("np"), Workflow: parse(t, "on: pull\nsteps: [{run: 'true'}]\n"), Checkout: t.TempDir(), Trusted: false})
	if res.Status != run.Success {
		t.Fatalf("status %s (%s)\n%s", res.Status, res.Error, res.Log)
	}
	got, want := runnerPolicies(t, c, runner, knotlesskube.EgressPublic)
	for i := range want {
		if !equality.Semantic.DeepEqual(got[i].Spec, want[i].Spec) {
			t.Errorf("the allow-all policy named like the runner's %s was kept:\ngot  %+v\nwant %+v", want[i].Name, got[i].Spec, want[i].Spec)
		}
	}
}

// Policies deleted between runs are made again before the next run of
// the same process: the ingress policy and the egress policy of a
// pull's pods.
func TestNetworkPolicyRecreatedEachRun(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	runner := "did:plc:" + randomID("np")
	ex := newExecutor(t, c, func(cfg *knotlesskube.Config) { cfg.Runner = runner })
	wf := parse(t, "on: pull\nsteps: [{run: 'true'}]\n")
	for i := range 2 {
		res := engine(ex, c.Image).Run(ctx, run.Request{RunID: randomID("np"), Workflow: wf, Checkout: t.TempDir(), Trusted: false})
		if res.Status != run.Success {
			t.Fatalf("run %d: status %s (%s)\n%s", i+1, res.Status, res.Error, res.Log)
		}
		got, want := runnerPolicies(t, c, runner, knotlesskube.EgressPublic)
		for j := range want {
			if !equality.Semantic.DeepEqual(got[j].Spec, want[j].Spec) {
				t.Errorf("after run %d: policy %s is not the runner's: %+v", i+1, want[j].Name, got[j].Spec)
			}
			if i == 0 {
				if err := c.Clientset.NetworkingV1().NetworkPolicies(c.Namespace).Delete(ctx, got[j].Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// TestEgress probes with busybox nc from a step, by the run's trust and
// the operator's egress settings. The targets:
//
//   - the node's kubelet, a private address of the cluster (the API
//     server's own address is dropped for every pod by the harness's
//     egress guard, whatever the policy);
//   - the API server as pods see it in-cluster: the kubernetes Service's
//     ClusterIP (ServeKubernetesService makes it an address of the node
//     that forwards to the API server);
//   - 169.254.169.254, the cloud metadata address, and 198.51.100.7, a
//     TEST-NET address standing for the public internet, both served on
//     the node's loopback (ServeOnNodeAddress): nothing leaves the
//     machine, and only the policy decides whether a pod reaches them;
//   - port 53 on the node's address, a DNS stand-in.
//
// With open every one is reached (so each probe can succeed); deny
// reaches none; allow-dns only port 53, never a blocked address; a
// pull's pod, by default public, reaches the public address and port 53
// and none of the kubelet, the API server's ClusterIP or the metadata
// address, nor the public address once it is in the block list.
func TestEgress(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	if c.Info.NodeIP == "" || c.Info.NodeNetns == "" {
		t.Fatal("the environment does not describe the node")
	}
	ctx := context.Background()
	// A DNS stand-in on the node's address: the harness runs no DNS.
	listen := exec.Command("ip", "netns", "exec", c.Info.NodeNetns, "busybox", "nc", "-ll", "-p", "53", "-e", "echo", "dns")
	if err := listen.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = listen.Process.Kill(); _ = listen.Wait() })
	c.ServeKubernetesService(t)
	svc, err := c.Clientset.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	target := func(hostPort string) string {
		host, port, err := net.SplitHostPort(hostPort)
		if err != nil {
			t.Fatal(err)
		}
		return host + " " + port
	}
	node := c.Info.NodeIP
	kubelet := node + " 20250"
	dns := node + " 53"
	apiService := target(net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(svc.Spec.Ports[0].Port)))
	const publicIP = "198.51.100.7"
	metadata := target(c.ServeOnNodeAddress(t, "169.254.169.254"))
	public := target(c.ServeOnNodeAddress(t, publicIP))
	probe := func(target string) string {
		return fmt.Sprintf(`if nc -w 3 %s </dev/null >/dev/null 2>&1; then echo "%s REACHED"; else echo "%s BLOCKED"; fi`, target, target, target)
	}
	all := []string{kubelet, dns, apiService, metadata, public}
	for _, tt := range []struct {
		name    string
		egress  knotlesskube.Egress
		trusted bool
		reached []string
		blocked []string
	}{
		{"a push, open by default", knotlesskube.Egress{}, true, all, nil},
		{"deny", knotlesskube.Egress{Mode: knotlesskube.EgressDeny}, true, nil, all},
		{"allow-dns", knotlesskube.Egress{Mode: knotlesskube.EgressAllowDNS}, true, []string{dns}, []string{kubelet, apiService, metadata, public}},
		{"allow-dns blocking the node", knotlesskube.Egress{Mode: knotlesskube.EgressAllowDNS, Block: []netip.Prefix{netip.MustParsePrefix(node + "/32")}}, true, nil, []string{kubelet, dns}},
		{"a pull, public by default", knotlesskube.Egress{}, false, []string{public, dns}, []string{kubelet, apiService, metadata}},
		{"a pull, public blocking the public address", knotlesskube.Egress{Block: []netip.Prefix{netip.MustParsePrefix(publicIP + "/32")}}, false, []string{dns}, []string{public, kubelet, apiService, metadata}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// One at a time: the policies are per runner, and each case
			// has its own runner.
			ex := newExecutor(t, c, func(cfg *knotlesskube.Config) { cfg.Pod.Egress = tt.egress })
			// kube-router applies a new pod's rules a moment after it
			// starts. Every mode but open blocks the kubelet: the probes
			// start once it is blocked (at most 20 tries), and a blocked
			// target gets several tries to be sure it never connects.
			script := ""
			if len(tt.blocked) > 0 {
				script += "i=0; while [ $i -lt 20 ] && nc -w 1 " + kubelet + " </dev/null >/dev/null 2>&1; do i=$((i+1)); sleep 1; done\n"
			}
			for _, target := range append(append([]string{}, tt.reached...), tt.blocked...) {
				script += "for i in 1 2 3; do " + probe(target) + "; done\n"
			}
			src := "on: push\nsteps:\n  - name: probe\n    run: |\n" + indent(script, "      ")
			res := engine(ex, c.Image).Run(ctx, run.Request{RunID: randomID("eg"), Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: tt.trusted})
			if res.Status != run.Success {
				t.Fatalf("status %s (%s)\n%s", res.Status, res.Error, res.Log)
			}
			log := string(res.Log)
			t.Logf("log:\n%s", log)
			for _, target := range tt.reached {
				if !strings.Contains(log, target+" REACHED") {
					t.Errorf("egress %s: %s was never reached", tt.name, target)
				}
			}
			for _, target := range tt.blocked {
				if strings.Contains(log, target+" REACHED") {
					t.Errorf("egress %s: %s was reached", tt.name, target)
				}
			}
		})
	}
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return prefix + strings.Join(lines, "\n"+prefix) + "\n"
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o644) }

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}
