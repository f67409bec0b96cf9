// Package operating runs what docs/guide/operating.md tells an operator
// to look at against a real runner: `knotless-run serve` on the test
// cluster and a real PDS, scraped by a real Prometheus (Debian's), its
// journal lines, and `knotless-run status` against it running and
// stopped.
package operating

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/kube/kubecred"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/internal/observe/status"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
	"knotless.dev/run/tests/prometheus"
)

func TestMain(m *testing.M) { clustertest.Main(m) }

// The workflows of the push: one that succeeds, one that holds its
// step until the test lets it go (a file in its pod), and one for the
// pull.
var workflows = map[string]string{
	".knotless/workflows/build.yaml": "on: [push]\nsteps:\n  - name: hello\n    run: echo hello\n",
	".knotless/workflows/hold.yaml":  "on: [push]\nsteps:\n  - name: wait\n    run: touch /work/holding; while ! test -e /work/go; do sleep 0.2; done; echo let go\n",
	".knotless/workflows/pull.yaml":  "on: [pull]\nsteps:\n  - name: check\n    run: echo pull\n",
}

// TestServeObserved: `serve --metrics-listen` on the test cluster and a
// real PDS (its rate limits on), scraped by a real Prometheus. At start
// it sweeps the Job an earlier process left, logs the sweep with its
// counts and exports them. While a run holds its step, `status` (over
// the socket and over the metrics listener) shows the daemon, the run at
// its step, the queued work and the executor's credential. After a push
// and a pull have run, Prometheus's API answers each series with the
// value the work makes; the journal has the Kubernetes lifecycle lines
// with Job, namespace, image, pod and node. Stopped with a run held,
// the daemon hands it over, and `status` reads it from state.json.
func TestServeObserved(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Minute)
	defer cancel()
	srv, w := startWorld(t, ctx, pds.Options{RateLimits: true}, "operating")
	runner := w.Runner.DID.String()
	bin := buildBinary(t)
	// The runner's credential: a bound token of a few minutes' life, made
	// last.
	kubeconfig := c.ScopedKubeconfig(t, "runner", kubecred.Rules())

	// A Job an earlier process of this runner left (killed with -9).
	old, err := kubernetes.New(kubernetes.Config{Credentials: kubernetes.Credentials{Kubeconfig: kubeconfig}, Runner: runner,
		Pod: kubernetes.PodOptions{Image: c.Image}})
	if err != nil {
		t.Fatal(err)
	}
	orphan := "orphan-" + randomHex(4)
	if _, err := old.Start(ctx, executor.Spec{RunID: orphan, Image: c.Image, Timeout: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}

	// The work: a push, and a pull by another account.
	pushed := time.Now()
	_, commit := w.Push(workflows)
	author, err := srv.CreateAccount(ctx, "author")
	if err != nil {
		t.Fatal(err)
	}
	fork := w.Src.Clone(t)
	head := fork.Commit("feature", map[string]string{"feature.txt": "new\n"})
	w.Put(author, forge.CollectionPull, "", forge.Pull{Type: forge.CollectionPull, Repo: w.RepoURI.String(), Base: "main",
		Head: forge.PullHead{Source: "file://" + fork.Dir, Ref: "refs/heads/feature", Commit: head}, Title: "a feature",
		State: forge.PullOpen, CreatedAt: forge.Now()})

	// Prometheus scrapes the address serve is to listen on.
	addr := freeAddr(t)
	prom := prometheus.Start(t, prometheus.Options{Targets: []string{addr}})

	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	writeFile(t, filepath.Join(dir, "app-password"), w.Password+"\n")
	d := &daemon{t: t, bin: bin, args: []string{"--log-format", "json", "serve", "--did", runner, "--pds", srv.URL, "--plc-url", srv.PLCURL,
		"--state-dir", stateDir, "--cache-dir", filepath.Join(dir, "cache"), "--app-password-file", filepath.Join(dir, "app-password"),
		"--executor", "kubernetes", "--kubeconfig", kubeconfig, "--image", c.Image, "--allow-local-sources", "--pulls", "--discover",
		"--poll", "10s", "--stop-wait", "1m", "--metrics-listen", addr, w.Owner.DID.String() + "/" + forgeworld.RepoName}}
	d.start()

	// The start-up sweep took the orphan, said so with its counts, and
	// exports them.
	d.waitLine(ctx, "ready", nil)
	d.hasLine("orphan swept", map[string]string{"job": kubernetes.JobName(orphan), "run": orphan, "namespace": c.Namespace, "image": c.Image, "swept_total": "1"})
	d.hasLine("sweep finished", map[string]string{"swept": "1", "failed": "0", "swept_total": "1", "cleanup_failures_total": "0"})
	if i, j := d.index("sweep finished"), d.index("ready"); i < 0 || i > j {
		t.Errorf("the sweep is logged at line %d, after ready at %d: it is part of the start", i, j)
	}
	const wait = 3 * time.Minute
	prom.WaitValue(t, `up{job="knotless-run"}`, 1, wait)
	prom.WaitValue(t, `knotless_run_swept_objects_total`, 1, wait)
	prom.WaitFor(t, `knotless_run_sweeps_total`, wait, func(v model.Vector) bool { return len(v) == 1 && v[0].Value >= 1 })

	// While hold holds its step: status over the socket and over the
	// metrics listener.
	holdPod := func() string {
		pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(runner)})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			var stdout, stderr strings.Builder // the exec needs a stream; two, as it copies them concurrently
			if code, err := c.Exec(ctx, c.Namespace, p.Name, "run", []string{"test", "-e", "/work/holding"}, nil, &stdout, &stderr); err == nil && code == 0 {
				return p.Name
			}
		}
		return ""
	}
	var pod string
	waitUntil(t, ctx, "the hold step to start", func() bool { pod = holdPod(); return pod != "" }, d.logs)
	var doc status.Doc
	waitUntil(t, ctx, "status to show the hold run and the work queued behind it", func() bool {
		doc = d.status(ctx, "--json")
		return len(doc.Runs) == 1 && len(doc.Queued) >= 1
	}, func() string { return fmt.Sprintf("%+v\n%s", doc, d.logs()) })
	r := doc.Runs[0]
	if doc.Source != status.FromDaemon || doc.Daemon == nil || !doc.Daemon.Ready || doc.Daemon.Executor != "kubernetes" || doc.Daemon.Runner != runner {
		t.Errorf("status of the running daemon: source %s, daemon %+v", doc.Source, doc.Daemon)
	}
	if r.Workflow != "hold" || r.Kind != forge.KindPush || r.Commit != commit || r.Step != 1 || r.Steps != 1 || r.StepName != "wait" ||
		r.Started.IsZero() || r.StepStarted.IsZero() || r.RunID == "" {
		t.Errorf("the run going: %+v", r)
	}
	if len(doc.Credentials) != 1 || doc.Credentials[0].Name != "kubernetes" || !doc.Credentials[0].Expires.After(time.Now()) {
		t.Errorf("credentials: %+v, want the token's expiry", doc.Credentials)
	}
	if len(doc.Owed) != 0 || len(doc.Degraded) != 0 {
		t.Errorf("owed %+v, degraded %q; want none", doc.Owed, doc.Degraded)
	}
	human := d.statusText(ctx)
	for _, want := range []string{"daemon: ready", "executor kubernetes", "runs going: 1", "1/1 wait", "credential kubernetes: expires"} {
		if !strings.Contains(human, want) {
			t.Errorf("status has no %q:\n%s", want, human)
		}
	}
	if over := d.status(ctx, "--json", "--url", "http://"+addr+status.Path); over.Source != status.FromDaemon || len(over.Runs) != 1 {
		t.Errorf("status over the metrics listener: %+v", over)
	}
	prom.WaitValue(t, `knotless_run_runs_going`, 1, wait)

	// Let it go; everything runs.
	var stdout, stderr strings.Builder
	if code, err := c.Exec(ctx, c.Namespace, pod, "run", []string{"touch", "/work/go"}, nil, &stdout, &stderr); err != nil || code != 0 {
		t.Fatalf("let the hold step go: exit %d, %v", code, err)
	}
	waitUntil(t, ctx, "three final checks", func() bool {
		n := 0
		for _, ch := range w.Checks() {
			if ch.Value.Status == "success" {
				n++
			}
		}
		return n == 3
	}, d.logs)

	// Prometheus's API, after a push (two runs) and a pull (one).
	for _, s := range []struct {
		expr string
		want float64
	}{
		{`knotless_run_runs_total{status="success",kind="push",executor="kubernetes"}`, 2},
		{`knotless_run_runs_total{status="success",kind="pull",executor="kubernetes"}`, 1},
		{`sum(knotless_run_runs_total)`, 3},
		// The first run was taken by the free worker (no queued
		// record); the push's other run and the pull waited for it.
		{`knotless_run_check_writes_total{status="queued"}`, 2},
		{`knotless_run_check_writes_total{status="running"}`, 3},
		{`knotless_run_check_writes_total{status="success"}`, 3},
		{`sum(knotless_run_check_writes_total)`, 8},
		{`knotless_run_check_refusals_total`, 0},
		{`knotless_run_pickup_seconds_count`, 2}, // the push's runs; a pull's record does not say when its head moved
		{`knotless_run_queue_wait_seconds_count`, 3},
		{`knotless_run_session_ready_seconds_count`, 3},
		{`knotless_run_step_duration_seconds_count{status="success"}`, 3},
		{`knotless_run_duration_seconds_count{status="success",kind="push"}`, 2},
		{`count(knotless_run_transfer_bytes_count{direction="in"} >= 3)`, 1}, // each run's checkout and step scripts, at least
		{`knotless_run_queue_depth`, 0},
		{`knotless_run_runs_going`, 0},
		{`knotless_run_owed_checks`, 0},
		{`knotless_run_degraded{reason="executor"}`, 0},
		{`knotless_run_cleanup_failures_total`, 0},
		{`knotless_run_swept_objects_total`, 1},
	} {
		prom.WaitValue(t, s.expr, s.want, wait)
	}
	// The pickup: at most the time since the push was written, for each
	// of the two runs.
	bound := 2 * time.Since(pushed).Seconds()
	prom.WaitFor(t, `knotless_run_pickup_seconds_sum`, wait, func(v model.Vector) bool {
		return len(v) == 1 && v[0].Value > 0 && float64(v[0].Value) < bound
	})
	prom.WaitFor(t, `knotless_run_credential_expiry_seconds{credential="kubernetes"}`, wait, func(v model.Vector) bool { return len(v) == 1 && v[0].Value > 0 })
	// The PDS reported its write budget (its rate limits are on).
	prom.WaitFor(t, `knotless_run_pds_write_budget_remaining`, wait, func(v model.Vector) bool { return len(v) == 1 && v[0].Value > 0 })
	prom.WaitFor(t, `process_resident_memory_bytes{job="knotless-run"}`, wait, func(v model.Vector) bool { return len(v) == 1 && v[0].Value > 0 })
	prom.WaitFor(t, `go_goroutines{job="knotless-run"}`, wait, func(v model.Vector) bool { return len(v) == 1 && v[0].Value > 0 })

	// The journal: each run's lifecycle on the cluster, by Job, namespace
	// and image, and from the pod's Ready on, pod and node.
	onCluster := map[string]string{"namespace": c.Namespace, "image": c.Image, "job": "", "run": ""}
	withPod := map[string]string{"namespace": c.Namespace, "image": c.Image, "job": "", "run": "", "pod": "", "node": c.Info.NodeName}
	// A run's Job is deleted after its final check is written (the
	// verdict before the clean-up): the last one may still be going.
	waitUntil(t, ctx, "each run's Job deleted", func() bool {
		return d.count("job deleted", merge(withPod, map[string]string{"after": ""})) >= 3
	}, d.logs)
	for _, line := range []struct {
		msg    string
		fields map[string]string
	}{
		{"job created", onCluster},
		{"pod ready", merge(withPod, map[string]string{"after": ""})},
		{"step started in pod", merge(withPod, map[string]string{"step": "1"})},
		{"step ended in pod", merge(withPod, map[string]string{"step": "1", "exit": "0", "duration": ""})},
		{"job deleted", merge(withPod, map[string]string{"after": ""})},
	} {
		if n := d.count(line.msg, line.fields); n != 3 {
			t.Errorf("%d %q lines with %v, want 3 (one a run)", n, line.msg, line.fields)
		}
	}

	// Stopped with a run held: the run is handed over, and status reads
	// it from state.json.
	w.Push(map[string]string{".knotless/workflows/hold.yaml": workflows[".knotless/workflows/hold.yaml"], "again.txt": "again\n"})
	waitUntil(t, ctx, "the second hold step to start", func() bool { p := holdPod(); return p != "" && p != pod }, d.logs)
	d.stop()
	if !strings.Contains(d.logs(), "handed over") {
		t.Errorf("the stopped daemon handed nothing over:\n%s", d.logs())
	}
	doc = d.status(ctx, "--json")
	if doc.Source != status.FromStateFile || doc.Daemon != nil || doc.Queued != nil || len(doc.Runs) != 1 {
		t.Fatalf("status of the stopped daemon: %+v", doc)
	}
	if r := doc.Runs[0]; r.Workflow != "hold" || !r.HandedOver || r.Step != 1 || r.StepName != "wait" || r.Session == "" {
		t.Errorf("the run handed over: %+v", r)
	}
	human = d.statusText(ctx)
	for _, want := range []string{"daemon: not running", "runs left: 1 (1 handed over", "1/1 wait (handed over)", "queued: unknown"} {
		if !strings.Contains(human, want) {
			t.Errorf("status of the stopped daemon has no %q:\n%s", want, human)
		}
	}
}

