package appliance_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/tests/clustertest"
)

// The chaos loop's knobs. The short loop (10 signals) runs in `make
// test`; KNOTLESS_CHAOS_KILLS=50 (or -chaos.kills=50) runs the full one.
var (
	chaosSeed   = flag.Uint64("chaos.seed", 0, "seed of the chaos loop (0: from the clock; the seed is logged)")
	chaosKills  = flag.Int("chaos.kills", 0, "signals the chaos loop sends the daemon (0: $KNOTLESS_CHAOS_KILLS, else 10)")
	chaosPushes = flag.Int("chaos.pushes", 0, "pushes of the chaos loop (0: one per signal and two more)")
	chaosGap    = flag.Duration("chaos.gap", 12*time.Second, "longest wait between the daemon's READY and the next signal (uniform from 1s)")
	chaosSettle = flag.Duration("chaos.settle", 20*time.Minute, "bound on the wait for every push's final check after the last signal")
)

// EnvChaosKills sets the number of signals when -chaos.kills is not given.
const EnvChaosKills = "KNOTLESS_CHAOS_KILLS"

func chaosKillCount(t *testing.T) int {
	if *chaosKills > 0 {
		return *chaosKills
	}
	if v := os.Getenv(EnvChaosKills); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", EnvChaosKills, v)
		}
		return n
	}
	return 10
}

// chaosKind is one kind of workflow the loop pushes, and the final
// status its run must end with.
type chaosKind struct {
	name, workflow, want string
}

var chaosKinds = []chaosKind{
	{"long", `
on: [push]
steps:
  - name: long
    run: |
      echo long begins
      sleep 15
      echo long ends
  - name: after
    run: echo after the long step
`, "success"},
	{"failing", `
on: [push]
steps:
  - name: fails
    run: |
      echo about to fail
      exit 3
  - name: never
    run: echo never runs
`, "failure"},
	{"secret", `
on: [push]
secrets: [DEPLOY_TOKEN]
steps:
  - name: uses the secret
    secrets: [DEPLOY_TOKEN]
    run: |
      echo "token=$DEPLOY_TOKEN"
      sleep 3
      test "$DEPLOY_TOKEN" = "` + secretValue + `"
`, "success"},
	{"quick", `
on: [push]
steps:
  - name: quick
    run: echo quick
`, "success"},
	// A cache a killed run may have been saving: whatever a later run
	// restores is a whole save (the mark and the blob of one run), never
	// a torn one.
	{"cached", `
on: [push]
cache: [.cache/chaos]
steps:
  - name: uses the cache
    run: |
      if [ -e .cache/chaos/mark ]; then
        test "$(cat .cache/chaos/mark)" = "$(sha256sum < .cache/chaos/blob)"
        echo "cache restored intact"
      fi
      mkdir -p .cache/chaos
      head -c 1048576 /dev/urandom > .cache/chaos/blob
      sleep 2
      sha256sum < .cache/chaos/blob > .cache/chaos/mark
`, "success"},
}

// chaosPush is one push of the loop: its workflow's check must end
// once, with want.
type chaosPush struct {
	kind   chaosKind
	commit string
}

