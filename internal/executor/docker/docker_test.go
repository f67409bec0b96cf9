package docker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/conformance"
	"knotless.dev/run/internal/rules/workflow"
	"knotless.dev/run/tests/dockerd"
)

var daemon dockerd.Shared

func TestMain(m *testing.M) { os.Exit(daemon.Main(m)) }

// newExecutor returns an executor on d for the runner did.
func newExecutor(t testing.TB, d *dockerd.Daemon, did string, cfg Config) *Executor {
	t.Helper()
	cfg.Host, cfg.Runner = d.Host(), did
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ex, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ex.Close() })
	return ex
}

// runner returns a runner DID of the test's own, so that its sweeps and
// label listings see only its runs.
func runner(t testing.TB) string {
	sum := sha256.Sum256([]byte(t.Name() + time.Now().String()))
	return "did:plc:" + hex.EncodeToString(sum[:6])
}

func TestConformance(t *testing.T) {
	d := daemon.Get(t)
	conformance.Run(t, conformance.Harness{
		New: func(t *testing.T) executor.Executor {
			return newExecutor(t, d, "did:plc:conformance", Config{})
		},
		Image: d.Image(),
		// The container's whole writable file system: its root and
		// volumes, and /dev/shm; not /proc, /sys and the device nodes.
		SecretSearch: `$(ls -d /* | grep -vx -e /proc -e /sys -e /dev) /dev/shm`,
		// Creating and starting a container with its network takes
		// seconds on a loaded machine.
		StartTime:  30 * time.Second,
		Fenced:     true,
		Services:   true,
		StepImages: true,
	})
}

// objects lists what carries the runner's label on the daemon.
func objects(t *testing.T, d *dockerd.Daemon, did string) []string {
	t.Helper()
	cli, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	f := client.Filters{}.Add("label", LabelRunner+"="+executor.RunnerLabel(did))
	var out []string
	cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs.Items {
		out = append(out, "container "+strings.Join(c.Names, ",")+" run "+c.Labels[LabelRun])
	}
	ns, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns.Items {
		out = append(out, "network "+n.Name+" run "+n.Labels[LabelRun])
	}
	vs, err := cli.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs.Items {
		out = append(out, "volume "+v.Name+" run "+v.Labels[LabelRun])
	}
	slices.Sort(out)
	return out
}

func loadExample(t testing.TB) (*workflow.Workflow, string) {
	t.Helper()
	checkout, err := filepath.Abs("../../../examples/hello")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(checkout, ".knotless/workflows/build.yaml")
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	wf, err := workflow.Parse(file, src)
	if err != nil {
		t.Fatal(err)
	}
	return wf, checkout
}

