package latency

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/forgeworld"
)

// envServeRuns sets how many runs TestServeRunsInFlight holds in flight
// (20 by default; the figure is 500). Set, serve is knotless-run
// built as the package builds it (buildBinary), so its RSS is the
// binary's own; unset, it is this test binary (serveHelper), which
// spares make test a build without cgo and with -trimpath.
const envServeRuns = "KNOTLESS_CAPACITY_SERVE_RUNS"

// nowhereClass is a resource class whose node selector matches no node:
// its runs' pods wait Unschedulable.
const nowhereClass = "nowhere:node-selector=knotless.test/no-such-node=true"

// TestServeRunsInFlight is TestRunsInFlight
// (internal/executor/kubernetes) through `serve`: a serve process of
// its own on the Kubernetes executor, the real PDS, the capacity rig.
// The owner pushes N commits, each on a branch of its own (none
// supersedes another), whose runs stay in flight: half on fake nodes
// (their pods bound and Pending: kwok starts no container), half in a
// class that selects no node (Unschedulable). With all N in flight,
// probe pushes whose runs can schedule come one at a time, and each
// one's pickup is read from serve's own log: from the refUpdate
// record's write returning (and from the event serve received) to the
// Job created. Then the owner cancels every run by its cancel record.
//
// Asserted: every run gets in flight (its pod seen bound to a fake node
// or unschedulable by serve, and so by the API server), every push has
// one check, running, and each probe its Job; each check ends
// cancelled; nothing of the runner's is left (Job, pod, budget,
// ConfigMap). Logged: serve's RSS (VmRSS, VmHWM, RssAnon of its
// /proc/PID/status) idle, with N in flight and with the probes, and the
// pickup's p50, p99 and max.
//
//	KNOTLESS_CAPACITY_SERVE_RUNS=500 go test -count=1 -timeout 60m -run '^TestServeRunsInFlight$' -v ./tests/latency
func TestServeRunsInFlight(t *testing.T) {
	runs := 20
	if s := os.Getenv(envServeRuns); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 2 {
			t.Fatalf("%s=%q: want a count of 2 or more", envServeRuns, s)
		}
		runs = n
	}
	bound, probes := (runs+1)/2, max(5, runs/10) // on the rig: every other run, and the probes
	bin, process := "", "this test binary as knotless-run"
	if os.Getenv(envServeRuns) != "" {
		bin, process = buildBinary(t), "knotless-run built as the package builds it"
	}
	// A few fake nodes more than pods of the rig: the scheduler weighs
	// the pods' anti-affinity against pods it has yet to bind, and may
	// find no node for one while as many nodes as pods remain.
	c, rig := clustertest.StartKwok(t, bound+probes+max(1, (bound+probes)/20))
	srv := startPDS(t)
	w := forgeworld.New(t, srv, forgeworld.Options{App: "capacity"})
	qps := os.Getenv("KNOTLESS_CAPACITY_QPS")
	extra := []string{"--concurrency", strconv.Itoa(runs + probes), "--schedule-timeout", "2h", "--log-blobs", "never",
		"--class", clustertest.KwokClass, "--class", nowhereClass, "--metrics-listen", "127.0.0.1:0"}
	if qps != "" {
		extra = append(extra, "--kube-qps", qps)
	}
	d := startServe(t, w, c, bin, extra)
	pid := d.cmd.Process.Pid
	listening, ok := d.logs.wait(time.Time{}, time.Minute, func(r record) bool { return r.Msg == "serving metrics" })
	if !ok {
		t.Fatalf("serve: no metrics address\n%s", d.logs.text())
	}
	metricsURL, _ := listening.Fields["address"].(string)
	// mem is serve's memory: the kernel's figures, and the Go runtime's
	// from serve's metrics (what of the RSS is heap in use, and where
	// the collector lets it grow to before it collects).
	type mem struct {
		rss, hwm, anon      float64
		heapInuse, nextGC   float64
		goroutines, running float64
	}
	memNow := func() mem {
		m := scrape(t, metricsURL)
		return mem{memMB(t, pid, "VmRSS"), memMB(t, pid, "VmHWM"), memMB(t, pid, "RssAnon"),
			m["go_memstats_heap_inuse_bytes"] / (1 << 20), m["go_memstats_next_gc_bytes"] / (1 << 20), m["go_goroutines"], m["knotless_run_runs_going"]}
	}
	idle := memNow()

	sel := kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(w.Runner.DID.String())
	// The cluster is left as it was found, failed or not: the owner's
	// cancels are the test's, so a failure half-way deletes the runs'
	// objects itself, before the rig and the namespace go.
	t.Cleanup(func() {
		if t.Failed() {
			deleteRunObjects(t, c, sel)
		}
	})

	var pushes []*capPush
	push := func(name, class string) *capPush {
		p := &capPush{branch: "refs/heads/" + name}
		wf := "on: [push]\nclass: " + class + "\nsteps:\n  - name: never\n    run: 'true'\n"
		p.commit = w.Src.Commit(name, map[string]string{".knotless/workflows/ci.yaml": wf})
		p.sent = time.Now()
		p.uri = w.Put(w.Owner, forge.CollectionRefUpdate, "", forge.RefUpdate{Type: forge.CollectionRefUpdate, Repo: w.RepoURI.String(),
			Ref: p.branch, Old: "", New: p.commit, CreatedAt: forge.Now()})
		p.written = time.Now()
		p.key = forge.CheckKey(forge.Subject{Repo: w.RepoURI.String(), Commit: p.commit, Ref: p.branch, Event: p.uri.String(), Kind: forge.KindPush}, "ci")
		pushes = append(pushes, p)
		return p
	}

	t0 := time.Now()
	for i := range runs {
		class := "nowhere"
		if i%2 == 0 {
			class = "kwok"
		}
		push(fmt.Sprintf("cap-%04d", i), class)
	}
	written := time.Since(t0)
	d.waitInFlight(t, pushes, time.Duration(runs)*2*time.Second+3*time.Minute)
	fill := time.Since(t0)
	inFlight := memNow()

	hold := 5 * time.Second
	if os.Getenv(envServeRuns) != "" {
		hold = 30 * time.Second
	}
	time.Sleep(hold)
	held := memNow()

	// Probes: one at a time, each left in flight.
	var fromWrite, fromEvent, toListed, listedToJob []time.Duration
	for i := range probes {
		p := push(fmt.Sprintf("probe-%03d", i), "kwok")
		runID := d.runOf(t, p, 2*time.Minute)
		job, ok := d.logs.wait(p.sent, 2*time.Minute, func(r record) bool { return r.Msg == "job created" && r.Fields["run"] == runID })
		if !ok {
			t.Fatalf("probe %d: no Job after 2 minutes\n%s", i, d.logs.text())
		}
		ev, ok := d.logs.wait(p.sent, time.Minute, func(r record) bool {
			return r.Msg == "records changed" && r.Fields["collection"] == forge.CollectionRefUpdate
		})
		if !ok {
			t.Fatalf("probe %d: no event received in the serve log\n%s", i, d.logs.text())
		}
		// The reconcile the event woke: its listing done.
		listed, ok := d.logs.wait(ev.Time, time.Minute, func(r record) bool { return r.Msg == "listed" })
		if !ok {
			t.Fatalf("probe %d: no listing after the event in the serve log\n%s", i, d.logs.text())
		}
		fromWrite = append(fromWrite, job.Time.Sub(p.written.Truncate(time.Millisecond)))
		fromEvent = append(fromEvent, job.Time.Sub(ev.Time))
		toListed = append(toListed, listed.Time.Sub(ev.Time))
		listedToJob = append(listedToJob, job.Time.Sub(listed.Time))
	}
	d.waitInFlight(t, pushes, 3*time.Minute)
	withProbes := memNow()

	t.Logf("serve in flight: %s; %d runs (%d on %d fake nodes, %d unschedulable) + %d probes; --concurrency %d, --kube-qps %s",
		process, runs, bound, rig.Nodes, runs-bound, probes, runs+probes, orDefault(qps, "50 (the default)"))
	t.Logf("serve in flight: %d refUpdates written in %s; all %d in flight %s after the first write", runs, written.Round(time.Millisecond), runs, fill.Round(time.Millisecond))
	for _, m := range []struct {
		what string
		m    mem
	}{{"idle", idle}, {fmt.Sprintf("%d in flight", runs), inFlight}, {fmt.Sprintf("held %s", hold), held}, {fmt.Sprintf("%d in flight", runs+probes), withProbes}} {
		t.Logf("serve in flight: %s: VmRSS %.1f MiB, VmHWM %.1f MiB, RssAnon %.1f MiB; Go heap in use %.1f MiB, next collection at %.1f MiB; %.0f goroutines, %.0f runs going",
			m.what, m.m.rss, m.m.hwm, m.m.anon, m.m.heapInuse, m.m.nextGC, m.m.goroutines, m.m.running)
	}
	t.Logf("serve in flight: pickup of %d probes, refUpdate written → Job created: p50 %s, p99 %s, max %s", probes,
		percentile(fromWrite, 0.5), percentile(fromWrite, 0.99), slices.Max(fromWrite))
	t.Logf("serve in flight: pickup of %d probes, event received → Job created: p50 %s, p99 %s, max %s", probes,
		percentile(fromEvent, 0.5), percentile(fromEvent, 0.99), slices.Max(fromEvent))
	t.Logf("serve in flight: of which event received → listed: p50 %s, p99 %s; listed → Job created: p50 %s, p99 %s",
		percentile(toListed, 0.5), percentile(toListed, 0.99), percentile(listedToJob, 0.5), percentile(listedToJob, 0.99))

	// The pods as the API server has them: the rig's runs and the
	// probes bound to fake nodes, the others unschedulable. The
	// scheduler may first find no node for a pod of the rig and bind it
	// when it tries again (at the latest after 5 minutes, its
	// podMaxInUnschedulablePodsDuration).
	var pods podCount
	for end := time.Now().Add(6 * time.Minute); ; time.Sleep(2 * time.Second) {
		pods = countPods(t, c, sel)
		if pods.onFake == bound+probes && pods.unschedulable == runs-bound || time.Now().After(end) {
			break
		}
	}
	t.Logf("serve in flight: pods: %d on fake nodes, %d unschedulable", pods.onFake, pods.unschedulable)
	if pods.onFake != bound+probes || pods.unschedulable != runs-bound {
		t.Errorf("pods: %d on fake nodes, %d unschedulable; want %d and %d; pods of the rig unschedulable: %s",
			pods.onFake, pods.unschedulable, bound+probes, runs-bound, strings.Join(pods.rigUnschedulable, "; "))
	}
	if int(withProbes.running) != runs+probes {
		t.Errorf("serve's metrics say %.0f runs going, want %d", withProbes.running, runs+probes)
	}
	// Every push has its check, one record, running: none dropped.
	checks := checksByKey(t, w)
	for _, p := range pushes {
		if ch, ok := checks[p.key]; !ok || ch.Status != forge.StatusRunning || ch.Subject.Commit != p.commit {
			t.Errorf("push %s: check %+v, want running on %s", p.branch, ch, p.commit)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The owner cancels every run; each check ends cancelled and the
	// runner deletes what it made.
	t1 := time.Now()
	for _, p := range pushes {
		rec := forge.Cancel{Type: forge.CollectionCancel, Check: p.key, Runner: w.Runner.DID.String(), Repo: w.RepoURI.String(), CreatedAt: forge.Now()}
		w.Put(w.Owner, forge.CollectionCancel, forge.CancelKey(rec.Runner, p.key), rec)
	}
	deadline := time.Now().Add(time.Duration(len(pushes))*time.Second + 3*time.Minute)
	for {
		checks = checksByKey(t, w)
		final, bad := 0, []string{}
		for _, p := range pushes {
			ch := checks[p.key]
			if ch.Final() {
				final++
				if ch.Status != string(run.Cancelled) {
					bad = append(bad, fmt.Sprintf("%s: %s (%s)", p.branch, ch.Status, ch.Error))
				}
			}
		}
		if len(bad) > 0 {
			t.Fatalf("checks after the cancels: %s", strings.Join(bad, "; "))
		}
		if final == len(pushes) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d checks final after the cancels\n%s", final, len(pushes), d.logs.text())
		}
		time.Sleep(time.Second)
	}
	cancelled := time.Since(t1)
	left := waitNothingLeft(t, c, sel, false, 5*time.Minute)
	if left != "" {
		t.Fatalf("left in the namespace: %s", left)
	}
	after := memNow()
	if after.running != 0 {
		t.Errorf("serve's metrics say %.0f runs going once every check is cancelled, want none", after.running)
	}
	t.Logf("serve in flight: %d runs cancelled by their records, every check cancelled in %s, nothing left %s after the first cancel; then VmRSS %.1f MiB, VmHWM %.1f MiB, RssAnon %.1f MiB; Go heap in use %.1f MiB; %.0f runs going",
		len(pushes), cancelled.Round(time.Millisecond), time.Since(t1).Round(time.Millisecond), after.rss, after.hwm, after.anon, after.heapInuse, after.running)
}