// TestChaos pushes workflows (long, failing, with secrets, with a cache) while a
// driver SIGKILLs or SIGTERMs the daemon of the module's real systemd
// unit at random moments (`systemctl kill`: every process of the unit,
// git's too, harsher than a stop), then lets it settle, and asserts: every push
// has exactly one check and it is final with its workflow's status (0
// lost), no check is written final twice (0 duplicates), no Job or pod
// of the runner is left and its NetworkPolicy names no run, and the
// secret's value is in none of the journal, the check records, their
// log blobs and the namespace's objects. The figures go to the test log.
func TestChaos(t *testing.T) {
	t.Parallel()
	kills := chaosKillCount(t)
	pushes := *chaosPushes
	if pushes <= 0 {
		pushes = kills + 2
	}
	if *chaosGap <= time.Second {
		t.Fatalf("-chaos.gap=%s: want more than 1s", *chaosGap)
	}
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	rng := rand.New(rand.NewPCG(seed, seed>>32|1))
	t.Logf("chaos: seed %d, %d signals, %d pushes (again: -chaos.seed=%d -chaos.kills=%d -chaos.pushes=%d)", seed, kills, pushes, seed, kills, pushes)

	c := clustertest.Start(t)
	w := newWorld(t)
	k := bootKube(t, c, w, map[string]any{"concurrency": 2, "stop-wait": "1m"})

	var pushed []chaosPush
	push := func() {
		i := len(pushed)
		kind := chaosKinds[i%len(chaosKinds)]
		commit := w.pushTo(fmt.Sprintf("chaos-%d", i), map[string]string{".knotless/workflows/chaos.yaml": kind.workflow})
		pushed = append(pushed, chaosPush{kind: kind, commit: commit})
	}
	// Spread the pushes over the signals: some before the first.
	perRound := func(round int) int {
		return (round+1)*pushes/(kills+1) - round*pushes/(kills+1)
	}

	began := time.Now()
	var sigKill, sigTerm int
	pid := k.show(service, "MainPID")
	for round := range kills {
		for range perRound(round) {
			push()
		}
		time.Sleep(time.Second + time.Duration(rng.Int64N(int64(*chaosGap-time.Second)+1)))
		sig := "KILL"
		if rng.IntN(2) == 1 {
			sig = "TERM"
		}
		if out, err := k.systemctl("kill", "--signal="+sig, service); err != nil {
			t.Fatalf("signal %d (%s): systemctl kill: %v\n%s", round+1, sig, err, out)
		}
		if sig == "KILL" {
			sigKill++
		} else {
			sigTerm++
		}
		pid = k.restarted(pid, 3*time.Minute)
	}
	for len(pushed) < pushes {
		push()
	}
	lastSignal := time.Now()

	// Settle: every push's check final, then the runner's objects gone.
	deadline := lastSignal.Add(*chaosSettle)
	var lost []chaosPush
	for {
		lost = lost[:0]
		checks := w.allChecks()
		for _, p := range pushed {
			if cs := checks[p.commit]; len(cs) != 1 || !cs[0].Value.Final() {
				lost = append(lost, p)
			}
		}
		if len(lost) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	settledChecks := time.Since(lastSignal)
	objectsGone := k.waitNoRunObjects(2 * time.Minute)
	settled := time.Since(lastSignal)

	// The figures, from the driver and the daemon's journal.
	journal := k.journal(service)
	var runsStarted, finishedTwice int
	finals := map[string]int{}
	for _, e := range journal {
		if e["CHECK"] == "" || e["COMPONENT"] != "daemon" {
			continue
		}
		switch e["MESSAGE"] {
		case "run started":
			runsStarted++
		case "run finished":
			finals[e["CHECK"]]++
		}
	}
	for key, n := range finals {
		if n > 1 {
			finishedTwice++
			t.Errorf("check %s written final %d times", key, n)
		}
	}
	adopted := fieldSum(find(journal, "adopted "), "RUNS")
	forgotten := fieldSum(find(journal, "runs of an earlier process will run again"), "RUNS")
	released := len(find(journal, "run released: its session had not started"))
	gone := len(find(journal, "the session of a handed-over run is gone"))
	handedOver := fieldSum(find(journal, "handed over "), "GOING_ON")
	starts := len(find(journal, "logged in"))
	t.Logf("chaos figures: seed %d; signals %d (SIGKILL %d, SIGTERM %d) over %s; pushes %d; daemon starts %d; runs started %d (rerun %d: %d forgotten after a kill, %d released at a stop before their session started, %d handed-over sessions gone); handed over %d, adopted %d; lost %d; duplicates %d; checks final %s after the last signal, objects gone %s after it",
		seed, kills, sigKill, sigTerm, lastSignal.Sub(began).Round(time.Second), pushes, starts, runsStarted, runsStarted-pushes, forgotten, released, gone,
		handedOver, adopted, len(lost), finishedTwice, settledChecks.Round(time.Second), settled.Round(time.Second))

	checks := w.allChecks()
	for _, p := range lost {
		t.Errorf("lost: push %s (%s) has checks %+v after %s", p.commit, p.kind.name, checks[p.commit], *chaosSettle)
	}
	for _, p := range pushed {
		cs := checks[p.commit]
		if len(cs) > 1 {
			t.Errorf("duplicate: push %s (%s) has %d check records", p.commit, p.kind.name, len(cs))
		}
		if len(cs) == 1 && cs[0].Value.Final() && cs[0].Value.Status != p.kind.want {
			t.Errorf("push %s (%s) ended %s (%s), want %s", p.commit, p.kind.name, cs[0].Value.Status, cs[0].Value.Error, p.kind.want)
		}
	}
	if !objectsGone {
		t.Error("Jobs or pods of finished runs are left")
	}
	k.checkNoRunPolicies(t)

	// No secret value anywhere it could leak to.
	for _, e := range k.journal("") {
		for f, v := range e {
			if strings.Contains(v, secretValue) || strings.Contains(v, w.Password) {
				t.Errorf("a secret is in the journal, field %s of %q", f, e["MESSAGE"])
			}
		}
	}
	for commit, cs := range checks {
		for _, r := range cs {
			b, err := json.Marshal(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), secretValue) {
				t.Errorf("the secret is in the check record of %s", commit)
			}
			if r.Value.Log == nil {
				continue
			}
			blob := w.blob(t, r.Value)
			if strings.Contains(blob, secretValue) {
				t.Errorf("the secret is in the log blob of the check of %s", commit)
			}
			// A run adopted or run again logs each line of its steps once.
			for _, line := range []string{"long begins", "long ends", "after the long step", "about to fail", "quick"} {
				if n := strings.Count("\n"+blob, "\n"+line+"\n"); n > 1 {
					t.Errorf("line %q %d times in the log blob of the check of %s:\n%s", line, n, commit, blob)
				}
			}
		}
	}
	k.checkNoSecretInObjects(t)
}

