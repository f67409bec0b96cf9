// Package vmscript_test executes the NixOS VM test's own testScript
// (nix/tests/k3s.nix), unmodified, on this project's machines, where no
// VM runs: so the script cannot drift from the code it tests.
//
// The script comes out of k3s.nix as Nix interpolates it (eval.nix), and
// driver.py runs it with a stand-in for the NixOS test driver's Machine
// API. The node `server` is a real systemd (tests/systemd) with a network
// namespace of its own, booted with the units the server's NixOS
// configuration gives, evaluated by the real module system: the module's
// knotless-run units, the PLC stub (nix/tests/plc.py) and the PDS
// (services.bluesky-pds, here the npm @atproto/pds of tests/pds). Its
// /nix/store holds the store objects the evaluation wrote (forge.py,
// plc.py, the pushed trees, probe.yaml, the settings file). `k3s kubectl`
// is kubectl against the test cluster (k3s.py), and `agent` is capacity
// on the cluster's node, its Node a label there (so the script's node
// counts are the cluster's). What this cannot show: the VM's kernel and
// network, k3s itself, NixOS's boot and activation (driver.py says more).
//
// TestVMScript runs the script, then the script with each of the fixes
// that made it pass reverted (and with each mistake a node count guards
// against made), and checks that each fails at the line the real VM test
// would fail at.
package vmscript_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/pds"
	systemdtest "knotless.dev/run/tests/systemd"
)

func TestMain(m *testing.M) { clustertest.Main(m) }

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// The image the VM test's k3s loads (services.k3s.images) and its runs
// and probe pods use with imagePullPolicy Never.
const vmImage = "test.local/runner:local"

// A fix the script needed, and where the script fails without it.
type revert struct {
	name    string
	file    string // under nix/
	fixed   string // text of the fix, once in file
	broken  string // what was there before
	failsAt string // in the script line the failure is reported at
	capAt   string // the line whose waits are capped, if not failsAt (a wait in a function the failsAt line calls)
	cause   string // in the runner's journal, where the daemon says why ("": the script's own assertion says it)
}

// countWait is the wait of count_nodes in k3s.nix, the line a node count
// that must wait fails at.
const countWait = `server.wait_until_succeeds(f'test "$({run_nodes} | wc -l)" -eq {want}', timeout=timeout)`

var reverts = []revert{
	{
		name: "local-source",
		file: "tests/k3s.nix",
		fixed: `            # The repository's source is a bare repository on this machine
            # (file:///srv/git/hello.git): the daemon refuses local sources
            # unless told otherwise.
            "allow-local-sources" = true;
`,
		broken: "",
		// The push is refused, so no run starts and no pod appears.
		failsAt: `server.wait_until_succeeds("k3s kubectl -n knotless-runs get pods -o name | grep -q .", timeout=300)`,
		cause:   "local paths and file:// are refused",
	},
	{
		name:   "plc-path",
		file:   "tests/plc.py",
		fixed:  `return [unquote(p) for p in path.split("?", 1)[0].strip("/").split("/")]`,
		broken: `return path.strip("/").split("/")`,
		// The runner signs in at its PDS's URL, so it starts; it cannot
		// resolve the owner's DID, so it cannot read the repository.
		failsAt: `server.wait_until_succeeds("k3s kubectl -n knotless-runs get pods -o name | grep -q .", timeout=300)`,
		cause:   "PLC directory 404",
	},
	{
		name: "show-order",
		file: "tests/k3s.nix",
		fixed: `        # -P A,B prints the values in systemd's order of the properties, not
        # in the order asked: read KEY=VALUE lines instead.
        state = dict(
            line.split("=", 1)
            for line in server.succeed("systemctl show -p ActiveState,SubState,NRestarts knotless-run").splitlines()
        )
        assert state == {"ActiveState": "active", "SubState": "running", "NRestarts": "0"}, state
`,
		broken: `        assert server.succeed("systemctl show -P ActiveState,SubState,NRestarts knotless-run").split() == [
            "active",
            "running",
            "0",
        ]
`,
		failsAt: `assert server.succeed("systemctl show -P ActiveState,SubState,NRestarts knotless-run").split() == [`,
	},
	// The node counts of scale to zero, each made to fail by the mistake
	// it guards against; the counts are read from the cluster (k3s.py).
	{
		// The agent boots with the server: the cluster is never at zero.
		name:    "agent-at-boot",
		file:    "tests/k3s.nix",
		fixed:   "    server.start()\n",
		broken:  "    start_all()\n",
		failsAt: `count_nodes("before the agent joins", 0)`,
	},
	{
		// The agent never joins: no node for the run.
		name: "agent-never-joins",
		file: "tests/k3s.nix",
		fixed: `        agent.start()
        agent.wait_for_unit("k3s.service")
        # The run starts on the agent only with its image in the agent's
        # containerd (nothing can be pulled in the VM): wait for k3s's
        # import of services.k3s.images, as nixpkgs' own k3s tests do, so
        # that a missing import fails here and says so.
        agent.wait_until_succeeds(
            "k3s crictl img -o json | jq -e '[.images[].repoTags[]] | index(\"test.local/runner:local\") != null'",
            timeout=120,
        )
`,
		broken:  "",
		failsAt: `count_nodes("while a run needs one", 1, timeout=300)`,
		capAt:   countWait,
	},
	{
		// A node left behind: the agent shuts down without being drained
		// and deleted, and its Node stays.
		name: "node-left-behind",
		file: "tests/k3s.nix",
		fixed: `        kubectl("drain agent --ignore-daemonsets --delete-emptydir-data --timeout=120s")
        kubectl("delete node agent")
`,
		broken:  "",
		failsAt: `count_nodes("after the drain", 0)`,
	},
}

