package daemon_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/kube/replicas"
	"knotless.dev/run/tests/clustertest"
)

// replicaWrites records, per check key, which replica wrote each of its
// records.
type replicaWrites struct {
	mu     sync.Mutex
	by     map[string][]string // commit: replica names, one per write
	finals map[string][]string // check key: replica names, one per final write
	keys   map[string]string   // commit: check key
}

func (r *replicaWrites) hook(name string) func(string, forge.Check) {
	return func(key string, c forge.Check) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.by[c.Subject.Commit] = append(r.by[c.Subject.Commit], name)
		r.keys[c.Subject.Commit] = key
		if c.Final() {
			r.finals[key] = append(r.finals[key], name)
		}
	}
}

func (r *replicaWrites) final(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.finals[key]...)
}

// of returns the check key of commit's check ("" before any write) and
// who wrote its records.
func (r *replicaWrites) of(commit string) (string, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.keys[commit], append([]string(nil), r.by[commit]...)
}

// asReplica makes a daemon's config that of replica name of the runner
// on the cluster, its executor ex, with a state directory of its own.
func asReplica(t *testing.T, c *clustertest.Cluster, ex *kubernetes.Executor, name string) func(*daemon.Config) {
	return func(cfg *daemon.Config) {
		cfg.Engine.Executor, cfg.Engine.DefaultImage = ex, c.Image
		cfg.StateDir, cfg.CacheDir = t.TempDir(), t.TempDir()
		cfg.Logger = cfg.Logger.With("replica", name)
		runner, log := cfg.Account.Runner.String(), cfg.Logger
		cfg.Replicas = func(ctx context.Context, changed func()) (daemon.Replicas, error) {
			set, err := replicas.Join(ctx, replicas.Config{API: ex.API, Runner: runner, Name: name, Invocation: name + "-1",
				Logger: log, Changed: changed})
			if err != nil {
				return nil, err
			}
			return replicas.Both(set), nil
		}
	}
}

