package replicas_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/kube/kubeclient"
	"knotless.dev/run/internal/kube/replicas"
	"knotless.dev/run/tests/clustertest"
)

func TestMain(m *testing.M) { clustertest.Main(m) }

func TestOwnerSpreadsAndMovesOnlyTheDeadShare(t *testing.T) {
	t.Parallel()
	names := []string{"a", "b", "c"}
	count := map[string]int{}
	moved := 0
	for i := range 3000 {
		key := fmt.Sprintf("at://did:plc:x/dev.knotless.push/%d", i)
		o := replicas.Owner(names, key)
		count[o]++
		after := replicas.Owner([]string{"a", "c"}, key)
		if o != "b" && after != o {
			moved++
		}
		if o == "b" && after == "b" {
			t.Fatalf("key %s still owned by the dead replica b", key)
		}
	}
	for _, n := range names {
		if count[n] < 800 || count[n] > 1200 {
			t.Errorf("replica %s owns %d of 3000 keys: want about a third each (%v)", n, count[n], count)
		}
	}
	if moved != 0 {
		t.Errorf("%d keys of the live replicas changed owner when b died: want 0", moved)
	}
	if replicas.Owner(nil, "k") != "" {
		t.Error("Owner of no replicas is not empty")
	}
}

// clusterAPI is the test's namespace on the real cluster, its clientset,
// and the Sets' API port on it.
func clusterAPI(t *testing.T) (*clustertest.Cluster, *kubeclient.Clientset, func() (*kubeclient.Clientset, string, error)) {
	t.Helper()
	c := clustertest.Start(t)
	cs, err := kubeclient.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c, cs, func() (*kubeclient.Clientset, string, error) { return cs, c.Namespace, nil }
}

