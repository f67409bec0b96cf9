package archtest

import (
	"bufio"
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "knotless.dev/run/"

// core is the pure part of the runner: it must build without any client
// of the outside world, so that it stays small, testable without a
// cluster, and usable by every executor alike.
var core = []string{
	"internal/engine/run",
	"internal/rules/workflow",
	"internal/rules/class",
	"internal/executor", // the contract only; its subpackages are executors
	"internal/engine/payload",
	"internal/lib/mask",
	"internal/lib/tarstream",
	"internal/engine/caplog",
	"internal/lib/quantity",
	"internal/lib/termsafe",
}

// outside are import path prefixes of the clients the core must not
// reach, even indirectly: client-go and apimachinery, indigo (atproto),
// and the Docker/moby client.
var outside = []struct {
	what     string
	prefixes []string
}{
	{"Kubernetes (client-go, apimachinery)", []string{"k8s.io/", "sigs.k8s.io/"}},
	{"atproto (indigo)", []string{"github.com/bluesky-social/indigo"}},
	{"Docker (moby)", []string{"github.com/docker/", "github.com/moby/"}},
	{"Prometheus (client_golang)", []string{"github.com/prometheus/"}},
}

// observed are the packages the metrics observe through the small
// observer interfaces they declare (run.Observer, executor.Observer):
// the engine and the executors never import a metrics client, so the
// daemon plugs internal/observe/metrics in, and a test plugs in what it likes.
var observed = []string{
	module + "internal/engine/run",
	module + "internal/executor/docker",
	module + "internal/executor/kubernetes",
	module + "internal/executor/shell",
}

// upward are the packages above the engine: the conformance table is
// run by each executor's tests and must not pull the daemon, its state
// and checks, or the CLI into them.
var upward = []string{
	module + "internal/cli",
	module + "internal/daemon",
	module + "internal/forge/ingest",
	module + "internal/forge",
	module + "internal/forge/pdsclient",
	module + "internal/mirror",
	module + "internal/parts/checks",
	module + "internal/parts/state",
	module + "internal/kube/manifests",
	module + "internal/parts/intake",
	module + "internal/parts/scheduler",
	module + "internal/parts/lander",
	module + "internal/rules/job",
	module + "internal/parts/rig",
}

// implementations are the executors the conformance table is run
// against: the table is one for all and depends on none of them, nor
// on the client of any.
var implementations = []string{
	module + "internal/executor/docker",
	module + "internal/executor/kubernetes",
	module + "internal/executor/shell",
	module + "internal/kube/kubeexec",
	module + "internal/kube/kubecred",
}

func TestCoreImportsNoClient(t *testing.T) {
	t.Parallel()
	pkgs := make([]string, len(core))
	for i, p := range core {
		pkgs[i] = module + p
	}
	graph := importGraph(t, pkgs...)
	for _, p := range pkgs {
		for _, o := range outside {
			isOutside := func(dep string) bool {
				return slices.ContainsFunc(o.prefixes, func(prefix string) bool { return strings.HasPrefix(dep, prefix) })
			}
			if chain := importChain(graph, p, isOutside); chain != nil {
				t.Errorf("%s imports %s, but the core uses no %s: %s", p, chain[len(chain)-1], o.what, strings.Join(chain, " -> "))
			}
		}
	}
}

func TestObservedImportNoMetrics(t *testing.T) {
	t.Parallel()
	graph := importGraph(t, observed...)
	bad := func(dep string) bool {
		return dep == module+"internal/observe/metrics" || strings.HasPrefix(dep, "github.com/prometheus/")
	}
	for _, p := range observed {
		if chain := importChain(graph, p, bad); chain != nil {
			t.Errorf("%s imports %s, but it is observed through its observer interface: %s", p, chain[len(chain)-1], strings.Join(chain, " -> "))
		}
	}
}

func TestConformanceImportsNothingAbove(t *testing.T) {
	t.Parallel()
	p := module + "internal/executor/conformance"
	graph := importGraph(t, p)
	for _, up := range upward {
		if chain := importChain(graph, p, func(dep string) bool { return dep == up || strings.HasPrefix(dep, up+"/") }); chain != nil {
			t.Errorf("%s imports %s, above the engine: %s", p, up, strings.Join(chain, " -> "))
		}
	}
	for _, impl := range implementations {
		if chain := importChain(graph, p, func(dep string) bool { return dep == impl }); chain != nil {
			t.Errorf("%s imports %s, one of the executors it is run against: %s", p, impl, strings.Join(chain, " -> "))
		}
	}
	for _, o := range outside {
		isOutside := func(dep string) bool {
			return slices.ContainsFunc(o.prefixes, func(prefix string) bool { return strings.HasPrefix(dep, prefix) })
		}
		if chain := importChain(graph, p, isOutside); chain != nil {
			t.Errorf("%s imports %s, but the table uses no %s: %s", p, chain[len(chain)-1], o.what, strings.Join(chain, " -> "))
		}
	}
}

// standardOnly are small pure packages that import the standard library
// alone: what shows strangers' text on the operator's terminal has no
// dependency to trust besides it.
var standardOnly = []string{
	module + "internal/lib/termsafe",
}

func TestStandardOnlyImportsNothingElse(t *testing.T) {
	t.Parallel()
	graph := importGraph(t, standardOnly...)
	// A standard library package's path has no dot in its first element.
	notStandard := func(dep string) bool {
		first, _, _ := strings.Cut(dep, "/")
		return strings.Contains(first, ".")
	}
	for _, p := range standardOnly {
		if chain := importChain(graph, p, notStandard); chain != nil {
			t.Errorf("%s imports %s, but it uses the standard library alone: %s", p, chain[len(chain)-1], strings.Join(chain, " -> "))
		}
	}
}

// importGraph asks `go list -deps` for the packages pkgs build from (test
// files excluded: a test may compare against a client) and returns each
// one's direct imports.
func importGraph(t *testing.T, pkgs ...string) map[string][]string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		if testing.Short() {
			t.Skip("no go command on PATH")
		}
		t.Fatalf("the dependency tests need the go command: %v", err)
	}
	args := append([]string{"list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}"}, pkgs...)
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	graph := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 0 {
			graph[fields[0]] = fields[1:]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, p := range pkgs {
		if _, ok := graph[p]; !ok {
			t.Fatalf("go list did not list %s", p)
		}
	}
	return graph
}

