package latency

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/kube/replicas"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
)

// envReplicaPickupQueued sets how many runs TestReplicasPickup holds
// queued (10 by default; the figure is 100), a multiple of
// pickupLegs. Set, the probes are half as many (else 5) and the
// replicas are knotless-run built as the package builds it
// (buildBinary).
const envReplicaPickupQueued = "KNOTLESS_REPLICA_PICKUP_QUEUED"

// pickupLegs is how many runs each held event queues: a matrix whose
// legs need the event's one run that never starts.
const pickupLegs = 5

// TestReplicasPickup measures pickup (the event received → the run's
// Job created) with three `serve --replicas` processes of one runner on
// the capacity rig while runs wait queued.
//
// The queued runs: the owner pushes N/5 commits, each on a branch of
// its own, each with two workflows: `hold`, in a class whose node
// selector matches no node (its pod waits Unschedulable, its worker
// busy), and `wait`, a matrix of 5 legs that needs `hold`: the legs
// wait in their replica's queue while `hold` is in hand, and no worker
// takes them. Each event is one replica's (rendezvous hashing), so the
// queued runs are spread as the hashing spreads the events. With
// replicas no queued check is written, so the queued runs are counted
// from each replica's metrics (knotless_run_queue_depth). Each replica
// has a worker for every held run and every probe: a probe never waits
// for one. Then probe pushes (class kwok: bound to a fake node) come
// one at a time; each one's pickup is read from its owner's log: from
// the event received to the Job created (and from the refUpdate's
// write returning).
//
// A run whose pod never becomes Ready never writes its running check
// with replicas (the driver's first record waits for the session), so
// no cancel record can name it: the runs end by the replicas'
// --schedule-timeout, long enough for the probes (60 s, and 6 s a
// probe). Each hold and probe then ends `error` naming it, and each leg
// `skipped` (its need did not succeed).
//
// Asserted: each probe's and hold's Job is made by the replica that
// rendezvous hashing over the three names picks (replicas.Owner: its
// log, and the Job's driver annotation), by no other; each replica's
// queue holds the legs of its events, and runs going its holds (then
// its probes too); no check record is written while the runs are in
// flight; at the end each push has one check per run it made (hold and
// probe error naming --schedule-timeout, legs skipped) and no other;
// nothing of the runner's is left (Job, pod, budget, ConfigMap, and
// once the replicas stop, Lease). Logged: the pickups' p50, p99, max.
//
//	KNOTLESS_REPLICA_PICKUP_QUEUED=100 go test -count=1 -timeout 30m -run '^TestReplicasPickup$' -v ./tests/latency
func TestReplicasPickup(t *testing.T) {
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	queued, probes := 10, 5
	bin, process := "", "this test binary as knotless-run"
	if s := os.Getenv(envReplicaPickupQueued); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < pickupLegs || n%pickupLegs != 0 {
			t.Fatalf("%s=%q: want a multiple of %d", envReplicaPickupQueued, s, pickupLegs)
		}
		queued, probes = n, max(5, n/2)
		bin, process = buildBinary(t), "knotless-run built as the package builds it"
	}
	holds := queued / pickupLegs
	// One fake node a probe (a runner's run pods repel each other), and
	// a few more: see TestServeRunsInFlight.
	c, rig := clustertest.StartKwok(t, probes+max(1, probes/20))
	srv := startPDS(t)
	w := forgeworld.New(t, srv, forgeworld.Options{App: "replicas"})
	runner := w.Runner.DID.String()
	sel := kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(runner)
	// Registered before the replicas start, so it runs after they stop.
	t.Cleanup(func() {
		if t.Failed() {
			deleteRunObjects(t, c, sel)
		}
	})

	names := []string{"r1", "r2", "r3"}
	scheduleTimeout := 60*time.Second + time.Duration(probes)*6*time.Second
	reps := map[string]*daemon{}
	metricsURL := map[string]string{}
	for _, name := range names {
		// Concurrency: a worker for every hold and every probe, were they
		// all one replica's.
		extra := []string{"--replicas", "--replica-name", name, "--concurrency", strconv.Itoa(holds + probes + 1),
			"--schedule-timeout", scheduleTimeout.String(), "--log-blobs", "never",
			"--class", clustertest.KwokClass, "--class", nowhereClass, "--metrics-listen", "127.0.0.1:0"}
		d := startServe(t, w, c, bin, extra)
		listening, ok := d.logs.wait(time.Time{}, time.Minute, func(r record) bool { return r.Msg == "serving metrics" })
		if !ok {
			t.Fatalf("replica %s: no metrics address\n%s", name, d.logs.text())
		}
		metricsURL[name], _ = listening.Fields["address"].(string)
		reps[name] = d
	}
	// Each sees the three live before any push: else an event could go
	// by a view of fewer.
	for _, name := range names {
		d := reps[name]
		if _, ok := d.logs.wait(time.Time{}, time.Minute, func(r record) bool {
			live, _ := r.Fields["live"].([]any)
			return (r.Msg == "joined the runner's replicas" || r.Msg == "the runner's live replicas changed") && len(live) == len(names)
		}); !ok {
			t.Fatalf("replica %s does not see the three live after a minute\n%s", name, d.logs.text())
		}
	}

	// pickupPush is a push of the test and the replica that owns it.
	type pickupPush struct {
		*capPush
		owner, run string
	}
	push := func(branch string, files map[string]string, workflow string) pickupPush {
		p := &capPush{branch: "refs/heads/" + branch}
		p.commit = w.Src.Commit(branch, files)
		p.sent = time.Now()
		p.uri = w.Put(w.Owner, forge.CollectionRefUpdate, "", forge.RefUpdate{Type: forge.CollectionRefUpdate, Repo: w.RepoURI.String(),
			Ref: p.branch, Old: "", New: p.commit, CreatedAt: forge.Now()})
		p.written = time.Now()
		p.key = forge.CheckKey(forge.Subject{Repo: w.RepoURI.String(), Commit: p.commit, Ref: p.branch, Event: p.uri.String(), Kind: forge.KindPush}, workflow)
		// The event's key as intake has it (work.Event.Key), and the run's
		// ID as the scheduler makes it: a run whose pod is never Ready
		// logs no "run started" with replicas.
		return pickupPush{capPush: p, owner: replicas.Owner(names, p.uri.String()+"@"+p.commit), run: run.IDFor(runner, p.key)}
	}
	// jobOf waits for the Job of p's run in its owner's log, and checks
	// that its driver annotation names the owner.
	jobOf := func(what string, p pickupPush) record {
		t.Helper()
		d := reps[p.owner]
		job, ok := d.logs.wait(p.sent, 2*time.Minute, func(r record) bool { return r.Msg == "job created" && r.Fields["run"] == p.run })
		if !ok {
			t.Fatalf("%s: no Job made by its owner %s after 2 minutes\n%s", what, p.owner, d.logs.text())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		j, err := c.Clientset.BatchV1().Jobs(c.Namespace).Get(ctx, kubernetes.JobName(p.run), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: read its Job: %v", what, err)
		}
		if got := j.Annotations[kubernetes.AnnotationDriver]; got != p.owner {
			t.Errorf("%s: Job %s driven by %q, want its owner %s", what, j.Name, got, p.owner)
		}
		return job
	}
	// inFlight waits until p's owner saw its pod bound to a node or
	// unschedulable.
	inFlight := func(what string, p pickupPush) {
		t.Helper()
		d := reps[p.owner]
		if _, ok := d.logs.wait(p.sent, 2*time.Minute, func(r record) bool {
			return (r.Msg == "pod scheduled" || r.Msg == "pod not ready") && r.Fields["run"] == p.run
		}); !ok {
			t.Fatalf("%s: run %s not in flight on %s after 2 minutes\n%s", what, p.run, p.owner, d.logs.text())
		}
	}

	// The held events: each a hold that never starts and pickupLegs legs
	// queued behind it.
	legs := make([]string, pickupLegs)
	for i := range legs {
		legs[i] = strconv.Quote(strconv.Itoa(i))
	}
	holdFiles := map[string]string{
		".knotless/workflows/hold.yaml": "on: [push]\nclass: nowhere\nsteps:\n  - name: never\n    run: 'true'\n",
		".knotless/workflows/wait.yaml": "on: [push]\nneeds: [hold]\nmatrix:\n  n: [" + strings.Join(legs, ", ") + "]\nsteps:\n  - name: never\n    run: 'true'\n",
	}
	var held []pickupPush
	t0 := time.Now()
	for i := range holds {
		held = append(held, push(fmt.Sprintf("hold-%03d", i), holdFiles, "hold"))
	}
	holdsOf := map[string]int{}
	for i, p := range held {
		jobOf(fmt.Sprintf("hold %d", i), p)
		inFlight(fmt.Sprintf("hold %d", i), p)
		holdsOf[p.owner]++
	}

	// gauges sums a gauge of the replicas' metrics, and says each one's.
	gauges := func(name string) (sum int, each map[string]int) {
		each = map[string]int{}
		for _, n := range names {
			v := int(scrape(t, metricsURL[n])["knotless_run_"+name])
			each[n] = v
			sum += v
		}
		return sum, each
	}
	// waitGauges waits until each replica's queue holds the legs of its
	// events and its runs going are its holds and extra[replica].
	waitGauges := func(when string, extra map[string]int) {
		t.Helper()
		var queue, going map[string]int
		for end := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
			_, queue = gauges("queue_depth")
			_, going = gauges("runs_going")
			ok := true
			for _, n := range names {
				ok = ok && queue[n] == holdsOf[n]*pickupLegs && going[n] == holdsOf[n]+extra[n]
			}
			if ok {
				return
			}
			if time.Now().After(end) {
				break
			}
		}
		for _, n := range names {
			if queue[n] != holdsOf[n]*pickupLegs || going[n] != holdsOf[n]+extra[n] {
				t.Errorf("%s: replica %s has %d queued and %d going, want %d and %d (%d held events, %d probes)",
					when, n, queue[n], going[n], holdsOf[n]*pickupLegs, holdsOf[n]+extra[n], holdsOf[n], extra[n])
			}
		}
		t.FailNow()
	}
	waitGauges("before the probes", nil)
	fill := time.Since(t0)

	// Probes: one at a time, each left in flight on a fake node. A new
	// branch starts from the one checked out (the last hold's): its
	// workflows go, staged, so that a probe runs only its own.
	w.Src.Git("rm", "--quiet", "-r", ".knotless")
	probeFiles := map[string]string{".knotless/workflows/ci.yaml": "on: [push]\nclass: kwok\nsteps:\n  - name: never\n    run: 'true'\n"}
	var probed []pickupPush
	probesOf := map[string]int{}
	var fromWrite, fromEvent, toListed, listedToJob []time.Duration
	for i := range probes {
		p := push(fmt.Sprintf("probe-%03d", i), probeFiles, "ci")
		probed = append(probed, p)
		probesOf[p.owner]++
		what := fmt.Sprintf("probe %d (owner %s)", i, p.owner)
		job := jobOf(what, p)
		ev, ok := reps[p.owner].logs.wait(p.sent, time.Minute, func(r record) bool {
			return r.Msg == "records changed" && r.Fields["collection"] == forge.CollectionRefUpdate
		})
		if !ok {
			t.Fatalf("%s: no event received in its owner's log\n%s", what, reps[p.owner].logs.text())
		}
		// The reconcile the event woke: its listing done.
		listed, ok := reps[p.owner].logs.wait(ev.Time, time.Minute, func(r record) bool { return r.Msg == "listed" })
		if !ok {
			t.Fatalf("%s: no listing after the event in its owner's log\n%s", what, reps[p.owner].logs.text())
		}
		fromWrite = append(fromWrite, job.Time.Sub(p.written.Truncate(time.Millisecond)))
		fromEvent = append(fromEvent, job.Time.Sub(ev.Time))
		toListed = append(toListed, listed.Time.Sub(ev.Time))
		listedToJob = append(listedToJob, job.Time.Sub(listed.Time))
		inFlight(what, p)
	}
	probesTook := time.Since(t0) - fill
	waitGauges("with the probes", probesOf)
	// No run of the test has its pod Ready: with replicas none has a
	// check yet (no queued record; the running one waits for the pod).
	if checks := w.Checks(); len(checks) != 0 {
		t.Errorf("%d check records while every run waits for its pod, want none: the first is %s (%s)", len(checks), checks[0].Value.Workflow, checks[0].Value.Status)
	}
	var pods podCount
	for end := time.Now().Add(6 * time.Minute); ; time.Sleep(2 * time.Second) {
		pods = countPods(t, c, sel)
		if pods.onFake == probes && pods.unschedulable == holds || time.Now().After(end) {
			break
		}
	}
	if pods.onFake != probes || pods.unschedulable != holds {
		t.Errorf("pods: %d on fake nodes, %d unschedulable; want %d and %d", pods.onFake, pods.unschedulable, probes, holds)
	}
	// Each Job by its owner alone: no other replica made one for its run.
	for _, p := range append(slices.Clone(held), probed...) {
		for _, n := range names {
			if n == p.owner {
				continue
			}
			if _, made := reps[n].logs.wait(time.Time{}, 0, func(r record) bool { return r.Msg == "job created" && r.Fields["run"] == p.run }); made {
				t.Errorf("push %s (owner %s): replica %s made a Job for its run too", p.branch, p.owner, n)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	t.Logf("replicas pickup: %s ×3 (%s), --concurrency %d each, --schedule-timeout %s; %d fake nodes",
		process, strings.Join(names, ", "), holds+probes+1, scheduleTimeout, rig.Nodes)
	for _, n := range names {
		t.Logf("replicas pickup: %s: %d held events (%d runs queued), %d probes", n, holdsOf[n], holdsOf[n]*pickupLegs, probesOf[n])
	}
	t.Logf("replicas pickup: %d runs queued behind %d held runs %s after the first push; %d probes in %s", queued, holds, fill.Round(time.Millisecond), probes, probesTook.Round(time.Millisecond))
	t.Logf("replicas pickup: %d probes, event received (by its owner) → Job created: p50 %s, p99 %s, max %s", probes,
		percentile(fromEvent, 0.5), percentile(fromEvent, 0.99), slices.Max(fromEvent))
	t.Logf("replicas pickup: of which event received → listed: p50 %s, p99 %s; listed → Job created: p50 %s, p99 %s",
		percentile(toListed, 0.5), percentile(toListed, 0.99), percentile(listedToJob, 0.5), percentile(listedToJob, 0.99))
	t.Logf("replicas pickup: %d probes, refUpdate written → Job created: p50 %s, p99 %s, max %s", probes,
		percentile(fromWrite, 0.5), percentile(fromWrite, 0.99), slices.Max(fromWrite))

	// The end: every hold and probe by --schedule-timeout, every leg
	// skipped; one check per run, none other.
	t1 := time.Now()
	want := holds*(1+pickupLegs) + probes
	deadline := time.Now().Add(scheduleTimeout + 3*time.Minute)
	for {
		checks := w.Checks()
		commits := map[string]string{} // commit: its push's branch
		for _, p := range append(slices.Clone(held), probed...) {
			commits[p.commit] = p.branch
		}
		final, bad := 0, []string{}
		ran := map[string]int{} // branch: its final checks
		for _, r := range checks {
			ch := r.Value
			branch, ok := commits[ch.Subject.Commit]
			switch {
			case !ok:
				bad = append(bad, fmt.Sprintf("a check of no push of the test: %s on %s (%s)", ch.Workflow, ch.Subject.Commit, ch.Status))
			case !ch.Final():
			case (ch.Workflow == "hold" || ch.Workflow == "ci") && ch.Status == "error" && strings.Contains(ch.Error, "--schedule-timeout"),
				strings.HasPrefix(ch.Workflow, "wait (") && ch.Status == "skipped":
				final++
				ran[branch]++
			default:
				bad = append(bad, fmt.Sprintf("%s: %s %s (%s)", branch, ch.Workflow, ch.Status, ch.Error))
			}
		}
		if len(checks) > want {
			bad = append(bad, fmt.Sprintf("%d check records, want %d", len(checks), want))
		}
		if len(bad) > 0 {
			t.Fatalf("checks: %s", strings.Join(bad, "; "))
		}
		if final == want {
			// As many as there are runs, none other: one each.
			for _, p := range held {
				if ran[p.branch] != 1+pickupLegs {
					t.Errorf("%s: %d final checks, want %d (hold and its legs)", p.branch, ran[p.branch], 1+pickupLegs)
				}
			}
			for _, p := range probed {
				if ran[p.branch] != 1 {
					t.Errorf("%s: %d final checks, want 1", p.branch, ran[p.branch])
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d checks final %s after the probes (--schedule-timeout %s)", final, want, time.Since(t1).Round(time.Second), scheduleTimeout)
		}
		time.Sleep(2 * time.Second)
	}
	ended := time.Since(t1)
	if left := waitNothingLeft(t, c, sel, false, 5*time.Minute); left != "" {
		t.Fatalf("left in the namespace with every check final: %s", left)
	}
	if queue, _ := gauges("queue_depth"); queue != 0 {
		t.Errorf("the replicas' metrics say %d runs queued once every check is final, want none", queue)
	}
	if going, _ := gauges("runs_going"); going != 0 {
		t.Errorf("the replicas' metrics say %d runs going once every check is final, want none", going)
	}
	for _, n := range names {
		reps[n].stop()
	}
	if left := waitNothingLeft(t, c, sel, true, time.Minute); left != "" {
		t.Fatalf("left in the namespace once the replicas stopped: %s", left)
	}
	t.Logf("replicas pickup: every check final %s after the probes, nothing left", ended.Round(time.Second))
}
