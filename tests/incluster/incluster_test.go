// Package incluster runs knotless-run the way an operator runs it inside
// the cluster it runs Jobs on: an image of the binary, `knotless-run
// manifests` applied as `kubectl apply --server-side -f -` applies it, the
// pod's own service account, no kubeconfig anywhere.
package incluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/cgi"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	knotlesskube "knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/kube/kubecred"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/gitrepo"
	"knotless.dev/run/tests/pds"
)

func TestMain(m *testing.M) { clustertest.Main(m) }

const (
	runnerName = "knotless-runner"
	runnerPod  = runnerName + "-0"
	uid        = 65532
)

// TestRunnerInCluster: `knotless-run manifests`, applied as kubectl
// applies it, brings up a runner that runs a push as a Job with its
// pod's service-account credentials and no kubeconfig anywhere; its
// rights, asked from inside the pod, are the Role's; deleting its pod in
// the middle of a run leads to the next pod adopting the run and writing
// exactly one final check.
func TestRunnerInCluster(t *testing.T) {
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	if err := pds.Installed(); err != nil {
		t.Fatal(err)
	}
	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Minute)
	defer cancel()
	node := c.Info.NodeIP
	runsNS := c.Namespace + "-runs"

	// The pods' way to the API server, the PDS, its PLC and the git
	// source: forwarders on the node's own address (and the kubernetes
	// Service's), never an address off the harness.
	c.ServeKubernetesService(t)
	srv, err := pds.StartWith(ctx, t.TempDir(), pds.Options{PublicHost: node})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	pdsPort := port(t, srv.PublicURL)
	c.Forward(t, net.JoinHostPort(node, pdsPort), "127.0.0.1:"+pdsPort)
	plcPort := port(t, srv.PLCURL)
	plcURL := "http://" + c.Forward(t, net.JoinHostPort(node, plcPort), "127.0.0.1:"+plcPort)
	src := gitrepo.New(t)
	gitURL := "http://" + c.ForwardToNode(t, serveGit(t, src.Dir)) + "/repo/.git"

	owner, runner, password, err := srv.OwnerAndRunner(ctx, "knotless-run")
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, owner: owner, runner: runner, src: src,
		reader: &pdsclient.Reader{Dir: srv.Directory(), Catalog: catalog(t)}}
	w.repoURI = forge.RepoURI(owner.DID, "hello")
	w.put(owner, forge.CollectionRepo, "hello", forge.Repo{
		Type: forge.CollectionRepo, Name: "hello", Source: gitURL, DefaultBranch: "main",
		Runners: []string{runner.DID.String()}, CreatedAt: forge.Now(),
	})

	// The image: what the flake publishes (nix/image.nix), built from
	// this host's files by deploy/image, with busybox added (a shell to
	// look around with). Its default name, knotless-run:VERSION, is the
	// one manifests names by default; the node's CRI would read that as
	// a registry's, so the test loads it under a name of its own.
	began := time.Now()
	bin := buildBinary(t)
	t.Logf("built knotless-run without cgo in %s", time.Since(began).Round(time.Second))
	deployImage := filepath.Join(repoRoot(), "deploy", "image")
	name, err := exec.Command(deployImage, "--print-name", bin).Output()
	if err != nil {
		t.Fatalf("deploy/image --print-name: %v", err)
	}
	defaults := run(t, bin, "manifests", "--did", runner.DID.String())
	if !bytes.Contains(defaults, []byte("image: "+strings.TrimSpace(string(name))+"\n")) {
		t.Errorf("manifests without --image do not name %s, deploy/image's default:\n%s", name, defaults)
	}
	image := "knotless.test/runner-" + c.Namespace + ":1"
	archive := filepath.Join(t.TempDir(), "image.tar")
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(deployImage, archive, bin, "--name", image, "--shell", busybox).CombinedOutput(); err != nil {
		t.Fatalf("deploy/image: %v\n%s", err, out)
	}
	c.ImportImage(t, archive, image)

	// The operator's part: the app password Secret, and a volume (the
	// harness has no provisioner: a hostPath PersistentVolume of this
	// test's storage class, owned by the pod's UID).
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "knotless-app-password", Namespace: c.Namespace},
		StringData: map[string]string{"app-password": password}}
	if _, err := c.Clientset.CoreV1().Secrets(c.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	storageClass := "knotless-test-" + c.Namespace
	persistentVolume(t, c, storageClass)

	manifests := run(t, bin, "manifests", "--namespace", c.Namespace, "--runs-namespace", runsNS,
		"--image", image, "--did", runner.DID.String(), "--pds", srv.PublicURL,
		"--storage-class", storageClass, "--storage-size", "1Gi",
		"--serve-flag=--plc-url", "--serve-flag="+plcURL,
		"--serve-flag=--allow-http-sources",
		"--serve-flag=--image", "--serve-flag="+c.Image,
		"--serve-flag=--poll", "--serve-flag=5s",
		owner.DID.String()+"/hello")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = c.Clientset.CoreV1().Namespaces().Delete(ctx, runsNS, metav1.DeleteOptions{})
	})
	apply(t, c, manifests)
	// Marked as a test namespace only after the apply, so the apply is
	// the operator's.
	if _, err := c.Clientset.CoreV1().Namespaces().Patch(ctx, runsNS, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+clustertest.LabelTest+`":"true"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	logs := &podLogs{c: c, ns: c.Namespace, logs: map[types.UID]*bytes.Buffer{}}
	defer logs.stop()
	applied := time.Now()
	first := waitReady(ctx, t, c, "")
	logs.follow(ctx, first)
	t.Logf("runner pod %s Ready %s after the apply", first.UID, time.Since(applied).Round(10*time.Millisecond))

	t.Run("no kubeconfig anywhere", func(t *testing.T) {
		for _, ctr := range first.Spec.Containers {
			for _, e := range ctr.Env {
				if e.Name == "KUBECONFIG" {
					t.Errorf("container %s has KUBECONFIG=%s", ctr.Name, e.Value)
				}
			}
			if slices.ContainsFunc(ctr.Args, func(a string) bool { return strings.HasPrefix(a, "--kubeconfig") }) {
				t.Errorf("container %s runs with %q", ctr.Name, ctr.Args)
			}
		}
		out, code := execIn(ctx, t, c, first.Name, "sh", "-c",
			`env | grep -c '^KUBECONFIG=' ; find / -xdev \( -name '*kubeconfig*' -o -name .kube \) 2>/dev/null; ls /var/run/secrets/kubernetes.io/serviceaccount`)
		lines := strings.Fields(out)
		if code != 0 || len(lines) < 1 || lines[0] != "0" || !strings.Contains(out, "token") || strings.Contains(out, "kubeconfig") || strings.Contains(out, ".kube") {
			t.Errorf("inside the runner pod (exit %d):\n%s", code, out)
		}
		if log := logs.text(first.UID); !strings.Contains(log, "cluster credentials loaded") || !strings.Contains(log, "server=https://"+clusterIP(t, c)) {
			t.Errorf("the runner did not load the in-cluster credentials:\n%s", log)
		}
	})

	t.Run("can-i is the Role", func(t *testing.T) {
		out, code := execIn(ctx, t, c, first.Name, "knotless-run", "kubeconfig", "--check-in-cluster", "--namespace", runsNS)
		t.Logf("knotless-run kubeconfig --check-in-cluster in the pod (exit %d):\n%s", code, out)
		if code != 0 {
			t.Errorf("the pod's access answers are not the Role's")
		}
		for _, ch := range kubecred.Checks() {
			if !strings.Contains(out, fmt.Sprintf("%-28s allowed=%-5v want=%v", ch.String(), ch.Want, ch.Want)) {
				t.Errorf("no right answer for %s in:\n%s", ch, out)
			}
		}
		// Every right the pod's token has in the runs namespace, as the
		// API server lists them for it, is a rule of the Role's.
		token, code := execIn(ctx, t, c, first.Name, "cat", "/var/run/secrets/kubernetes.io/serviceaccount/token")
		if code != 0 {
			t.Fatalf("read the pod's token: %s", token)
		}
		got := rights(ctx, t, c, token, runsNS)
		want := ruleSet(kubecred.Rules())
		if !slices.Equal(got, want) {
			t.Errorf("the pod's rights in %s:\n%s\nwant the Role's:\n%s", runsNS, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if other := rights(ctx, t, c, token, c.Namespace); len(other) != 0 {
			t.Errorf("the pod has rights in its own namespace %s: %v", c.Namespace, other)
		}
		// The manifests' admission policy holds the pod's account: a Job
		// that mounts a Secret is refused for it (a dry run).
		cfg := rest.AnonymousClientConfig(c.Config)
		cfg.BearerToken = strings.TrimSpace(token)
		if err := kubecred.VerifyAdmission(ctx, cfg, runsNS, kubecred.PolicyName(c.Namespace, runnerName), time.Minute); err != nil {
			t.Errorf("the runner pod's account: %v", err)
		}
	})

	t.Run("a push runs as a Job", func(t *testing.T) {
		_, commit := w.push(map[string]string{".knotless/workflows/build.yaml": "on: [push]\nsteps:\n  - {name: build, run: echo built in the cluster}\n"})
		got := w.waitFinal(ctx, "build", commit)
		if got.Status != "success" {
			t.Fatalf("check %s (%s)\n%s", got.Status, got.Error, logs.all())
		}
		if blob := w.blob(ctx, got); !strings.Contains(blob, "built in the cluster") {
			t.Errorf("log blob:\n%s", blob)
		}
	})

	t.Run("restart mid-run adopts", func(t *testing.T) {
		_, commit := w.push(map[string]string{".knotless/workflows/long.yaml": `
on: [push]
steps:
  - name: long
    run: |
      echo before
      touch "$KNOTLESS_RUN_WORK/step-started"
      sleep 20
      echo after
`})
		selector := knotlesskube.LabelRunner + "=" + knotlesskube.RunnerLabel(runner.DID.String())
		if err := c.WaitForCommand(ctx, runsNS, selector, "run", []string{"test", "-e", "/work/step-started"}); err != nil {
			t.Fatalf("the step did not start: %v\n%s", err, logs.all())
		}
		finals := w.watchFinals(ctx, "long", commit)

		deleted := time.Now()
		if err := c.Clientset.CoreV1().Pods(c.Namespace).Delete(ctx, runnerPod, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		gone := waitGone(ctx, t, c, first.UID)
		second := waitReady(ctx, t, c, first.UID)
		ready := time.Now()
		logs.follow(ctx, second)
		handedOver := logs.waitFor(ctx, first.UID, "handed over 1 runs")
		adopted := logs.waitFor(ctx, second.UID, "adopted 1 runs")
		ms := func(at time.Time) time.Duration { return at.Sub(deleted).Round(10 * time.Millisecond) }
		t.Logf("restart, from the delete: old pod handed over at %s, old pod gone at %s, new pod adopted at %s, new pod Ready at %s",
			ms(handedOver), ms(gone), ms(adopted), ms(ready))

		got := w.waitFinal(ctx, "long", commit)
		final := time.Now()
		t.Logf("restart, from the delete: final check seen at %s", ms(final))
		if got.Status != "success" {
			t.Fatalf("the adopted run: %s (%s)\n%s", got.Status, got.Error, logs.all())
		}
		if old := logs.text(first.UID); !strings.Contains(old, "handed over 1 runs") || !strings.Contains(old, "going_on=1") {
			t.Errorf("the old pod did not hand the run over:\n%s", old)
		}
		// A second final write would change the record: watch it a while
		// longer.
		time.Sleep(10 * time.Second)
		if n := finals(); n != 1 {
			t.Errorf("%d distinct final versions of the check, want exactly 1", n)
		}
		blob := w.blob(ctx, got)
		for _, line := range []string{"before", "after"} {
			if n := strings.Count("\n"+blob, "\n"+line+"\n"); n != 1 {
				t.Errorf("line %q %d times in the log blob, want once:\n%s", line, n, blob)
			}
		}
	})
	if t.Failed() {
		t.Logf("runner logs:\n%s", logs.all())
	}
}

func port(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil || u.Port() == "" {
		t.Fatalf("URL %q has no port: %v", rawURL, err)
	}
	return u.Port()
}

func clusterIP(t *testing.T, c *clustertest.Cluster) string {
	t.Helper()
	svc, err := c.Clientset.CoreV1().Services("default").Get(t.Context(), "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// serveGit serves the repositories under dir's parent over git's smart
// HTTP (git http-backend) on the host's loopback; dir is /repo/.git.
func serveGit(t *testing.T, dir string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.Symlink(dir, filepath.Join(root, "repo")); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &cgi.Handler{Path: "/usr/lib/git-core/git-http-backend",
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(l) }()
	t.Cleanup(func() { _ = hs.Close(); <-done })
	return l.Addr().String()
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// buildBinary builds knotless-run without cgo, for an image with no libc.
func buildBinary(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "knotless-run")
	cmd := exec.Command("go", "build", "-o", out, "knotless.dev/run/cmd/knotless-run")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

func run(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("knotless-run %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// apply does what `kubectl apply --server-side -f -` does with the
// stream: each document, in order, a server-side apply of its own
// field manager.
func apply(t *testing.T, c *clustertest.Cluster, stream []byte) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Clientset.Discovery()))
	force := true
	for _, doc := range strings.Split(string(stream), "\n---\n") {
		doc = strings.TrimPrefix(doc, "---\n")
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			t.Fatalf("manifests: %v\n%s", err, doc)
		}
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("map %s: %v", gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if ns := obj.GetNamespace(); ns != "" {
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		body, err := json.Marshal(obj.Object)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ri.Patch(t.Context(), obj.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "kubectl", Force: &force}); err != nil {
			t.Fatalf("apply %s %s: %v", gvk.Kind, obj.GetName(), err)
		}
	}
}

// persistentVolume makes the volume the StatefulSet's claim binds to
// as the Kubernetes runner guide says to where nothing provisions
// (docs/guide/kubernetes-runner.md, "The runner's volume"): its shell
// lines make a directory of the node (the host) owned by the pod's UID,
// and its PersistentVolume, a local volume of a class no StorageClass
// defines, is applied with the test's names: class, volume name,
// directory, node and namespace.
func persistentVolume(t *testing.T, c *clustertest.Cluster, class string) {
	t.Helper()
	b, err := os.ReadFile("../../docs/guide/kubernetes-runner.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	dir := filepath.Join(t.TempDir(), "knotless-runner")
	guide := strings.NewReplacer(
		"/srv/knotless-runner", dir,
		"knotless-runner-data", class,
		"knotless-local", class,
		"namespace: knotless\n", "namespace: "+c.Namespace+"\n",
		"node-1", c.Info.NodeName,
	)
	var script, manifest string
	for _, block := range guideBlocks(doc) {
		switch {
		case strings.HasPrefix(block, "# on node-1\n"):
			script = guide.Replace(block)
		case strings.Contains(block, "\nkind: PersistentVolume\n"):
			manifest = guide.Replace(block)
		}
	}
	if script == "" || manifest == "" {
		t.Fatalf("the guide shows no PersistentVolume and its directory (script %q, manifest %q)", script, manifest)
	}
	if out, err := exec.Command("bash", "-euo", "pipefail", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("the guide's lines for the node: %v\n%s\n%s", err, script, out)
	}
	var pv corev1.PersistentVolume
	if err := yaml.UnmarshalStrict([]byte(manifest), &pv); err != nil {
		t.Fatalf("the guide's PersistentVolume: %v\n%s", err, manifest)
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.Name != "data-"+runnerPod {
		t.Fatalf("the guide's PersistentVolume is for claim %v, want data-%s", ref, runnerPod)
	}
	pv.Labels = map[string]string{clustertest.LabelTest: "true"}
	if _, err := c.Clientset.CoreV1().PersistentVolumes().Create(t.Context(), &pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Clientset.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete PersistentVolume %s: %v", pv.Name, err)
		}
	})
}

// guideBlocks returns the bodies of a Markdown page's fenced blocks,
// dedented by their fence's own indentation (blocks in list items).
func guideBlocks(doc string) []string {
	var blocks []string
	var cur []string
	indent, in := "", false
	for _, line := range strings.SplitAfter(doc, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if strings.HasPrefix(trimmed, "```") {
			if in {
				blocks = append(blocks, strings.Join(cur, ""))
				cur, in = nil, false
			} else {
				indent, in = line[:len(line)-len(trimmed)], true
			}
			continue
		}
		if in {
			cur = append(cur, strings.TrimPrefix(line, indent))
		}
	}
	return blocks
}