// importChain returns the shortest chain of imports from p to a package
// bad accepts, or nil.
// leaves returns graph with the packages under prefix made leaves: a
// test that allows a library follows no chain through it, since what
// the library imports (indigo's identity uses client_golang) is its
// own choice, not the importer's.
func leaves(graph map[string][]string, prefix string) map[string][]string {
	out := make(map[string][]string, len(graph))
	for p, deps := range graph {
		if !strings.HasPrefix(p, prefix) {
			out[p] = deps
		}
	}
	return out
}

func importChain(graph map[string][]string, p string, bad func(string) bool) []string {
	prev := map[string]string{p: ""}
	queue := []string{p}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur != p && bad(cur) {
			var chain []string
			for n := cur; n != ""; n = prev[n] {
				chain = append(chain, n)
			}
			slices.Reverse(chain)
			return chain
		}
		for _, next := range graph[cur] {
			if _, seen := prev[next]; !seen {
				prev[next] = cur
				queue = append(queue, next)
			}
		}
	}
	return nil
}

// decisions are the pure decision cores of the records (the merge
// queue's, run control's): their callers do the I/O, so they import no
// executor client and nothing of the daemon, the parts (intake, run
// control, the scheduler, the lander) or the CLI.
// They read records, so atproto types are theirs to use.
var decisions = []string{
	module + "internal/rules/mergequeue",
	module + "internal/rules/control",
}

func TestDecisionCoresImportNoIO(t *testing.T) {
	t.Parallel()
	graph := leaves(importGraph(t, decisions...), "github.com/bluesky-social/indigo")
	above := []string{module + "internal/cli", module + "internal/daemon", module + "internal/forge/ingest", module + "internal/mirror", module + "internal/parts/state",
		module + "internal/parts/intake", module + "internal/parts/scheduler", module + "internal/parts/lander", module + "internal/parts/runctl"}
	for _, p := range decisions {
		for _, o := range outside {
			if o.what == "atproto (indigo)" {
				continue
			}
			isOutside := func(dep string) bool {
				return slices.ContainsFunc(o.prefixes, func(prefix string) bool { return strings.HasPrefix(dep, prefix) })
			}
			if chain := importChain(graph, p, isOutside); chain != nil {
				t.Errorf("%s imports %s, but a decision core uses no %s: %s", p, chain[len(chain)-1], o.what, strings.Join(chain, " -> "))
			}
		}
		for _, up := range above {
			if chain := importChain(graph, p, func(dep string) bool { return dep == up || strings.HasPrefix(dep, up+"/") }); chain != nil {
				t.Errorf("%s imports %s, which does the I/O it leaves to its caller: %s", p, up, strings.Join(chain, " -> "))
			}
		}
	}
}

// liveOutput are the packages of live output: the stream, its HTTP
// reads, the runner's pusher and the output service. The service runs
// on its own, away from any cluster, and the runner wires them in: none
// of them may pull an executor, a cluster or Docker client, the daemon
// or the CLI; and the runner's side never pulls the service's.
var liveOutput = []string{
	module + "internal/output",
	module + "internal/output/outputhttp",
	module + "internal/output/outputpush",
	module + "internal/output/outputservice",
}

