package cli

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
)

// The replicas' chaos loop: its short version (6 signals) runs in `make
// test`; KNOTLESS_REPLICA_SIGNALS=100 (or -replicas.signals=100) with
// -replicas.gap=20s runs the full one (docs/performance.md).
var (
	replicaSignals = flag.Int("replicas.signals", 0, "signals the replicas' chaos loop sends (0: $KNOTLESS_REPLICA_SIGNALS, else 6)")
	replicaPushes  = flag.Int("replicas.pushes", 0, "pushes of the replicas' chaos loop (0: one per signal; the issue's loop: two)")
	replicaGap     = flag.Duration("replicas.gap", 8*time.Second, "longest wait between two signals of the replicas' chaos loop (uniform from a quarter of it)")
	replicaKill    = flag.Float64("replicas.sigkill", 0.5, "share of the replicas' chaos loop's signals that are SIGKILL; the others are SIGTERM")
	replicaSeed    = flag.Uint64("replicas.seed", 0, "seed of the replicas' chaos loop (0: from the clock; logged)")
	replicaDown    = flag.Duration("replicas.down", 20*time.Second, "how long a replica killed with SIGKILL stays down before it is started again (a SIGTERMed one starts again at once): the survivors take its runs over meanwhile")
)

// EnvReplicaSignals sets the replicas' chaos loop's signals when
// -replicas.signals is not given.
const EnvReplicaSignals = "KNOTLESS_REPLICA_SIGNALS"

// EnvReplicaLogs names a directory the replicas' chaos loop writes each
// replica's whole log to (NAME.log), passed or failed.
const EnvReplicaLogs = "KNOTLESS_REPLICA_LOGS"