// daemon is one `knotless-run serve` process and its log.
type daemon struct {
	t    *testing.T
	bin  string
	args []string
	cmd  *exec.Cmd
	out  syncbuf.Buffer
	done chan error
}

func (d *daemon) start() {
	d.cmd = exec.Command(d.bin, d.args...)
	d.cmd.Env = append(os.Environ(), "KUBECONFIG=", "CREDENTIALS_DIRECTORY=")
	d.cmd.Stdout, d.cmd.Stderr = &d.out, &d.out
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.done = make(chan error, 1)
	go func() { d.done <- d.cmd.Wait() }()
	d.t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			_ = d.cmd.Process.Kill()
			<-d.done
		}
	})
}

// stop sends SIGTERM and waits for the handover.
func (d *daemon) stop() {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		d.t.Fatal(err)
	}
	select {
	case err := <-d.done:
		if err != nil {
			d.t.Errorf("serve ended with %v after SIGTERM\n%s", err, d.logs())
		}
	case <-time.After(2 * time.Minute):
		d.t.Fatalf("serve did not stop within 2 minutes of SIGTERM\n%s", d.logs())
	}
}

func (d *daemon) logs() string { return d.out.String() }

// lines are the log's JSON lines, each its fields as text.
func (d *daemon) lines() []map[string]string {
	var out []map[string]string
	sc := bufio.NewScanner(strings.NewReader(d.logs()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var raw map[string]any
		if json.Unmarshal(sc.Bytes(), &raw) != nil {
			continue
		}
		line := map[string]string{}
		for k, v := range raw {
			line[k] = fmt.Sprint(v)
		}
		out = append(out, line)
	}
	return out
}

// matches reports whether line is msg with fields (a field wanted ""
// must be there with any value).
func matches(line map[string]string, msg string, fields map[string]string) bool {
	if line["msg"] != msg {
		return false
	}
	for k, v := range fields {
		got, ok := line[k]
		if !ok || (v != "" && got != v) {
			return false
		}
	}
	return true
}

func (d *daemon) count(msg string, fields map[string]string) int {
	n := 0
	for _, l := range d.lines() {
		if matches(l, msg, fields) {
			n++
		}
	}
	return n
}

func (d *daemon) index(msg string) int {
	return slices.IndexFunc(d.lines(), func(l map[string]string) bool { return l["msg"] == msg })
}

func (d *daemon) hasLine(msg string, fields map[string]string) {
	d.t.Helper()
	if d.count(msg, fields) == 0 {
		d.t.Errorf("no %q line with %v in the log:\n%s", msg, fields, d.logs())
	}
}

func (d *daemon) waitLine(ctx context.Context, msg string, fields map[string]string) {
	d.t.Helper()
	waitUntil(d.t, ctx, "a "+msg+" line", func() bool { return d.count(msg, fields) > 0 }, d.logs)
}

// status runs `knotless-run status` with args against the daemon's
// state directory and decodes its --json document.
func (d *daemon) status(ctx context.Context, args ...string) status.Doc {
	d.t.Helper()
	out := d.run(ctx, append([]string{"status", "--state-dir", d.flag("--state-dir")}, args...)...)
	var doc status.Doc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		d.t.Fatalf("status --json: %v\n%s", err, out)
	}
	return doc
}