// revertWait is how long a run with a fix reverted waits at the line
// it must fail at.
const revertWait = 60 * time.Second

func capLine(r *revert) string {
	if r == nil {
		return ""
	}
	if r.capAt != "" {
		return r.capAt
	}
	return r.failsAt
}

// TestVMScript runs the VM test's script on the stand-in, and again with
// each fix of reverts undone.
func TestVMScript(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED UNDER -short: this test runs the NixOS VM test's script on a real systemd (systemd-nspawn, root), a PDS and the test cluster")
	}
	lib := nixpkgsLib(t)
	if _, err := exec.LookPath("nix-instantiate"); err != nil {
		t.Fatal("nix-instantiate not found: install Debian's nix-bin (tests/run-all.sh does, as tests/nix/check.sh)")
	}
	if err := pds.Installed(); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: this test boots a throwaway systemd with systemd-nspawn and needs root")
	}
	c := clustertest.Start(t)
	s := &standin{lib: lib, binary: buildBinary(t)}
	tini, err := clustertest.LibraryClosure("/usr/bin/tini")
	if err != nil {
		t.Fatal(err)
	}
	tini["/bin/tini"] = "/usr/bin/tini"
	// The VM's image is tini and busybox with sleep as its entrypoint
	// (k3s.nix, mkImage): the same here, from the host's files.
	c.BuildImage(t, clustertest.Image{
		Name:       vmImage,
		Files:      tini,
		Busybox:    true,
		Entrypoint: []string{"/bin/tini", "--", "/bin/sleep", "inf"},
	})

	t.Run("script", func(t *testing.T) {
		t.Parallel()
		got := s.run(t, nil)
		if !got.OK {
			t.Fatalf("the VM test's script failed at line %d (%s), in the statement at line %d (%s): %s",
				got.Innermost.Line, got.Innermost.Text, got.Toplevel.Line, got.Toplevel.Text, got.Error)
		}
		t.Logf("the VM test's script passed in %.0f s; %s", got.Seconds, strings.Join(got.NodeCounts, "; "))
		if len(got.NodeCounts) < 4 {
			t.Errorf("the script logged %d node count lines, want one per stage and the summary: %q", len(got.NodeCounts), got.NodeCounts)
		}
	})
	for _, r := range reverts {
		t.Run("without-fix/"+r.name, func(t *testing.T) {
			t.Parallel()
			got := s.run(t, &r)
			if got.OK {
				t.Fatalf("with the fix %s reverted, the script passed", r.name)
			}
			if !strings.Contains(got.Innermost.Text, r.failsAt) && !strings.Contains(got.Toplevel.Text, r.failsAt) {
				t.Fatalf("with the fix %s reverted, the script failed at line %d (%s), statement at line %d (%s): %s; want it to fail at %s",
					r.name, got.Innermost.Line, got.Innermost.Text, got.Toplevel.Line, got.Toplevel.Text, got.Error, r.failsAt)
			}
			if r.cause != "" && !strings.Contains(got.Journal, r.cause) {
				t.Fatalf("with the fix %s reverted, the runner's journal does not say %q", r.name, r.cause)
			}
			t.Logf("without the fix %s the script fails at line %d: %s (%s)", r.name, got.Innermost.Line, got.Innermost.Text, got.Error)
		})
	}
}