// TestReplicasChaos: three real serve processes with --replicas, one
// runner, on the real cluster and PDS. Pushes come (each on a branch of
// its own, a step that sleeps and one after it) while a random replica
// is sent SIGKILL or SIGTERM every few seconds and started again at
// once, and earlier pushes are delivered again (their record written
// again: the same event). Every push ends with one final check, success;
// no step starts twice in the pods (the witness: the pods' own log);
// every run's Job is made once; nothing is left in the namespace.
func TestReplicasChaos(t *testing.T) {
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	signals := *replicaSignals
	if signals == 0 {
		signals = 6
		if v := os.Getenv(EnvReplicaSignals); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: want a positive number", EnvReplicaSignals, v)
			}
			signals = n
		}
	}
	pushes := *replicaPushes
	if pushes == 0 {
		// One run pod holds the test cluster's one node: the pushes'
		// runs go one at a time, and make up most of the loop's time.
		pushes = signals
	}
	seed := *replicaSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	t.Logf("replicas chaos: seed %d, %d signals, %d pushes (again: -replicas.seed=%d -replicas.signals=%d -replicas.pushes=%d)", seed, signals, pushes, seed, signals, pushes)

	// Said again last, after the replicas' logs (a CI log's tail is
	// often all there is of it).
	var verdict string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replicas chaos failed: seed %d, %d signals, %d pushes: %s", seed, signals, pushes, verdict)
		}
	})
	c := clustertest.Start(t)
	if err := pds.Installed(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute+time.Duration(signals)**replicaGap)
	defer cancel()
	srv, err := pds.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	w := forgeworld.New(t, srv, forgeworld.Options{App: "chaos"})
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "app-password")
	writeFile(t, pwFile, w.Password+"\n")
	sel := kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(w.Runner.DID.String())

	// The replicas, each restarted under its name after its signal.
	rs := &chaosReplicas{t: t, ctx: ctx, dir: dir, procs: map[string]*exec.Cmd{}, logs: map[string]*syncbuf.Buffer{}}
	names := []string{"r1", "r2", "r3"}
	for _, name := range names {
		cfg := filepath.Join(dir, name+".json")
		writeFile(t, cfg, fmt.Sprintf(`{"executor": "kubernetes", "did": %q, "pds": %q, "plc-url": %q, "state-dir": %q, "cache-dir": %q,
  "kubeconfig": %q, "namespace": %q, "image": %q, "schedule-timeout": "3m", "replicas": true, "replica-name": %q,
  "concurrency": 2, "stop-wait": "1m", "poll": "1s", "app-password-file": %q, "allow-local-sources": true}`,
			w.Runner.DID, srv.URL, srv.PLCURL, filepath.Join(dir, name+"-state"), filepath.Join(dir, name+"-cache"),
			c.Kubeconfig, c.Namespace, c.Image, name, pwFile))
		rs.start(name, w.Owner.DID.String()+"/hello", cfg)
	}
	t.Cleanup(rs.stopAll)

	// The outside witnesses: every run pod's own log (steps' starts),
	// and every Job's UID and driver as the API server shows them.
	seen := startChaosWitness(ctx, c, sel)
	defer seen.stop()

	type push struct {
		uri    syntax.ATURI
		commit string
		old    string
		branch string
		at     time.Time
	}
	var pushed []push
	pushOne := func() {
		i := len(pushed)
		branch := fmt.Sprintf("chaos-%d", i)
		wf := fmt.Sprintf(`on: [push]
steps:
  - name: long
    run: |
      echo "witness p%[1]d $KNOTLESS_RUN_STEP" > /proc/1/fd/1 2>/dev/null || :
      echo long begins
      sleep %[2]d
      echo long ends
  - name: after
    run: |
      echo "witness p%[1]d $KNOTLESS_RUN_STEP" > /proc/1/fd/1 2>/dev/null || :
      echo after the long step
`, i, 3+rng.IntN(6))
		old := w.Src.Head("refs/heads/" + branch)
		commit := w.Src.Commit(branch, map[string]string{".knotless/workflows/ci.yaml": wf})
		uri := w.Put(w.Owner, forge.CollectionRefUpdate, "", forge.RefUpdate{Type: forge.CollectionRefUpdate, Repo: w.RepoURI.String(),
			Ref: "refs/heads/" + branch, Old: old, New: commit, CreatedAt: forge.Now()})
		pushed = append(pushed, push{uri: uri, commit: commit, old: old, branch: branch, at: time.Now()})
	}
	redelivered := 0
	redeliver := func() {
		p := pushed[rng.IntN(len(pushed))]
		w.Put(w.Owner, forge.CollectionRefUpdate, p.uri.RecordKey().String(), forge.RefUpdate{Type: forge.CollectionRefUpdate,
			Repo: w.RepoURI.String(), Ref: "refs/heads/" + p.branch, Old: p.old, New: p.commit, CreatedAt: forge.Now()})
		redelivered++
	}

	rs.waitReady(names)
	perRound := max(1, pushes/signals)
	var kills, terms int
	var restarts sync.WaitGroup
	for round := range signals {
		for range perRound {
			if len(pushed) < pushes {
				pushOne()
			}
		}
		if round > 0 {
			redeliver()
		}
		gap := *replicaGap/4 + time.Duration(rng.Int64N(int64(*replicaGap*3/4)))
		time.Sleep(gap)
		live := rs.live()
		if len(live) < 2 {
			continue // one left: it is not killed too
		}
		name := live[rng.IntN(len(live))]
		if rng.Float64() < *replicaKill {
			kills++
			seen.signalled(name, syscall.SIGKILL, time.Now())
			rs.signal(name, syscall.SIGKILL)
			restarts.Go(func() {
				select {
				case <-ctx.Done():
				case <-time.After(*replicaDown):
				}
				rs.restart(name)
			})
			continue
		}
		terms++
		seen.signalled(name, syscall.SIGTERM, time.Now())
		rs.signal(name, syscall.SIGTERM)
		rs.restart(name)
	}
	restarts.Wait()
	for len(pushed) < pushes {
		pushOne()
	}
	t.Logf("signals sent: %d SIGKILL, %d SIGTERM; %d duplicate deliveries", kills, terms, redelivered)

	// Every push ends: one final check each, success.
	deadline := time.Now().Add(10 * time.Minute)
	took := map[int]time.Duration{} // push: from the push to its final check
	for {
		byCommit := map[string][]forge.Check{}
		for _, r := range w.Checks() {
			byCommit[r.Value.Subject.Commit] = append(byCommit[r.Value.Subject.Commit], r.Value)
		}
		done, bad, open := 0, []string{}, []string{}
		for i, p := range pushed {
			cs := byCommit[p.commit]
			switch {
			case len(cs) == 0:
				open = append(open, fmt.Sprintf("push %d: no check", i))
			case len(cs) == 1 && !cs[0].Final():
				open = append(open, fmt.Sprintf("push %d: %s (%s)", i, cs[0].Status, cs[0].Error))
			case len(cs) > 1:
				bad = append(bad, fmt.Sprintf("push %d: %d check records", i, len(cs)))
			case len(cs) == 1 && cs[0].Final():
				done++
				if _, ok := took[i]; !ok {
					if end, err := time.Parse(time.RFC3339Nano, string(cs[0].FinishedAt)); err == nil {
						took[i] = end.Sub(p.at)
					}
				}
				if cs[0].Status != "success" {
					bad = append(bad, fmt.Sprintf("push %d: %s (%s)", i, cs[0].Status, cs[0].Error))
				}
			}
		}
		if len(bad) > 0 {
			verdict = "checks: " + strings.Join(bad, "; ")
			t.Fatal(verdict)
		}
		if done == len(pushed) {
			break
		}
		if time.Now().After(deadline) {
			verdict = fmt.Sprintf("%d of %d pushes have a final check 10 min after the last signal; %s", done, len(pushed), strings.Join(open, "; "))
			t.Fatal(verdict)
		}
		time.Sleep(time.Second)
	}
	// Nothing left: no Job, pod or checkpoint of the runner's.
	for {
		jobs, err1 := c.Clientset.BatchV1().Jobs(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		cms, err2 := c.Clientset.CoreV1().ConfigMaps(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err1 == nil && err2 == nil && len(jobs.Items) == 0 && len(cms.Items) == 0 {
			break
		}
		if ctx.Err() != nil {
			verdict = fmt.Sprintf("left in the namespace: %v Jobs, %v checkpoints (%v %v)", len(jobs.Items), len(cms.Items), err1, err2)
			t.Fatal(verdict)
		}
		time.Sleep(500 * time.Millisecond)
	}
	starts, jobsMade, takeovers := seen.stop()
	twice := 0
	for step, n := range starts {
		if n > 1 {
			twice++
			t.Errorf("step %s started %d times (the pods' witness)", step, n)
			verdict += fmt.Sprintf("step %s started %d times; ", step, n)
		}
	}
	// A Job is made again only after the earlier one was deleted: a
	// run whose driver died before its first step (a step that had
	// started would show twice in the witness above).
	remade := 0
	for _, uids := range jobsMade {
		remade += len(uids) - 1
	}
	slices.Sort(takeovers)
	ends := slices.Sorted(maps.Values(took))
	t.Logf("replicas chaos figures: seed %d; signals %d (SIGKILL %d, SIGTERM %d); pushes %d; duplicate deliveries %d; steps started %d, twice %d; Jobs %d (made again after the earlier one was deleted, no step started: %d); takeovers by a survivor after SIGKILL %d: %s; push to final check: %s",
		seed, signals, kills, terms, len(pushed), redelivered, len(starts), twice, len(jobsMade), remade, len(takeovers), quantiles(takeovers), quantiles(ends))
}

// quantiles formats p50, p95 and max of sorted durations.
func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	at := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	return fmt.Sprintf("p50 %s, p95 %s, max %s", at(0.5).Round(10*time.Millisecond), at(0.95).Round(10*time.Millisecond), ds[len(ds)-1].Round(10*time.Millisecond))
}