// scrape reads the samples of serve's metrics at url, by name with
// their labels as written (knotless_run_check_writes_total{status="queued"}).
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape serve's metrics: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if i < 0 || strings.HasPrefix(line, "#") {
			continue
		}
		name, v := line[:i], line[i+1:]
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[name] = f
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scrape serve's metrics: %v", err)
	}
	for _, name := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_next_gc_bytes", "go_goroutines", "knotless_run_runs_going"} {
		if _, ok := out[name]; !ok {
			t.Fatalf("serve's metrics have no %s", name)
		}
	}
	return out
}

// capPush is one push of TestServeRunsInFlight.
type capPush struct {
	branch, commit, key string
	uri                 syntax.ATURI
	sent, written       time.Time // the refUpdate's write began, returned
	run                 string    // the run serve started for it
}

// runOf waits for the run serve started for p's check, and returns its
// ID.
func (d *daemon) runOf(t *testing.T, p *capPush, timeout time.Duration) string {
	t.Helper()
	if p.run != "" {
		return p.run
	}
	r, ok := d.logs.wait(p.sent, timeout, func(r record) bool { return r.Msg == "run started" && r.Fields["check"] == p.key })
	if !ok {
		t.Fatalf("push %s: no run started after %s\n%s", p.branch, timeout, d.logs.text())
	}
	p.run, _ = r.Fields["run"].(string)
	return p.run
}