// nixpkgsLib finds nixpkgs' lib as tests/nix/lib.sh does ($NIXPKGS_LIB,
// then ../shared/nixpkgs-lib beside the repository), and skips t loudly
// when there is none: the server's configuration cannot be evaluated.
func nixpkgsLib(t *testing.T) string {
	t.Helper()
	var candidates []string
	if d := os.Getenv("NIXPKGS_LIB"); d != "" {
		candidates = append(candidates, d, filepath.Join(d, "lib"))
	}
	candidates = append(candidates, filepath.Join(repoRoot(), "..", "shared", "nixpkgs-lib", "lib"))
	for _, d := range candidates {
		if _, err := os.Stat(filepath.Join(d, "default.nix")); err == nil {
			abs, err := filepath.Abs(d)
			if err != nil {
				t.Fatal(err)
			}
			return abs
		}
	}
	t.Skip("!!! SKIPPED: no nixpkgs lib (NIXPKGS_LIB, ../shared/nixpkgs-lib): the VM test's server configuration cannot be evaluated, so its script was NOT run")
	return ""
}

func buildBinary(t *testing.T) []byte {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "knotless-run")
	build := exec.Command("go", "build", "-o", bin, "./cmd/knotless-run")
	build.Dir = repoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build knotless-run: %v\n%s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type standin struct {
	lib    string
	binary []byte
}

// result is what driver.py writes.
type result struct {
	OK        bool
	Error     string
	Innermost struct {
		Line int
		Text string
	}
	Toplevel struct {
		Line int
		Text string
	}
	Seconds    float64
	Journal    string   `json:"-"` // the runner's, as journalctl -o json prints it
	NodeCounts []string `json:"-"` // the script's node counts, as it logged them
}

// evaluation is what eval.nix gives.
type evaluation struct {
	TestScript   string
	Nodes        []string
	HostPackages []string
	Server       struct {
		FailedAssertions []string
		Units            map[string]string
		BootUnits        []string
		Users            map[string]struct{ Group, Home string }
		Groups           []string
		SystemPackages   []string
		SettingsFile     string
	}
}

// Where the stand-in's own files are in the machine.
const (
	optPath     = systemdtest.OptPath
	nodeModules = "/opt/bluesky-pds/node_modules"
	// The host's packages (eval.nix, hostPackages): hostPath/NAME/bin.
	hostPath = "/opt/knotless-host"
)

// debianPackages are the host's packages that stand for each of
// eval.nix's hostPackages: the tools they install are that package's bin.
var debianPackages = map[string][]string{
	"python3":   {"python3-minimal", "python3"},
	"git":       {"git"},
	"jq":        {"jq"},
	"coreutils": {"coreutils"},
	"findutils": {"findutils"},
	"gnugrep":   {"grep"},
	"gnused":    {"sed"},
	"systemd":   {"systemd"},
}

// hostPackages makes under dir, for each package of names, a bin that
// links to the tools its Debian packages install (dpkg -L) and to no
// other: so a unit's PATH holds what the VM's would, not all of /usr/bin.
func hostPackages(t *testing.T, dir string, names []string) {
	t.Helper()
	for _, name := range names {
		debs, ok := debianPackages[name]
		if !ok {
			t.Fatalf("eval.nix names the host package %s, which debianPackages does not map", name)
		}
		bin := filepath.Join(dir, name, "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, deb := range debs {
			out, err := exec.Command("dpkg", "-L", deb).Output()
			if err != nil {
				t.Fatalf("dpkg -L %s (for %s): %v", deb, name, err)
			}
			for f := range strings.Lines(string(out)) {
				f = strings.TrimSpace(f)
				switch filepath.Dir(f) {
				case "/bin", "/sbin", "/usr/bin", "/usr/sbin":
				default:
					continue
				}
				if fi, err := os.Stat(f); err != nil || fi.IsDir() {
					continue
				}
				link := filepath.Join(bin, filepath.Base(f))
				if err := os.Symlink(f, link); err != nil && !os.IsExist(err) {
					t.Fatal(err)
				}
			}
		}
	}
}