func TestExampleWorkflow(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	did := runner(t)
	wf, checkout := loadExample(t)
	out := t.TempDir()
	eng := run.New(run.Config{Executor: newExecutor(t, d, did, Config{}), DefaultImage: d.Image(), Runner: did, CleanupTimeout: time.Minute})
	res := eng.Run(context.Background(), run.Request{RunID: "hello1", Workflow: wf, Checkout: checkout, Outputs: out, Trusted: true})
	if res.Status != run.Success {
		t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
	}
	if got := strings.Join(res.Outputs, ","); got != "greeting.sha256,report.txt" {
		t.Errorf("outputs = %s", got)
	}
	greeting, err := os.ReadFile(filepath.Join(checkout, "greeting.txt"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(greeting)
	got, err := os.ReadFile(filepath.Join(out, "greeting.sha256"))
	if err != nil || !strings.HasPrefix(string(got), hex.EncodeToString(sum[:])+"  greeting.txt") {
		t.Errorf("greeting.sha256 = %q, %v; want the sum of greeting.txt", got, err)
	}
	if !strings.Contains(string(res.Log), "hello from knotless-run") || !strings.Contains(string(res.Log), "wrote 2 outputs") {
		t.Errorf("log:\n%s", res.Log)
	}
	if left := objects(t, d, did); len(left) > 0 {
		t.Errorf("left after the run:\n%s", strings.Join(left, "\n"))
	}
}

// recorder keeps the sessions an engine starts, for a test to look into
// after the run.
type recorder struct {
	*Executor
	mu       sync.Mutex
	sessions []*Session
}

func (r *recorder) Start(ctx context.Context, spec executor.Spec) (executor.Session, error) {
	s, err := r.Executor.Start(ctx, spec)
	if err == nil {
		r.mu.Lock()
		r.sessions = append(r.sessions, s.(*Session))
		r.mu.Unlock()
	}
	return s, err
}

// TestNoSecretOutsideTheStep runs a secret-bearing workflow, keeps its
// container, and looks for the secret in the container's inspect, in
// every exec's inspect, and in every file the daemon keeps for the run
// on the host: data root (container config, layers, volumes) and exec
// root (containerd's specs and state).
func TestNoSecretOutsideTheStep(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	did := runner(t)
	rec := &recorder{Executor: newExecutor(t, d, did, Config{})}
	probe := "secret-probe-" + hex.EncodeToString([]byte(t.Name()))[:12] + "-value"
	src := `on: push
secrets: [PROBE]
steps:
  - name: use
    secrets: [PROBE]
    run: |
      test -n "$PROBE"
      printf 'using %s\n' "$PROBE"
      echo done > "$KNOTLESS_RUN_OUTPUTS/done"
      sh -c 'sleep 300' &
  - name: after
    run: echo after
`
	wf, err := workflow.Parse("secret.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	eng := run.New(run.Config{Executor: rec, DefaultImage: d.Image(), Runner: did, CleanupTimeout: time.Minute})
	res := eng.Run(context.Background(), run.Request{
		RunID: "secret1", Workflow: wf, Checkout: t.TempDir(), Outputs: t.TempDir(), Trusted: true, Keep: true,
		Secrets: map[string]string{"PROBE": probe},
	})
	if res.Status != run.Success || !strings.Contains(string(res.Log), "using ***") {
		t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
	}
	if len(rec.sessions) != 1 {
		t.Fatalf("%d sessions", len(rec.sessions))
	}
	s := rec.sessions[0]
	defer func() {
		if _, err := rec.Sweep(context.Background(), nil); err != nil {
			t.Errorf("sweep: %v", err)
		}
	}()
	ctx := context.Background()
	in, err := rec.cli.ContainerInspect(ctx, s.id, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(in.Raw, []byte(probe)) {
		t.Errorf("the secret is in the container's inspect")
	}
	s.mu.Lock()
	execs := slices.Clone(s.execs)
	s.mu.Unlock()
	if len(execs) < 2 {
		t.Fatalf("%d execs recorded", len(execs))
	}
	for _, id := range execs {
		raw := rawGet(t, rec.Executor, "/exec/"+id+"/json")
		if bytes.Contains(raw, []byte(probe)) {
			t.Errorf("the secret is in the inspect of exec %s", id)
		}
	}
	var files int
	for _, root := range []string{d.DataRoot(), d.ExecRoot()} {
		err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			files++
			if bytes.Contains(b, []byte(probe)) {
				t.Errorf("the secret is in %s", p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("searched %d files of the daemon and %d exec inspects", files, len(execs))
}

func rawGet(t *testing.T, e *Executor, path string) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+client.DummyHost+"/v"+e.cli.ClientVersion()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := e.raw.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	return b
}

// execIn runs script in the container with a plain exec and returns its
// output.
func execIn(t *testing.T, e *Executor, id, script string) string {
	t.Helper()
	ctx := context.Background()
	ex, err := e.cli.ExecCreate(ctx, id, client.ExecCreateOptions{AttachStdout: true, AttachStderr: true, Cmd: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	att, err := e.cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &out, att.Reader); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// startStep starts a step of the session with script as its payload.
func startStep(t testing.TB, s executor.Session, id, script string) {
	t.Helper()
	if err := s.StartStep(context.Background(), id, []byte("set -e\n"+script)); err != nil {
		t.Fatalf("start step %s: %v", id, err)
	}
}

// runStep runs a step of the session to its end and returns its output.
func runStep(t testing.TB, s executor.Session, id, script string) (string, int) {
	t.Helper()
	startStep(t, s, id, script)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	exit, err := s.FollowStep(ctx, id, 0, &out)
	if err != nil {
		t.Fatalf("step %s: %v\n%s", id, err, out.String())
	}
	return out.String(), exit.Code
}

func startSession(t testing.TB, ex *Executor, image, id string, res executor.Resources) *Session {
	t.Helper()
	s, err := ex.Start(context.Background(), executor.Spec{RunID: id, Runner: ex.cfg.Runner, Image: image, Resources: res})
	if err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	t.Cleanup(func() {
		if err := s.Stop(context.Background()); err != nil {
			t.Errorf("stop %s: %v", id, err)
		}
	})
	return s.(*Session)
}

// TestNetworkIsolation probes from one run's container to a listener in
// another's: on networks of their own the probe cannot connect; on a
// shared network (the control) it can. The daemon is its own: on the
// shared one, other tests create networks, and each create opens the
// engine's isolation for a moment (isolationGap), so that a probe in
// that moment got through (1 make test in 13).
func TestNetworkIsolation(t *testing.T) {
	t.Parallel()
	d := dockerd.Start(t)
	cli, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	shared := "knotless-test-shared-" + hex.EncodeToString([]byte(time.Now().Format("150405.000")))[:8]
	if _, err := cli.NetworkCreate(context.Background(), shared, client.NetworkCreateOptions{Driver: "bridge"}); err != nil {
		t.Fatal(err)
	}
	defer cli.NetworkRemove(context.Background(), shared, client.NetworkRemoveOptions{})

	// netState is what the daemon's network namespace says of its
	// bridges, routes and filter rules, and where a and b are: what a
	// probe that got through is to be read against.
	netState := func(a, b *Session) string {
		var out strings.Builder
		for _, s := range []*Session{a, b} {
			in, err := cli.ContainerInspect(context.Background(), s.id, client.ContainerInspectOptions{})
			if err != nil {
				fmt.Fprintf(&out, "inspect %s: %v\n", s.id, err)
				continue
			}
			for name, n := range in.Container.NetworkSettings.Networks {
				fmt.Fprintf(&out, "container %s: network %s (%s) address %s gateway %s\n", s.id[:12], name, n.NetworkID, n.IPAddress, n.Gateway)
			}
		}
		for _, args := range [][]string{{"ip", "-br", "addr"}, {"ip", "route"}, {"iptables", "-w", "-S"}} {
			b, err := exec.Command("ip", append([]string{"netns", "exec", d.Netns()}, args...)...).CombinedOutput()
			fmt.Fprintf(&out, "$ %s (%v)\n%s", strings.Join(args, " "), err, b)
		}
		return out.String()
	}
	probe := func(t *testing.T, ex *Executor, suffix string) string {
		a := startSession(t, ex, d.Image(), "neta"+suffix, executor.Resources{})
		b := startSession(t, ex, d.Image(), "netb"+suffix, executor.Resources{})
		in, err := cli.ContainerInspect(context.Background(), b.id, client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ip string
		for _, n := range in.Container.NetworkSettings.Networks {
			ip = n.IPAddress.String()
		}
		if ip == "" || ip == "invalid IP" {
			t.Fatalf("container b has no address: %+v", in.Container.NetworkSettings.Networks)
		}
		startStep(t, b, "listen", "exec nc -ll -p 8080 -e /bin/true\n")
		// The listener answers inside its own container before the probe.
		if out, code := runStep(t, b, "ready", "for i in $(seq 50); do nc -w 1 127.0.0.1 8080 </dev/null && { echo up; exit 0; }; sleep 0.1; done; exit 1\n"); code != 0 {
			t.Fatalf("listener never came up: %s", out)
		}
		// stderr and stdout are two streams: nc's complaint may come after.
		out, _ := runStep(t, a, "probe", "if nc -w 3 "+ip+" 8080 </dev/null 2>/dev/null; then echo CONNECTED; else echo BLOCKED; fi\n")
		if strings.Contains(out, "CONNECTED") && suffix == "1" {
			t.Logf("a probe between runs got through; the daemon's network namespace:\n%s", netState(a, b))
		}
		return strings.TrimSpace(out)
	}
	t.Run("per-run networks", func(t *testing.T) {
		ex := newExecutor(t, d, runner(t), Config{})
		if got := probe(t, ex, "1"); !strings.Contains(got, "BLOCKED") || strings.Contains(got, "CONNECTED") {
			t.Errorf("probe from one run to another: %q, want BLOCKED", got)
		}
	})
	t.Run("shared network control", func(t *testing.T) {
		ex := newExecutor(t, d, runner(t), Config{Network: shared})
		if got := probe(t, ex, "2"); !strings.Contains(got, "CONNECTED") || strings.Contains(got, "BLOCKED") {
			t.Errorf("probe on a shared network: %q, want CONNECTED (else the probe proves nothing)", got)
		}
	})
}

// TestTimeoutKillsTree runs a step that starts a tree of processes, one
// of them in a session of its own, and hangs: at its timeout the run
// fails, and none of the processes is left in the kept container.
func TestTimeoutKillsTree(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	did := runner(t)
	rec := &recorder{Executor: newExecutor(t, d, did, Config{})}
	src := `on: push
steps:
  - name: hang
    timeout: 2s
    run: |
      sh -c 'sh -c "sleep 300; :" knotless-tree-marker & sleep 300; :' knotless-tree-marker &
      setsid sh -c 'sleep 300; :' knotless-tree-marker &
      sleep 300
`
	wf, err := workflow.Parse("hang.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res := run.New(run.Config{Executor: rec, DefaultImage: d.Image(), Runner: did, CleanupTimeout: time.Minute}).
		Run(context.Background(), run.Request{RunID: "hang1", Workflow: wf, Checkout: t.TempDir(), Trusted: true, Keep: true})
	took := time.Since(start)
	defer func() {
		if _, err := rec.Sweep(context.Background(), nil); err != nil {
			t.Errorf("sweep: %v", err)
		}
	}()
	if res.Status != run.Failure || !res.Steps[0].TimedOut || took > 30*time.Second {
		t.Fatalf("status %s (%s) after %s, log:\n%s", res.Status, res.Error, took, res.Log)
	}
	out := execIn(t, rec.Executor, rec.sessions[0].id, "grep -l 'knotless-tree-marke[r]' /proc/[0-9]*/cmdline 2>/dev/null | while read f; do echo \"left: $f\"; done; echo checked")
	if strings.Contains(out, "left:") || !strings.Contains(out, "checked") {
		t.Errorf("after the timeout: %q, want no process of the step", out)
	}
}

// TestSweepAbandoned starts two sessions, abandons them without Stop as
// a killed runner would (one in the middle of a step), and sweeps with a
// new executor that keeps one run.
func TestSweepAbandoned(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	did := runner(t)
	old := newExecutor(t, d, did, Config{})
	ctx := context.Background()
	a, err := old.Start(ctx, executor.Spec{RunID: "gone", Runner: did, Image: d.Image()})
	if err != nil {
		t.Fatal(err)
	}
	startStep(t, a, "1", "sleep 300\n")
	b, err := old.Start(ctx, executor.Spec{RunID: "kept", Runner: did, Image: d.Image()})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(objects(t, d, did)); got != 10 {
		t.Fatalf("%d objects for two runs, want 10:\n%s", got, strings.Join(objects(t, d, did), "\n"))
	}
	old.Close()

	fresh := newExecutor(t, d, did, Config{})
	refs, err := fresh.Sweep(ctx, []string{"kept"})
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) != 1 || refs[0].RunID != "gone" || refs[0].Executor != Name {
		t.Errorf("swept %v, want the run gone", refs)
	}
	left := objects(t, d, did)
	if len(left) != 5 || slices.ContainsFunc(left, func(s string) bool { return strings.HasSuffix(s, "run gone") }) {
		t.Errorf("after the sweep:\n%s\nwant the 5 objects of run kept", strings.Join(left, "\n"))
	}
	_ = b // the kept run's session belongs to the old executor, whose client is closed
	if refs, err := fresh.Sweep(ctx, nil); err != nil || len(refs) != 1 {
		t.Errorf("sweep of the kept run: %v, %v", refs, err)
	}
	if left := objects(t, d, did); len(left) > 0 {
		t.Errorf("after the last sweep:\n%s", strings.Join(left, "\n"))
	}
}

// TestSweepOlderBuild makes the objects of a run as a build before the
// shared executor.RunnerLabel named and labelled them (16 hex digits of
// the DID's SHA-256, not 20) and checks that a sweep of this build
// removes them all.
func TestSweepOlderBuild(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	did := runner(t)
	old := executor.RunnerLabel(did)[:16]
	cli, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	base := "knotless-" + old + "-r1"
	labels := map[string]string{LabelRunner: old, LabelRun: "r1"}
	if _, err := cli.NetworkCreate(ctx, base, client.NetworkCreateOptions{Driver: "bridge", Labels: labels}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: base + "-work", Driver: "local", Labels: labels}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name:   base,
		Config: &container.Config{Image: d.Image(), Cmd: []string{"true"}, Labels: labels},
	}); err != nil {
		t.Fatal(err)
	}
	oldObjects := client.Filters{}.Add("label", LabelRunner+"="+old)
	if cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: oldObjects}); err != nil || len(cs.Items) != 1 {
		t.Fatalf("containers of the older build before the sweep: %v, %v", cs, err)
	}

	refs, err := newExecutor(t, d, did, Config{}).Sweep(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []executor.Ref{{Executor: Name, RunID: "r1", Name: base}}
	if diff := cmp.Diff(refs, want); diff != "" {
		t.Errorf("swept refs (-got +want):\n%s", diff)
	}
	cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: oldObjects})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: oldObjects})
	if err != nil {
		t.Fatal(err)
	}
	vs, err := cli.VolumeList(ctx, client.VolumeListOptions{Filters: oldObjects})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Items)+len(ns.Items)+len(vs.Items) != 0 {
		t.Errorf("left after the sweep: %d containers, %d networks, %d volumes", len(cs.Items), len(ns.Items), len(vs.Items))
	}
}

// TestHardening checks the container's settings in its inspect and as
// its processes see them.
func TestHardening(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	ex := newExecutor(t, d, runner(t), Config{PidsLimit: 300})
	s := startSession(t, ex, d.Image(), "hard1", executor.Resources{CPU: "500m", Memory: "256Mi"})
	in, err := ex.cli.ContainerInspect(context.Background(), s.id, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hc := in.Container.HostConfig
	capAdd := slices.Sorted(slices.Values(hc.CapAdd))
	if hc.Privileged || !slices.Equal(hc.CapDrop, []string{"ALL"}) || !slices.Equal(capAdd, slices.Sorted(slices.Values(DefaultCapabilities))) ||
		!slices.Contains(hc.SecurityOpt, "no-new-privileges") || hc.Init == nil || !*hc.Init {
		t.Errorf("privileges: privileged %v capdrop %v capadd %v securityopt %v init %v", hc.Privileged, hc.CapDrop, hc.CapAdd, hc.SecurityOpt, hc.Init)
	}
	if hc.PidMode.IsHost() || hc.IpcMode.IsHost() || hc.UTSMode.IsHost() || hc.NetworkMode.IsHost() || hc.UsernsMode.IsHost() || hc.CgroupnsMode.IsHost() {
		t.Errorf("a host namespace: pid %q ipc %q uts %q net %q cgroupns %q", hc.PidMode, hc.IpcMode, hc.UTSMode, hc.NetworkMode, hc.CgroupnsMode)
	}
	if hc.PidsLimit == nil || *hc.PidsLimit != 300 || hc.Memory != 256<<20 || hc.NanoCPUs != 500_000_000 {
		t.Errorf("limits: pids %v memory %d nanocpus %d", hc.PidsLimit, hc.Memory, hc.NanoCPUs)
	}
	if len(hc.Binds) > 0 || len(in.Container.Mounts) != 3 {
		t.Errorf("mounts: binds %v mounts %+v", hc.Binds, in.Container.Mounts)
	}
	for _, m := range in.Container.Mounts {
		if m.Type != "volume" || strings.Contains(m.Source, "docker.sock") {
			t.Errorf("mount %+v", m)
		}
	}
	out, code := runStep(t, s, "1", `grep -E '^(CapBnd|CapEff|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\t ' ' '
cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max
test -S /var/run/docker.sock && echo DOCKER SOCKET || true
`)
	// CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4, KILL 5, SETGID 6,
	// SETUID 7, NET_BIND_SERVICE 10.
	want := "CapEff: 00000000000004fb\nCapBnd: 00000000000004fb\nNoNewPrivs: 1\nSeccomp: 2\n268435456\n300\n"
	if code != 0 || out != want {
		t.Errorf("inside the container:\n%s(exit %d), want\n%s", out, code, want)
	}
}

// TestDaemonFaults: a daemon that is not there, an image that is not
// there, and a daemon that dies in the middle of a step each end in an
// error that names the cause.
func TestDaemonFaults(t *testing.T) {
	t.Parallel()
	t.Run("no daemon", func(t *testing.T) {
		dockerdSkipShort(t)
		ex, err := New(Config{Host: "unix:///tmp/knotless-no-such-daemon.sock"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = ex.Start(context.Background(), executor.Spec{RunID: "x1", Runner: "did:plc:x", Image: "whatever"})
		if err == nil || !strings.Contains(err.Error(), "docker daemon at unix:///tmp/knotless-no-such-daemon.sock is not reachable") {
			t.Errorf("start without a daemon: %v", err)
		}
	})
	t.Run("missing image", func(t *testing.T) {
		d := daemon.Get(t)
		did := runner(t)
		ex := newExecutor(t, d, did, Config{})
		_, err := ex.Start(context.Background(), executor.Spec{RunID: "x2", Runner: did, Image: "knotless.test/absent:1"})
		if err == nil || !strings.Contains(err.Error(), "image knotless.test/absent:1 is not on the docker daemon and cannot be pulled") {
			t.Errorf("start with a missing image: %v", err)
		}
		ex = newExecutor(t, d, did, Config{Pull: PullNever})
		_, err = ex.Start(context.Background(), executor.Spec{RunID: "x3", Runner: did, Image: "knotless.test/absent:1"})
		if err == nil || !strings.Contains(err.Error(), "pull policy is never") {
			t.Errorf("start with a missing image, never pulling: %v", err)
		}
		if left := objects(t, d, did); len(left) > 0 {
			t.Errorf("left after failed starts:\n%s", strings.Join(left, "\n"))
		}
	})
	t.Run("daemon dies", func(t *testing.T) {
		d := dockerd.Start(t) // a daemon of its own: this one is killed
		did := runner(t)
		wf, err := workflow.Parse("dies.yaml", []byte("on: push\nsteps:\n  - {name: long, run: 'echo started; sleep 120'}\n"))
		if err != nil {
			t.Fatal(err)
		}
		live := &watchWriter{want: "started", seen: make(chan struct{})}
		go func() {
			<-live.seen
			if err := d.Kill(); err != nil {
				t.Errorf("kill dockerd: %v", err)
			}
		}()
		start := time.Now()
		res := run.New(run.Config{Executor: newExecutor(t, d, did, Config{}), DefaultImage: d.Image(), Runner: did, CleanupTimeout: 10 * time.Second}).
			Run(context.Background(), run.Request{RunID: "dies1", Workflow: wf, Checkout: t.TempDir(), Trusted: true, Live: live})
		if res.Status != run.Error || !strings.Contains(res.Error, "docker daemon at "+d.Host()) || time.Since(start) > time.Minute {
			t.Errorf("status %s, error %q after %s; want error naming the docker daemon\nlog:\n%s", res.Status, res.Error, time.Since(start), res.Log)
		}
		if !res.Lost {
			t.Errorf("a run whose docker daemon died is not lost to the infrastructure: %q", res.Error)
		}
		t.Logf("error: %s", res.Error)
	})
}

func dockerdSkipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED UNDER -short: needs the docker client only, but belongs to the daemon tests")
	}
}

// watchWriter closes seen once want has been written.
type watchWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// TestStepKillsItsLauncher: a step that kills the launcher waiting for
// it cannot leave its processes behind: the executor's reaper runs after
// a launcher that died of a signal.
func TestStepKillsItsLauncher(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	ex := newExecutor(t, d, runner(t), Config{})
	s := startSession(t, ex, d.Image(), "killer1", executor.Resources{})
	_, code := runStep(t, s, "1", "sh -c 'sleep 300; :' knotless-orphan-marker &\nkill -9 $PPID\nsleep 1\n")
	if code != 137 {
		t.Errorf("exit %d, want 137 (the launcher was killed)", code)
	}
	out, _ := runStep(t, s, "2", "grep -l 'knotless-orphan-marke[r]' /proc/[0-9]*/cmdline 2>/dev/null | while read f; do echo \"left: $f\"; done; echo checked\n")
	if strings.Contains(out, "left:") || !strings.Contains(out, "checked") {
		t.Errorf("after the step: %q, want no process of it", out)
	}
}

// TestOutputOrder: a step's stdout and stderr reach the log in the order
// the step wrote them, as one pipe would give them.
func TestOutputOrder(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	ex := newExecutor(t, d, runner(t), Config{})
	s := startSession(t, ex, d.Image(), "order1", executor.Resources{})
	out, code := runStep(t, s, "1", "for i in $(seq 1 100); do echo \"out $i\"; echo \"err $i\" >&2; done\n")
	var want strings.Builder
	for i := 1; i <= 100; i++ {
		fmt.Fprintf(&want, "out %d\nerr %d\n", i, i)
	}
	if code != 0 || out != want.String() {
		t.Errorf("output (exit %d):\n%s\nwant out and err lines alternating", code, out)
	}
}

// An image in a registry nobody answers for (the daemon's own loopback,
// where nothing listens: no DNS query) ends the run at the first pull,
// with an error naming the image and the workflow (issue 35).
func TestImagePullFailsAtOnce(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	did := runner(t)
	const image = "127.0.0.1:1/knotless/unreachable:1"
	wf, err := workflow.Parse("nightly.yaml", []byte("on: push\nimage: "+image+"\nsteps: [{run: 'echo never'}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	eng := run.New(run.Config{Executor: newExecutor(t, d, did, Config{}), DefaultImage: d.Image(), Runner: did, CleanupTimeout: time.Minute})
	res := eng.Run(context.Background(), run.Request{RunID: "unreach1", Workflow: wf, Checkout: t.TempDir(), Trusted: true})
	if res.Status != run.Error || !strings.Contains(res.Error, "workflow nightly") || !strings.Contains(res.Error, "image "+image+" is not on the docker daemon and cannot be pulled") {
		t.Errorf("status %s (%s), want error naming the workflow nightly and the image %s\nlog:\n%s", res.Status, res.Error, image, res.Log)
	}
	t.Logf("an unreachable registry: %s", res.Error)
	if left := objects(t, d, did); len(left) > 0 {
		t.Errorf("left after the run:\n%s", strings.Join(left, "\n"))
	}
}

// A TCP probe reads the namespace's socket table: a port is ready once a
// socket listens on it (state 0A), over IPv4 or IPv6, and not while a
// connection to or from it is merely established.
func TestListening(t *testing.T) {
	t.Parallel()
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1B58 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:A2B0 0100007F:1B59 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0000000000000000 20 4 30 10 -1
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 3 1 0000000000000000 100 0 0 10 0
`
	for _, tt := range []struct {
		port int
		want bool
	}{{7000, true}, {8080, true}, {7001, false}, {41648, false}} {
		if got := listening(table, tt.port); got != tt.want {
			t.Errorf("listening(%d) = %v, want %v", tt.port, got, tt.want)
		}
	}
}

// A run's service containers, and its steps' own, carry its labels and
// go with it: removed by Stop, and swept with the rest of an abandoned
// run (they share the run container's network namespace, so they go
// first).
func TestServicesLeaveNothing(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	did := runner(t)
	ctx := context.Background()
	svc := []executor.Service{{Name: "listen", Image: d.Image(), Command: []string{"nc", "-ll", "-p", "7000", "-e", "echo", "pong"}, Ports: []int{7000},
		Ready: executor.Probe{TCP: 7000, Timeout: time.Minute}}}
	old := newExecutor(t, d, did, Config{})
	s, err := old.Start(ctx, executor.Spec{RunID: "svcstop", Runner: did, Image: d.Image(), Services: svc})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(objects(t, d, did)); got != 6 {
		t.Fatalf("%d objects for a run with a service, want 6:\n%s", got, strings.Join(objects(t, d, did), "\n"))
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if left := objects(t, d, did); len(left) > 0 {
		t.Errorf("after Stop:\n%s", strings.Join(left, "\n"))
	}
	if _, err := old.Start(ctx, executor.Spec{RunID: "svcgone", Runner: did, Image: d.Image(), Services: svc, StepImages: map[string]string{"2": d.Image()}}); err != nil {
		t.Fatal(err)
	}
	old.Close()
	refs, err := newExecutor(t, d, did, Config{}).Sweep(ctx, nil)
	if err != nil || len(refs) != 1 {
		t.Errorf("sweep: %v, %v; want the abandoned run", refs, err)
	}
	if left := objects(t, d, did); len(left) > 0 {
		t.Errorf("after the sweep:\n%s", strings.Join(left, "\n"))
	}
}