// chaosReplicas are the loop's serve processes, by replica name.
type chaosReplicas struct {
	t   *testing.T
	ctx context.Context
	dir string

	mu    sync.Mutex
	procs map[string]*exec.Cmd
	logs  map[string]*syncbuf.Buffer
	cfgs  map[string][2]string
}

func (r *chaosReplicas) start(name, repo, cfg string) {
	r.t.Helper()
	cmd := exec.CommandContext(r.ctx, os.Args[0], "-test.run=^TestServeHelperProcess$", "--", "--config", cfg, repo)
	cmd.Env = append(cmd.Environ(), "KNOTLESS_SERVE_HELPER=1")
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cfgs == nil {
		r.cfgs = map[string][2]string{}
	}
	r.cfgs[name] = [2]string{repo, cfg}
	logs := r.logs[name]
	if logs == nil {
		logs = &syncbuf.Buffer{}
		r.logs[name] = logs
	}
	cmd.Stderr, cmd.Stdout = logs, logs
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.procs[name] = cmd
}

// signal sends sig to the replica and waits for it to end.
func (r *chaosReplicas) signal(name string, sig syscall.Signal) {
	r.mu.Lock()
	cmd := r.procs[name]
	delete(r.procs, name)
	r.mu.Unlock()
	_ = cmd.Process.Signal(sig)
	_ = cmd.Wait()
}