// waitInFlight waits until serve has seen each push's pod bound to a
// node ("pod scheduled") or unschedulable ("pod not ready"); a run that
// ends meanwhile fails the test.
func (d *daemon) waitInFlight(t *testing.T, pushes []*capPush, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, p := range pushes {
		id := d.runOf(t, p, time.Until(deadline))
		if _, ok := d.logs.wait(p.sent, time.Until(deadline), func(r record) bool {
			return (r.Msg == "pod scheduled" || r.Msg == "pod not ready") && r.Fields["run"] == id
		}); !ok {
			t.Fatalf("push %s: run %s not in flight after %s\n%s", p.branch, id, timeout, d.logs.text())
		}
		if r, ended := d.logs.wait(p.sent, 0, func(r record) bool { return r.Msg == "run finished" && r.Fields["run"] == id }); ended {
			t.Fatalf("push %s: run %s ended while it should be in flight: %v", p.branch, id, r.Fields)
		}
	}
}

// podCount is the runner's pods bound to a fake node of the rig, those
// unschedulable, and the scheduler's word on those of the rig among
// them.
type podCount struct {
	onFake, unschedulable int
	rigUnschedulable      []string
}

// countPods counts the runner's pods bound to a fake node of the rig
// and those unschedulable; any other fails the test.
func countPods(t *testing.T, c *clustertest.Cluster, sel string) podCount {
	t.Helper()
	ctx := context.Background()
	pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := c.Clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: clustertest.KwokLabel + "=" + clustertest.KwokValue})
	if err != nil {
		t.Fatal(err)
	}
	fake := map[string]bool{}
	for _, n := range nodes.Items {
		fake[n.Name] = true
	}
	var n podCount
	for _, p := range pods.Items {
		switch {
		case fake[p.Spec.NodeName]:
			n.onFake++
		case p.Spec.NodeName == "" && clustertest.PodUnschedulable(&p):
			n.unschedulable++
			if p.Spec.NodeSelector[clustertest.KwokLabel] != "" {
				for _, cond := range p.Status.Conditions {
					if cond.Type == corev1.PodScheduled {
						n.rigUnschedulable = append(n.rigUnschedulable, p.Name+": "+cond.Message)
					}
				}
			}
		default:
			t.Errorf("pod %s on node %q, phase %s: want it on a fake node or unschedulable", p.Name, p.Spec.NodeName, p.Status.Phase)
		}
	}
	return n
}