// allChecks lists the runner's checks by commit.
func (w *world) allChecks() map[string][]forge.Record[forge.Check] {
	w.t.Helper()
	recs, _, err := forge.List[forge.Check](context.Background(), w.Reader, w.Runner.DID, forge.CollectionCheck)
	if err != nil {
		w.t.Fatal(err)
	}
	out := map[string][]forge.Record[forge.Check]{}
	for _, r := range recs {
		out[r.Value.Subject.Commit] = append(out[r.Value.Subject.Commit], r)
	}
	return out
}

// checkNoRunPolicies: the runner's NetworkPolicies are its namespace's
// one, never one per run that could outlive it.
func (k *kubeAppliance) checkNoRunPolicies(t *testing.T) {
	t.Helper()
	nps, err := k.c.Clientset.NetworkingV1().NetworkPolicies(k.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, np := range nps.Items {
		if run := np.Labels[kubernetes.LabelRun]; run != "" {
			t.Errorf("NetworkPolicy %s of run %s is left", np.Name, run)
		}
	}
}

// checkNoSecretInObjects: the secret's value is in no object of the
// runs' namespace (what is left of Jobs and pods, events, ConfigMaps,
// Secrets, NetworkPolicies).
func (k *kubeAppliance) checkNoSecretInObjects(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	cs := k.c.Clientset
	var objs []any
	add := func(list any, err error) {
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, list)
	}
	add(cs.BatchV1().Jobs(k.ns).List(ctx, metav1.ListOptions{}))
	add(cs.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{}))
	add(cs.CoreV1().Events(k.ns).List(ctx, metav1.ListOptions{}))
	add(cs.CoreV1().ConfigMaps(k.ns).List(ctx, metav1.ListOptions{}))
	add(cs.CoreV1().Secrets(k.ns).List(ctx, metav1.ListOptions{}))
	add(cs.NetworkingV1().NetworkPolicies(k.ns).List(ctx, metav1.ListOptions{}))
	for _, o := range objs {
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), secretValue) {
			t.Errorf("the secret is in the namespace's objects (%T)", o)
		}
	}
}