// live are the replicas running, by name.
func (r *chaosReplicas) live() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.procs))
	for n := range r.procs {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func (r *chaosReplicas) restart(name string) {
	r.mu.Lock()
	c := r.cfgs[name]
	r.mu.Unlock()
	r.start(name, c[0], c[1])
}

// waitReady waits until each replica said it is ready.
func (r *chaosReplicas) waitReady(names []string) {
	r.t.Helper()
	for _, n := range names {
		r.mu.Lock()
		logs := r.logs[n]
		r.mu.Unlock()
		waitFor(r.t, 2*time.Minute, func() bool { return strings.Contains(logs.String(), "msg=ready") }, logs.String)
	}
}

func (r *chaosReplicas) stopAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, cmd := range r.procs {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if r.t.Failed() {
			r.t.Logf("replica %s:\n%s", name, r.logs[name].String())
		}
		if dir := os.Getenv(EnvReplicaLogs); dir != "" {
			f := filepath.Join(dir, name+".log")
			if err := os.WriteFile(f, []byte(r.logs[name].String()), 0o644); err != nil {
				r.t.Errorf("%s: %v", EnvReplicaLogs, err)
			}
		}
	}
}

// chaosWitness follows the runner's pods' own logs (steps' starts, by
// "pN STEP") and its Jobs (each name's UIDs, and when a Job's driver
// changes from a replica that was just killed: a takeover's time).
type chaosWitness struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	starts    map[string]int
	followed  map[string]bool
	uids      map[string]map[string]bool
	drivers   map[string]string
	killedAt  map[string]time.Time
	takeovers []time.Duration
}

func startChaosWitness(ctx context.Context, c *clustertest.Cluster, sel string) *chaosWitness {
	ctx, cancel := context.WithCancel(ctx)
	w := &chaosWitness{cancel: cancel, starts: map[string]int{}, followed: map[string]bool{}, uids: map[string]map[string]bool{},
		drivers: map[string]string{}, killedAt: map[string]time.Time{}}
	w.wg.Go(func() {
		for ctx.Err() == nil {
			if jobs, err := c.Clientset.BatchV1().Jobs(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel}); err == nil {
				w.jobs(jobs.Items)
			}
			if pods, err := c.Clientset.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel}); err == nil {
				for _, p := range pods.Items {
					w.follow(ctx, c, p)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	return w
}

func (w *chaosWitness) signalled(name string, sig syscall.Signal, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if sig == syscall.SIGKILL {
		w.killedAt[name] = at
	} else {
		delete(w.killedAt, name)
	}
}

func (w *chaosWitness) jobs(items []batchv1.Job) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, j := range items {
		if w.uids[j.Name] == nil {
			w.uids[j.Name] = map[string]bool{}
		}
		w.uids[j.Name][string(j.UID)] = true
		d := j.Annotations[kubernetes.AnnotationDriver]
		if prev, ok := w.drivers[j.Name]; ok && prev != d {
			if at, killed := w.killedAt[prev]; killed {
				w.takeovers = append(w.takeovers, time.Since(at))
			}
		}
		w.drivers[j.Name] = d
	}
}

func (w *chaosWitness) follow(ctx context.Context, c *clustertest.Cluster, p corev1.Pod) {
	if p.Status.Phase != corev1.PodRunning && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
		return
	}
	w.mu.Lock()
	if w.followed[p.Name] {
		w.mu.Unlock()
		return
	}
	w.followed[p.Name] = true
	w.mu.Unlock()
	w.wg.Go(func() {
		rc, err := c.Clientset.CoreV1().Pods(c.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "run", Follow: true}).Stream(ctx)
		if err != nil {
			return
		}
		defer rc.Close()
		sc := bufio.NewScanner(rc)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "witness "); ok {
				w.mu.Lock()
				w.starts[rest]++
				w.mu.Unlock()
			}
		}
	})
}

// stop ends the following and returns the steps' starts, the Jobs'
// UIDs by name, and the takeovers' times after their driver's kill.
func (w *chaosWitness) stop() (map[string]int, map[string]map[string]bool, []time.Duration) {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.starts, w.uids, w.takeovers
}