// checksByKey lists the runner's checks by record key.
func checksByKey(t *testing.T, w *forgeworld.World) map[string]forge.Check {
	t.Helper()
	out := map[string]forge.Check{}
	for _, r := range w.Checks() {
		out[r.URI.RecordKey().String()] = r.Value
	}
	return out
}

// waitNothingLeft waits until no Job, pod, PodDisruptionBudget or
// ConfigMap of sel is left (and, with leases, no Lease: replicas'), and
// says what is left if some still is after timeout ("" when none).
func waitNothingLeft(t *testing.T, c *clustertest.Cluster, sel string, leases bool, timeout time.Duration) string {
	t.Helper()
	ctx := context.Background()
	opts := metav1.ListOptions{LabelSelector: sel}
	deadline := time.Now().Add(timeout)
	for {
		jobs, err1 := c.Clientset.BatchV1().Jobs(c.Namespace).List(ctx, opts)
		pods, err2 := c.Clientset.CoreV1().Pods(c.Namespace).List(ctx, opts)
		pdbs, err3 := c.Clientset.PolicyV1().PodDisruptionBudgets(c.Namespace).List(ctx, opts)
		cms, err4 := c.Clientset.CoreV1().ConfigMaps(c.Namespace).List(ctx, opts)
		var nLeases int
		var err5 error
		if leases {
			var ls *coordinationv1.LeaseList
			if ls, err5 = c.Clientset.CoordinationV1().Leases(c.Namespace).List(ctx, opts); err5 == nil {
				nLeases = len(ls.Items)
			}
		}
		left := ""
		switch {
		case err1 != nil || err2 != nil || err3 != nil || err4 != nil || err5 != nil:
			left = fmt.Sprintf("listing failed: %v %v %v %v %v", err1, err2, err3, err4, err5)
		case len(jobs.Items)+len(pods.Items)+len(pdbs.Items)+len(cms.Items)+nLeases > 0:
			left = fmt.Sprintf("%d Jobs, %d pods, %d disruption budgets, %d ConfigMaps, %d Leases", len(jobs.Items), len(pods.Items), len(pdbs.Items), len(cms.Items), nLeases)
		}
		if left == "" || time.Now().After(deadline) {
			return left
		}
		time.Sleep(time.Second)
	}
}

// deleteRunObjects deletes the Jobs (their pods with them) and budgets
// of sel, for a test that failed before its runs were cancelled.
func deleteRunObjects(t *testing.T, c *clustertest.Cluster, sel string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bg := metav1.DeletePropagationBackground
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Clientset.BatchV1().Jobs(c.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &bg}, metav1.ListOptions{LabelSelector: sel}); err != nil {
			t.Logf("delete the runs' Jobs: %v", err)
		}
	})
	wg.Go(func() {
		if err := c.Clientset.PolicyV1().PodDisruptionBudgets(c.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel}); err != nil {
			t.Logf("delete the runs' disruption budgets: %v", err)
		}
	})
	wg.Wait()
}

// percentile is the p-quantile of ds, to the millisecond.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.999999) - 1
	return s[max(0, min(i, len(s)-1))].Round(time.Millisecond)
}

// orDefault is s, or def when s is empty.
func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