func TestLiveOutputImportsNoExecutorOrDaemon(t *testing.T) {
	t.Parallel()
	graph := leaves(importGraph(t, liveOutput...), "github.com/bluesky-social/indigo")
	forbidden := append([]string{module + "internal/cli", module + "internal/daemon"}, implementations...)
	for _, p := range liveOutput {
		for _, f := range forbidden {
			if chain := importChain(graph, p, func(dep string) bool { return dep == f }); chain != nil {
				t.Errorf("%s imports %s: %s", p, f, strings.Join(chain, " -> "))
			}
		}
		for _, o := range outside {
			if strings.HasPrefix(o.what, "atproto") {
				continue // live output is atproto
			}
			if chain := importChain(graph, p, func(dep string) bool {
				return slices.ContainsFunc(o.prefixes, func(prefix string) bool { return strings.HasPrefix(dep, prefix) })
			}); chain != nil {
				t.Errorf("%s imports %s, but live output uses no %s: %s", p, chain[len(chain)-1], o.what, strings.Join(chain, " -> "))
			}
		}
	}
	for _, p := range liveOutput[:3] {
		svc := module + "internal/output/outputservice"
		if chain := importChain(graph, p, func(dep string) bool { return dep == svc }); chain != nil {
			t.Errorf("%s, the runner's side, imports the output service: %s", p, strings.Join(chain, " -> "))
		}
	}
}

// kubeAPIGroups are the only k8s.io/api packages the binary links:
// the groups internal/kube/kubeclient's scheme holds, and apps/v1 for the
// manifests. A process keeps resident the pages its package
// initialisation touches (docs/performance.md, "serve's memory"), so
// a group more is a decision, not a side effect of an import.
var kubeAPIGroups = []string{
	"k8s.io/api/admissionregistration/v1",
	"k8s.io/api/apps/v1",
	"k8s.io/api/authentication/v1",
	"k8s.io/api/authorization/v1",
	"k8s.io/api/batch/v1",
	"k8s.io/api/coordination/v1", // serve --replicas: the replicas' Leases (one small type)
	"k8s.io/api/core/v1",
	"k8s.io/api/networking/v1",
	"k8s.io/api/policy/v1",
	"k8s.io/api/rbac/v1",
}

// TestBinaryLinksNoClientset keeps client-go's full clientset out of
// knotless-run: k8s.io/client-go/kubernetes, its scheme and the
// discovery client (which imports that scheme) register every built-in
// API group as the process starts. The runner's client is
// internal/kube/kubeclient; tests may use the clientset.
func TestBinaryLinksNoClientset(t *testing.T) {
	t.Parallel()
	p := module[:len(module)-1] + "/cmd/knotless-run"
	graph := importGraph(t, p)
	for _, banned := range []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/kubernetes/scheme", "k8s.io/client-go/discovery"} {
		if chain := importChain(graph, p, func(dep string) bool { return dep == banned }); chain != nil {
			t.Errorf("knotless-run links %s (use internal/kube/kubeclient): %s", banned, strings.Join(chain, " -> "))
		}
	}
	for dep := range graph {
		if strings.HasPrefix(dep, "k8s.io/api/") && !slices.Contains(kubeAPIGroups, dep) {
			t.Errorf("knotless-run links %s, not one of the API groups it uses: %s", dep, strings.Join(importChain(graph, p, func(d string) bool { return d == dep }), " -> "))
		}
	}
}

// pure are the parts that decide and hold values: the records
// (internal/forge), the work an event gives (internal/rules/work), the job,
// the state, run control, the merge queue and workflows. They build and
// test with the standard library and their own kind: no network, no
// process to run, no git mirror.
var pure = []string{
	module + "internal/forge",
	module + "internal/rules/work",
	module + "internal/rules/job",
	module + "internal/parts/state",
	module + "internal/rules/control",
	module + "internal/rules/mergequeue",
	module + "internal/rules/workflow",
	module + "internal/rules/class",
}

// pureIndigo are the packages of indigo the pure parts may use: atproto
// syntax (DIDs, AT-URIs, TIDs) and atdata (blob references and bytes in
// records), which reach no network. Its other packages (the XRPC
// client, identity resolution, lexicon loading) do.
var pureIndigo = []string{
	"github.com/bluesky-social/indigo/atproto/syntax",
	"github.com/bluesky-social/indigo/atproto/atdata",
}

// network are the standard library's packages of the network and of
// running processes; net/url and net/netip are values, and allowed.
var network = []string{"net", "net/http", "crypto/tls", "os/exec"}

func TestPurePartsReachNoNetwork(t *testing.T) {
	t.Parallel()
	graph := importGraph(t, pure...)
	bad := func(dep string) bool {
		switch {
		case slices.Contains(network, dep), dep == module+"internal/mirror":
			return true
		case strings.HasPrefix(dep, "github.com/bluesky-social/indigo/"):
			return !slices.Contains(pureIndigo, dep)
		}
		return false
	}
	for _, p := range pure {
		if chain := importChain(graph, p, bad); chain != nil {
			t.Errorf("%s reaches %s, but a pure part uses no network, process or mirror: cut %s", p, chain[len(chain)-1], strings.Join(chain, " -> "))
		}
	}
}