// TestReplicasOnTheCluster runs three replicas' Sets on the real API
// server: each sees the three, every key is exactly one's, a second
// process with a live replica's name is refused, a replica that stops
// gives its share up at once, and one that dies (stops renewing) after
// its Lease's duration.
func TestReplicasOnTheCluster(t *testing.T) {
	_, _, api := clusterAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const runner = "did:plc:replicastest"
	changed := make(chan string, 16)
	join := func(name, inv string) (*replicas.Set, context.CancelFunc, chan struct{}) {
		t.Helper()
		s, err := replicas.Join(ctx, replicas.Config{API: api, Runner: runner, Name: name, Invocation: inv,
			Duration: 3 * time.Second, Renew: 300 * time.Millisecond, Changed: func() { changed <- name }})
		if err != nil {
			t.Fatalf("join %s: %v", name, err)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); s.Run(rctx) }()
		return s, stop, done
	}
	a, stopA, doneA := join("a", "inv-a")
	defer func() { stopA(); <-doneA }()
	b, stopB, doneB := join("b", "inv-b")
	defer func() { stopB(); <-doneB }()
	x, stopC, doneC := join("c", "inv-c")
	sets := []*replicas.Set{a, b, x}
	waitLive := func(what string, want int, sets ...*replicas.Set) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for _, s := range sets {
			for len(s.Members()) != want {
				if time.Now().After(deadline) {
					t.Fatalf("%s: replica %s sees %v, want %d live", what, s.Self(), s.Members(), want)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	waitLive("three joined", 3, sets...)
	ownersOf := func(sets ...*replicas.Set) map[string]int {
		owned := map[string]int{}
		for i := range 300 {
			key := fmt.Sprint("event-", i)
			n := 0
			for _, s := range sets {
				if s.Mine(key) {
					n++
					owned[s.Self()]++
				}
			}
			if n != 1 {
				t.Fatalf("key %s is %d replicas' (want exactly 1)", key, n)
			}
		}
		return owned
	}
	if owned := ownersOf(sets...); len(owned) != 3 {
		t.Fatalf("300 keys went to %v: want each of the three to have some", owned)
	}

	// A second process under a live name is refused, naming the holder.
	_, err := replicas.Join(ctx, replicas.Config{API: api, Runner: runner, Name: "b", Invocation: "inv-b2", Duration: 3 * time.Second})
	if !errors.Is(err, replicas.ErrNameHeld) {
		t.Fatalf("second process as replica b: err %v, want ErrNameHeld", err)
	}
	t.Logf("refused: %v", err)

	// c stops: it deletes its Lease, and the others take its share at
	// once (well before the Lease's 3 s).
	stopC()
	<-doneC
	waitLive("c stopped", 2, a, b)
	if owned := ownersOf(a, b); owned["c"] != 0 || len(owned) != 2 {
		t.Fatalf("after c stopped: %v", owned)
	}
	if slices.ContainsFunc(a.Members(), func(m replicas.Member) bool { return m.Name == "c" }) {
		t.Fatal("a says the stopped c is alive")
	}

	// b stops too; then d joins and dies: its Lease is renewed once (by
	// Join) and never again, as a replica killed outright leaves it. a
	// takes d for dead once the Lease's duration has passed.
	stopB()
	<-doneB
	waitLive("b stopped", 1, a)
	dead, err := replicas.Join(ctx, replicas.Config{API: api, Runner: runner, Name: "d", Invocation: "inv-d", Duration: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	waitLive("d joined", 2, a)
	if names := fmt.Sprint(a.Members()); !strings.Contains(names, "{d ") || strings.Contains(names, "{b ") {
		t.Fatalf("a sees %v: want a and d", a.Members())
	}
	start := time.Now()
	waitLive("d died", 1, a)
	if since := time.Since(start); since < time.Second {
		t.Errorf("d taken for dead %s after its last renewal: want its Lease's duration (3 s) to pass first", since)
	}
	if dead.Mine("anything") {
		t.Error("d, unrenewed past its duration, still takes keys")
	}
	for i := range 50 {
		if !a.Mine(fmt.Sprint("event-", i)) {
			t.Fatal("a alone does not own every key")
		}
	}
	// A new process of d takes its expired Lease.
	if _, err := replicas.Join(ctx, replicas.Config{API: api, Runner: runner, Name: "d", Invocation: "inv-d2", Duration: 3 * time.Second}); err != nil {
		t.Fatalf("a new process of the dead replica d: %v", err)
	}
}

// TestClaimReadsTheDriversLease: Runs.Claim on the real API server
// takes a run's Job only when its driving process is dead, as the
// driver's Lease says when read afresh: not while that process renews
// it (whatever the claimant's view), yes once the Lease is gone,
// expired, or held by the replica's next process; one claim of two
// wins; a Job with no checkpoint is claimed, and deleted only when its
// claimant drops it (no step had started).
func TestClaimReadsTheDriversLease(t *testing.T) {
	c, cs, api := clusterAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const runner = "did:plc:claimtest"
	join := func(name, inv string) *replicas.Set {
		t.Helper()
		s, err := replicas.Join(ctx, replicas.Config{API: api, Runner: runner, Name: name, Invocation: inv, Duration: 3 * time.Second, Renew: 300 * time.Millisecond})
		if err != nil {
			t.Fatalf("join %s: %v", name, err)
		}
		return s
	}
	var saver *replicas.Runs
	job := func(runID, driver, inv string, checkpoint bool) {
		t.Helper()
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: kubernetes.JobName(runID), Namespace: c.Namespace,
			Annotations: map[string]string{kubernetes.AnnotationDriver: driver, kubernetes.AnnotationDriverInvocation: inv}},
			Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "run", Image: c.Image}}}}}}
		if _, err := cs.BatchV1().Jobs(c.Namespace).Create(ctx, j, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if checkpoint {
			if err := saver.Save(ctx, runID, []byte("{}\nlog")); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The driver d1 (invocation 1) lives: it renews its Lease.
	driver := join("d1", "1")
	saver = replicas.NewRuns(driver)
	rctx, stopDriver := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); driver.Run(rctx) }()
	job("claimlives", "d1", "1", true)
	// The claimant's view of d1 does not matter: the Lease is read.
	claimant := replicas.NewRuns(join("s", "s-1"))
	if _, claimed, _, err := claimant.Claim(ctx, "claimlives"); err != nil || claimed {
		t.Fatalf("claim of a live driver's run: claimed %v, err %v", claimed, err)
	}
	// d1's next process holds its Lease: the Job's process (1) is dead.
	job("claimnext", "d1", "0", true)
	ckpt, claimed, _, err := claimant.Claim(ctx, "claimnext")
	if err != nil || !claimed || string(ckpt) != "{}\nlog" {
		t.Fatalf("claim of a run of the driver's earlier process: claimed %v, checkpoint %q, err %v", claimed, ckpt, err)
	}
	got, err := cs.BatchV1().Jobs(c.Namespace).Get(ctx, kubernetes.JobName("claimnext"), metav1.GetOptions{})
	if err != nil || got.Annotations[kubernetes.AnnotationDriver] != "s" || got.Annotations[kubernetes.AnnotationDriverInvocation] != "s-1" {
		t.Fatalf("claimed Job's driver: %v, %v", got.Annotations, err)
	}
	// A second claimant of the same run finds s alive: not claimed.
	other := replicas.NewRuns(join("o", "o-1"))
	sctx, stopS := context.WithCancel(ctx)
	sDone := make(chan struct{})
	sSet := join("s", "s-1")
	go func() { defer close(sDone); sSet.Run(sctx) }()
	if _, claimed, _, err := other.Claim(ctx, "claimnext"); err != nil || claimed {
		t.Fatalf("second claim of a claimed run: claimed %v, err %v", claimed, err)
	}
	stopS()
	<-sDone
	// d1 stops (its Lease given back): its run is claimed; one with no
	// checkpoint is claimed and its Job deleted.
	stopDriver()
	<-done
	if _, claimed, _, err := claimant.Claim(ctx, "claimlives"); err != nil || !claimed {
		t.Fatalf("claim of a stopped driver's run: claimed %v, err %v", claimed, err)
	}
	job("claimnockpt", "gone", "x", false)
	ckpt, claimed, _, err = claimant.Claim(ctx, "claimnockpt")
	if err != nil || !claimed || ckpt != nil {
		t.Fatalf("claim of a run with no checkpoint: claimed %v, checkpoint %q, err %v", claimed, ckpt, err)
	}
	// A run with no Job: nothing to claim, and the claimant is told so.
	if _, claimed, _, err := claimant.Claim(ctx, "claimnojob"); !errors.Is(err, executor.ErrSessionGone) || claimed {
		t.Fatalf("claim of a run with no Job: claimed %v, err %v; want executor.ErrSessionGone", claimed, err)
	}
	// Its Job stays until the claimant has queued the run's check again
	// and drops it: a check that says running always has its Job.
	if j, err := cs.BatchV1().Jobs(c.Namespace).Get(ctx, kubernetes.JobName("claimnockpt"), metav1.GetOptions{}); err != nil || j.DeletionTimestamp != nil ||
		j.Annotations[kubernetes.AnnotationDriver] != "s" {
		t.Fatalf("the Job of a run with no checkpoint after its claim: %v, %v; want it there, driven by s", j, err)
	}
	if err := other.Drop(ctx, "claimnockpt"); err == nil {
		t.Fatal("a replica that did not claim the run dropped its Job")
	}
	if err := claimant.Drop(ctx, "claimnockpt"); err != nil {
		t.Fatal(err)
	}
	if j, err := cs.BatchV1().Jobs(c.Namespace).Get(ctx, kubernetes.JobName("claimnockpt"), metav1.GetOptions{}); err == nil && j.DeletionTimestamp == nil {
		t.Fatal("the Job of a run with no checkpoint is still there after its claimant dropped it")
	}
}