// waitReady waits for the runner pod, other than the one with UID not,
// to be Ready.
func waitReady(ctx context.Context, t *testing.T, c *clustertest.Cluster, not types.UID) *corev1.Pod {
	t.Helper()
	for {
		p, err := c.Clientset.CoreV1().Pods(c.Namespace).Get(ctx, runnerPod, metav1.GetOptions{})
		if err == nil && p.UID != not && clustertest.PodReady(p) {
			return p
		}
		select {
		case <-ctx.Done():
			t.Fatalf("runner pod not Ready: %v; last: %v %s", ctx.Err(), err, podState(p))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func podState(p *corev1.Pod) string {
	if p == nil {
		return "no pod"
	}
	b, _ := json.Marshal(p.Status)
	return string(b)
}

// waitGone waits until the pod with uid is gone and returns when.
func waitGone(ctx context.Context, t *testing.T, c *clustertest.Cluster, uid types.UID) time.Time {
	t.Helper()
	for {
		p, err := c.Clientset.CoreV1().Pods(c.Namespace).Get(ctx, runnerPod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && p.UID != uid {
			return time.Now()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the old runner pod is still there: %v", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func execIn(ctx context.Context, t *testing.T, c *clustertest.Cluster, pod string, cmd ...string) (string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code, err := c.Exec(ctx, c.Namespace, pod, "runner", cmd, nil, &stdout, &stderr)
	if err != nil {
		t.Fatalf("exec %v in %s: %v", cmd, pod, err)
	}
	return stdout.String() + stderr.String(), code
}

// rights lists, as "group resource verb", what the token may do in ns
// besides what every authenticated user may (the self-reviews).
func rights(ctx context.Context, t *testing.T, c *clustertest.Cluster, token, ns string) []string {
	t.Helper()
	cfg := rest.AnonymousClientConfig(c.Config)
	cfg.BearerToken = strings.TrimSpace(token)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := cs.AuthorizationV1().SelfSubjectRulesReviews().Create(ctx, &authorizationv1.SelfSubjectRulesReview{
		Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rev.Status.ResourceRules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				if g == "authorization.k8s.io" || g == "authentication.k8s.io" {
					continue // self reviews: every user's
				}
				for _, v := range r.Verbs {
					out = append(out, g+" "+res+" "+v)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