// unitPath is the PATH= of a rendered unit.
func unitPath(t *testing.T, unit string) string {
	t.Helper()
	for l := range strings.Lines(unit) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), `Environment="PATH=`); ok {
			return strings.TrimSuffix(v, `"`)
		}
	}
	t.Fatalf("the unit sets no PATH:\n%s", unit)
	return ""
}

// k3sUnit stands in for k3s.service: active once the test cluster's API
// server answers.
const k3sUnit = `[Unit]
Description=k3s (the VM script's stand-in: the test cluster's API server answers)
After=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=` + optPath + `/k3s/bin/k3s vmscript-wait-apiserver

[Install]
WantedBy=multi-user.target
`

// run runs the script of a copy of nix/ (with r reverted) on a machine of
// its own, with namespaces of its own on the test cluster.
func (s *standin) run(t *testing.T, r *revert) result {
	t.Helper()
	dir := t.TempDir()
	nixDir := filepath.Join(dir, "nix")
	if err := os.CopyFS(nixDir, os.DirFS(filepath.Join(repoRoot(), "nix"))); err != nil {
		t.Fatal(err)
	}
	if r != nil {
		p := filepath.Join(nixDir, r.file)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), r.fixed); n != 1 {
			t.Fatalf("nix/%s holds the fix %s %d times, want once: update reverts in %s", r.file, r.name, n, "tests/vmscript/vmscript_test.go")
		}
		if err := os.WriteFile(p, []byte(strings.Replace(string(b), r.fixed, r.broken, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The VM's namespaces knotless-runs and default are these two here.
	runs, def := clustertest.Start(t), clustertest.Start(t)
	ctx := context.Background()
	for _, c := range []*clustertest.Cluster{runs, def} {
		// No capacity until the agent joins; none left after the test.
		if err := c.RemoveCapacity(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := c.RemoveCapacity(context.Background()); err != nil {
				t.Errorf("unlabel the node: %v", err)
			}
		})
	}
	// The agent's Node is the cluster's node while it carries this label
	// (k3s.py); none may stay after the test.
	agentLabel := "agent.vmscript.knotless.dev/" + runs.Namespace
	t.Cleanup(func() {
		patch := []byte(`{"metadata":{"labels":{"` + agentLabel + `":null}}}`)
		if _, err := runs.Clientset.CoreV1().Nodes().Patch(context.Background(), runs.Info.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Errorf("unlabel the node: %v", err)
		}
	})

	ev, store := s.evaluate(t, dir, runs.Namespace)
	if len(ev.Server.FailedAssertions) > 0 {
		t.Fatalf("the server's configuration fails the module's assertions: %v", ev.Server.FailedAssertions)
	}

	units := map[string]string{"k3s.service": k3sUnit}
	for name, text := range ev.Server.Units {
		units[name] = text
	}
	// nixpkgs' bin/pds names its node by store path: the unit's PATH has
	// none.
	pdsWrapper := "#!/bin/sh\nNODE_PATH=" + nodeModules + " exec /usr/bin/node " + optPath + "/bluesky-pds/lib/pds.js\n"
	modules, err := filepath.EvalSymlinks(filepath.Join(pds.Dir(), "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	namespaces := map[string]string{"knotless-runs": runs.Namespace, "default": def.Namespace}
	k3sConfig, err := json.Marshal(map[string]any{"node": runs.Info.NodeName, "namespaces": namespaces})
	if err != nil {
		t.Fatal(err)
	}
	// The agent's commands run on this host, with k3s.py as its k3s: its
	// crictl lists the cluster node's images.
	agentDir := filepath.Join(dir, "agent")
	agentConfig, err := json.Marshal(map[string]any{
		"node": runs.Info.NodeName, "namespaces": namespaces,
		"kubeconfig": runs.Kubeconfig, "containerdSock": runs.Info.ContainerdSock,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(agentDir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(agentDir, "bin", "k3s"), read(t, "k3s.py"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(agentDir, "config.json"), agentConfig, 0o644); err != nil {
		t.Fatal(err)
	}
	hostDir := filepath.Join(dir, "host")
	hostPackages(t, hostDir, ev.HostPackages)
	m := systemdtest.Boot(t, systemdtest.Options{
		Units: units,
		Files: map[string][]byte{
			"bin/knotless-run":       s.binary,
			"k3s/bin/k3s":            read(t, "k3s.py"),
			"k3s/config.json":        k3sConfig,
			"bluesky-pds/bin/pds":    []byte(pdsWrapper),
			"bluesky-pds/lib/pds.js": read(t, "pds.js"),
		},
		BindsRO:        []string{store + ":/nix/store", modules + ":" + nodeModules, hostDir + ":" + hostPath},
		PrivateNetwork: true,
	})

	// What NixOS makes of the configuration before the test starts: its
	// users, /etc/hosts, k3s's admin kubeconfig.
	var sysusers strings.Builder
	for _, g := range ev.Server.Groups {
		fmt.Fprintf(&sysusers, "g %s -\n", g)
	}
	for name, u := range ev.Server.Users {
		fmt.Fprintf(&sysusers, "u %s - - %s\n", name, u.Home)
		if u.Group != "" && u.Group != name {
			fmt.Fprintf(&sysusers, "m %s %s\n", name, u.Group)
		}
	}
	writeIn(t, m, "/etc/sysusers.d/vm.conf", []byte(sysusers.String()), "0644")
	writeIn(t, m, "/etc/hosts", []byte("127.0.0.1 localhost\n::1 localhost\n127.0.0.2 server\n"), "0644")
	writeIn(t, m, "/etc/rancher/k3s/k3s.yaml", adminKubeconfig(t, runs.Kubeconfig, def.Namespace), "0600")
	if out, err := m.Exec(ctx, "systemd-sysusers"); err != nil {
		t.Fatalf("systemd-sysusers: %v\n%s", err, out)
	}

	// The runner's PATH in the machine finds git and NixOS's default
	// tools, and none of the host's others: the VM has none of them.
	runnerPath := unitPath(t, ev.Server.Units["knotless-run.service"])
	for _, tool := range []string{"git", "mv", "find", "grep", "sed", "systemctl"} {
		if out, err := m.Exec(ctx, "/usr/bin/env", "PATH="+runnerPath, "/bin/sh", "-c", `command -v "$0"`, tool); err != nil {
			t.Fatalf("the runner's PATH (%s) has no %s: %v\n%s", runnerPath, tool, err, out)
		}
	}
	for _, tool := range []string{"python3", "node", "tar", "curl", "bash"} {
		if out, err := m.Exec(ctx, "/usr/bin/env", "PATH="+runnerPath, "/bin/sh", "-c", `command -v "$0"`, tool); err == nil {
			t.Fatalf("the runner's PATH (%s) has %s (%s), which the VM's has not", runnerPath, tool, strings.TrimSpace(string(out)))
		}
	}

	// The script's PATH: the system packages' bin, then the host's.
	var path []string
	for _, p := range ev.Server.SystemPackages {
		path = append(path, p+"/bin")
	}
	path = append(path, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

	scriptFile := filepath.Join(dir, "testScript.py")
	if err := os.WriteFile(scriptFile, []byte(ev.TestScript), 0o644); err != nil {
		t.Fatal(err)
	}
	var clusterNodes []string
	for _, n := range ev.Nodes {
		if n != "server" {
			clusterNodes = append(clusterNodes, n)
		}
	}
	resultFile := filepath.Join(dir, "result.json")
	cfg, err := json.Marshal(map[string]any{
		"script": scriptFile,
		"result": resultFile,
		"machines": map[string]any{"server": map[string]any{
			"leader":    m.Leader(),
			"path":      strings.Join(path, ":"),
			"bootUnits": append(ev.Server.BootUnits, "k3s"),
		}},
		"clusterNodes":    clusterNodes,
		"clusterNodesVia": "server",
		"clusterNodePath": filepath.Join(agentDir, "bin") + ":/usr/sbin:/usr/bin:/sbin:/bin",
		// With a fix reverted, a wait at the line the script must fail
		// at waits revertWait, not the script's 300 s: the failure is
		// certain, and the runner's journal must still say why.
		"capLine":    capLine(r),
		"capSeconds": revertWait / time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "driver.json")
	if err := os.WriteFile(cfgFile, cfg, 0o644); err != nil {
		t.Fatal(err)
	}

	logFile := filepath.Join(dir, "driver.log")
	drive(t, cfgFile, logFile)
	var got result
	b, err := os.ReadFile(resultFile)
	if err == nil {
		err = json.Unmarshal(b, &got)
	}
	if err != nil {
		t.Fatalf("the driver wrote no result: %v\n%s", err, tail(logFile, 80))
	}
	out, err := m.Exec(ctx, "journalctl", "--no-pager", "-o", "json", "-u", "knotless-run.service")
	if err != nil {
		t.Fatalf("the runner's journal: %v", err)
	}
	got.Journal = string(out)
	for l := range strings.Lines(tail(logFile, 1<<20)) {
		if strings.HasPrefix(l, "node count") {
			got.NodeCounts = append(got.NodeCounts, strings.TrimSpace(l))
		}
	}
	if !got.OK && r == nil || t.Failed() {
		t.Logf("driver log (last 150 lines):\n%s", tail(logFile, 150))
	}
	return got
}

// evaluate runs eval.nix on the copy of nix/ in dir and fills the
// machine's /nix/store; it returns the evaluation and that store.
func (s *standin) evaluate(t *testing.T, dir, runsNamespace string) (evaluation, string) {
	t.Helper()
	nixStore := filepath.Join(dir, "nix-store")
	cmd := exec.Command("nix-instantiate", "--option", "substituters", "", "--store", nixStore, "--read-write-mode",
		"--eval", "--strict", "--json", filepath.Join(repoRoot(), "tests", "vmscript", "eval.nix"),
		"--arg", "lib", "import "+s.lib,
		"--arg", "k3s", filepath.Join(dir, "nix", "tests", "k3s.nix"),
		"--arg", "module", filepath.Join(dir, "nix", "module.nix"),
		"--argstr", "runsNamespace", runsNamespace,
		"--argstr", "optPath", optPath,
		"--argstr", "hostPath", hostPath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("evaluate the VM test (tests/vmscript/eval.nix): %v\n%s", err, stderr.Bytes())
	}
	var ev evaluation
	if err := json.Unmarshal(out, &ev); err != nil {
		t.Fatalf("evaluate the VM test: %v", err)
	}

	// The machine's /nix/store: the evaluation's store objects, each
	// writeTextDir's manifest (a file there) unpacked into its directory.
	from := filepath.Join(nixStore, "nix", "store")
	to := filepath.Join(dir, "machine-store")
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(to, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(to, e.Name())
		if !strings.HasSuffix(e.Name(), ".textdir") {
			if err := os.WriteFile(dst, b, 0o444); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var td struct{ Path, Text string }
		if err := json.Unmarshal(b, &td); err != nil {
			t.Fatalf("store object %s: %v", e.Name(), err)
		}
		if !filepath.IsLocal(td.Path) {
			t.Fatalf("store object %s: path %q", e.Name(), td.Path)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, td.Path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, td.Path), []byte(td.Text), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(to, strings.TrimPrefix(ev.Server.SettingsFile, "/nix/store/"))); err != nil {
		t.Fatalf("the settings file is not in the store: %v", err)
	}
	return ev, to
}

// drive runs driver.py with cfgFile, its log going to logFile.
func drive(t *testing.T, cfgFile, logFile string) {
	t.Helper()
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", filepath.Join(repoRoot(), "tests", "vmscript", "driver.py"), cfgFile)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Run(); err != nil {
		t.Fatalf("driver.py: %v\n%s", err, tail(logFile, 80))
	}
}

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "tests", "vmscript", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeIn writes a file in the machine as root.
func writeIn(t *testing.T, m *systemdtest.Machine, name string, data []byte, mode string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd, err := m.Command(ctx, "sh", "-c", `mkdir -p "$(dirname "$1")" && umask 077 && cat > "$1" && chmod "$2" "$1"`, "sh", name, mode)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = bytes.NewReader(data)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("write %s in the machine: %v\n%s", name, err, out)
	}
}

// adminKubeconfig is the cluster's admin kubeconfig with its files
// embedded and namespace as its context's namespace: k3s's
// /etc/rancher/k3s/k3s.yaml on the stand-in.
func adminKubeconfig(t *testing.T, path, namespace string) []byte {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := clientcmdapi.FlattenConfig(cfg); err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Contexts {
		c.Namespace = namespace
	}
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(io.Reader(f))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