// TestReplicasShareTheEvents runs three replicas of one runner (one DID,
// each with its own state directory) on the real cluster and PDS: each
// push's run is driven by the one replica rendezvous hashing gives it,
// which alone writes its check (queued, running, final); a replica that
// stops gives its Lease back, and the pushes after go to the two left.
// No run is started twice and no Job is left.
func TestReplicasShareTheEvents(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	runner := w.Runner.DID.String()
	writes := &replicaWrites{by: map[string][]string{}, finals: map[string][]string{}, keys: map[string]string{}}
	names := []string{"replica-a", "replica-b", "replica-c"}
	stops := map[string]func() error{}
	// The test cluster has one node, and a runner's run pods never
	// share one: the pushes' runs take it one at a time, across the
	// three replicas. A run waits for it as long as the ones before it
	// take (minutes on a loaded machine); the test is of who writes
	// what, not of the wait.
	const wait = 8 * time.Minute
	for _, name := range names {
		ex, err := kubernetes.New(kubernetes.Config{
			Credentials: kubernetes.Credentials{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace},
			Runner:      runner, Driver: name, Pod: kubernetes.PodOptions{Image: c.Image}, ScheduleTimeout: wait,
		})
		if err != nil {
			t.Fatal(err)
		}
		cfg := w.config(asReplica(t, c, ex, name), func(cfg *daemon.Config) { cfg.OnCheck = writes.hook(name) })
		stops[name] = w.start(cfg)
	}
	waitLog := func(what string, n int, match func(line string) bool) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			got := 0
			for _, l := range strings.Split(w.logText(), "\n") {
				if match(l) {
					got++
				}
			}
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d log lines after 90 s\n%s", what, got, n, w.logText())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Each replica has joined, seen the repository (the pushes before
	// that are history) and is ready.
	waitLog("three replicas ready", 3, func(l string) bool { return strings.Contains(l, `msg=ready`) })
	// Each sees the three (a replica that joined first saw itself alone
	// until its next read of the Leases), and has reconciled since.
	for _, name := range names {
		waitLog(name+" sees the three", 1, func(l string) bool {
			return strings.Contains(l, "replica="+name+" ") && strings.Contains(l, `live="[replica-a replica-b replica-c]"`)
		})
	}
	time.Sleep(time.Second)

	expect := func(live []string, pushes []int) {
		t.Helper()
		events := map[string]string{} // commit: event key
		for _, i := range pushes {
			uri, commit := w.Push(map[string]string{
				".knotless/workflows/ci.yaml": workflowFile("on: [push]\nsteps:\n  - name: hello\n    run: echo hello from a replica\n"),
				"n.txt":                       fmt.Sprint(i),
			})
			events[commit] = uri.String() + "@" + commit
		}
		for commit, ev := range events {
			owner := replicas.Owner(live, ev)
			deadline := time.Now().Add(wait)
			for {
				if key, _ := writes.of(commit); key != "" && len(writes.final(key)) > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no final check for %s (owner %s) after %s\n%s", ev, owner, wait, w.logText())
				}
				time.Sleep(200 * time.Millisecond)
			}
			_, by := writes.of(commit)
			t.Logf("%s: owner %s, written by %v", ev, owner, by)
			if len(by) > 2 {
				// The write points of a run are one driver's: its running
				// and final records (no queued one with replicas).
				t.Errorf("check of %s: %d records written, want at most 2 (running, final)", ev, len(by))
			}
			for _, b := range by {
				if b != owner {
					t.Errorf("check of %s written by %v: want only its owner %s among %v", ev, by, owner, live)
					break
				}
			}
		}
	}
	expect(names, []int{1, 2, 3, 4, 5, 6})

	// replica-c stops: its Lease goes with it, and a and b take the
	// events from then on.
	if err := stops["replica-c"](); err != nil {
		t.Fatal(err)
	}
	waitLog("a and b see c gone", 2, func(l string) bool {
		return strings.Contains(l, "live replicas changed") && !strings.Contains(l, "replica-c ") && strings.Contains(l, "live=\"[replica-a replica-b]\"")
	})
	expect(names[:2], []int{7, 8, 9})

	// Every run once: one final check each, none written twice.
	for _, r := range w.Checks() {
		if n := len(writes.final(r.URI.RecordKey().String())); n != 1 {
			t.Errorf("check %s (%s) has %d final writes, want 1", r.URI.RecordKey(), r.Value.Status, n)
		}
		// A later push to main supersedes a run its replica still
		// holds (cancelled); every other run succeeds.
		if r.Value.Status != "success" && r.Value.Status != "cancelled" {
			t.Errorf("check %s: %s (%s), want success (or cancelled, superseded)", r.URI.RecordKey(), r.Value.Status, r.Value.Error)
		}
	}
	if strings.Contains(w.logText(), "run fenced") {
		t.Logf("a run was fenced (two replicas took one event while they disagreed on who lives): the fence held")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		jobs, err := c.Clientset.BatchV1().Jobs(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(runner)})
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs.Items) == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d Jobs of the runner left", len(jobs.Items))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestReplicaStartsAgainARunItsDeadDriverHadNotStarted: a replica that
// died after its run's running check and before the run's first step
// left a Job with no checkpoint. The replica that takes the event claims
// the run and starts it again: its check is queued again before the Job
// goes, so that a check that says running always has a Job to claim.
// That replica stops too while its new Job waits for a node (released:
// a replica writes nothing then): the check says queued, nothing is
// left in the cluster, and the next replica runs the work, once.
// Were the check still running with its Job gone, no replica could
// claim the run and it would never end.
func TestReplicaStartsAgainARunItsDeadDriverHadNotStarted(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	runner := w.Runner.DID.String()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	uri, commit := w.Push(map[string]string{".knotless/workflows/ci.yaml": workflowFile("on: [push]\nsteps:\n  - name: hello\n    run: echo \"run $((1+1)) once\"\n")})
	subject := forge.Subject{Repo: w.RepoURI.String(), Commit: commit, Ref: "refs/heads/main", Event: uri.String(), Kind: forge.KindPush}
	key := forge.CheckKey(subject, "ci")
	runID := run.IDFor(runner, key)
	sel := kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(runner)

	// What the dead driver d0 left: its running check and its run's
	// Job (suspended: no pod), with no checkpoint.
	w.Put(w.Runner, forge.CollectionCheck, key, forge.Check{Type: forge.CollectionCheck, Subject: subject, Workflow: "ci",
		Status: "running", CreatedAt: forge.Now(), StartedAt: forge.Now()})
	dead := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: kubernetes.JobName(runID), Namespace: c.Namespace,
		Labels:      map[string]string{kubernetes.LabelRunner: kubernetes.RunnerLabel(runner), kubernetes.LabelRun: runID},
		Annotations: map[string]string{kubernetes.AnnotationDriver: "d0", kubernetes.AnnotationDriverInvocation: "d0-1"}},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "run", Image: c.Image}}}}}}
	dead, err := c.Clientset.BatchV1().Jobs(c.Namespace).Create(ctx, dead, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	replica := func(name string, pod kubernetes.PodOptions) func() error {
		pod.Image = c.Image
		ex, err := kubernetes.New(kubernetes.Config{
			Credentials: kubernetes.Credentials{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace},
			Runner:      runner, Driver: name, Pod: pod, ScheduleTimeout: 2 * time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		return w.start(w.config(asReplica(t, c, ex, name)))
	}
	jobOf := func() (*batchv1.Job, error) {
		jobs, err := c.Clientset.BatchV1().Jobs(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil || len(jobs.Items) == 0 {
			return nil, err
		}
		return &jobs.Items[0], nil
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for !ok() {
			if ctx.Err() != nil {
				t.Fatalf("%s: not so before the test's deadline\n%s", what, w.logText())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	// s1's pods select no node: its Job waits.
	stop1 := replica("s1", kubernetes.PodOptions{NodeSelector: map[string]string{"knotless.dev/test-no-such-node": "none"}})
	waitFor("s1 made the run's Job again", func() bool {
		j, _ := jobOf()
		return j != nil && j.UID != dead.UID && j.Annotations[kubernetes.AnnotationDriver] == "s1"
	})
	if got := w.check(key); got.Status != "queued" || !strings.Contains(got.Error, "stopped before the run's first step") {
		t.Fatalf("check while s1 starts the run again: %s (%q), want queued, saying why", got.Status, got.Error)
	}
	if err := stop1(); err != nil {
		t.Fatal(err)
	}
	waitFor("s1's Job gone after its stop", func() bool { j, err := jobOf(); return err == nil && j == nil })
	if got := w.check(key); got.Status != "queued" {
		t.Fatalf("check after s1 stopped with the run unstarted: %s (%q), want queued", got.Status, got.Error)
	}

	// s2 can place its pod: the run goes, once.
	replica("s2", kubernetes.PodOptions{})
	if got := w.waitKey(key, 3*time.Minute); got.Status != "success" {
		t.Fatalf("check: %s (%q), want success", got.Status, got.Error)
	}
	if n := strings.Count(w.runLog(w.check(key)), "run 2 once"); n != 1 {
		t.Errorf("the step's output is in the run's log %d times, want once", n)
	}
	waitFor("no Job of the runner left", func() bool { j, err := jobOf(); return err == nil && j == nil })
}