func (d *daemon) statusText(ctx context.Context) string {
	d.t.Helper()
	return d.run(ctx, "status", "--state-dir", d.flag("--state-dir"))
}

func (d *daemon) run(ctx context.Context, args ...string) string {
	d.t.Helper()
	out, err := exec.CommandContext(ctx, d.bin, args...).Output()
	if err != nil {
		d.t.Fatalf("knotless-run %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// flag is the value of serve's flag name.
func (d *daemon) flag(name string) string {
	i := slices.Index(d.args, name)
	return d.args[i+1]
}

// waitUntil polls cond every second until it holds (the PDS's rate
// limits are on: a poll costs), failing t with what says when ctx ends
// first.
func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool, says func() string) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v\n%s", what, ctx.Err(), says())
		case <-time.After(time.Second):
		}
	}
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// startWorld starts a PDS of the test's own with opts, and the forge's
// accounts and repository on it for app.
func startWorld(t *testing.T, ctx context.Context, opts pds.Options, app string) (*pds.Server, *forgeworld.World) {
	t.Helper()
	if err := pds.Installed(); err != nil {
		t.Fatal(err)
	}
	srv, err := pds.StartWith(ctx, t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv, forgeworld.New(t, srv, forgeworld.Options{App: app})
}

// buildBinary builds knotless-run from this checkout.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "knotless-run")
	if out, err := exec.Command("go", "build", "-o", bin, "knotless.dev/run/cmd/knotless-run").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// freeAddr is a free loopback address.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func writeFile(t *testing.T, name, content string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
