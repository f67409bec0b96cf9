package appliance_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
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
	chaosKill   = flag.Float64("chaos.sigkill", 0.5, "share of the signals that are SIGKILL (systemctl kill); the others are SIGTERM (systemctl restart: the unit stopped and started at once, as an upgrade does)")
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
      WITNESS
      echo long begins
      sleep 15
      echo long ends
  - name: after
    run: |
      WITNESS
      echo after the long step
`, "success"},
	{"failing", `
on: [push]
steps:
  - name: fails
    run: |
      WITNESS
      echo about to fail
      exit 3
  - name: never
    run: |
      WITNESS
      echo never runs
`, "failure"},
	{"secret", `
on: [push]
secrets: [DEPLOY_TOKEN]
steps:
  - name: uses the secret
    secrets: [DEPLOY_TOKEN]
    run: |
      WITNESS
      echo "token=$DEPLOY_TOKEN"
      sleep 3
      test "$DEPLOY_TOKEN" = "` + secretValue + `"
`, "success"},
	{"quick", `
on: [push]
steps:
  - name: quick
    run: |
      WITNESS
      echo quick
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
      WITNESS
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
// once, with want, or cancelled by the cancel record the loop wrote for
// it (whichever won: the run's end or the cancel).
type chaosPush struct {
	kind    chaosKind
	commit  string
	subject forge.Subject
	cancel  string // the cancel record's AT-URI, when one was written
	rerun   bool
	old     string // the ref's commit before the push, as its record says
}

// chaosRerun is a rerun record the loop wrote for a push whose check
// was final: its new attempt must end once, final, with the push's
// workflow's status.
type chaosRerun struct {
	uri  string
	push int // in pushed
}

// key is the check key of the push's first attempt.
func (p chaosPush) key() string { return forge.CheckKey(p.subject, "chaos") }

// TestChaos pushes workflows (long, failing, with secrets, with a cache) while a
// driver SIGKILLs the daemon of the module's real systemd unit
// (`systemctl kill`: every process of the unit, git's too) or restarts
// it (SIGTERM, the successor started at once) at random moments, and
// before each signal the owner
// cancels a push's check or re-runs a final one, and writes an earlier
// push's record again (a duplicate delivery of its event); then it lets it
// settle, and asserts: every push has exactly one first-attempt check
// and it is final with its workflow's status (or cancelled by the
// owner's record, when the cancel won the race with the run's end), and
// every re-run exactly one new attempt, final with its workflow's
// status (0 lost), no check is written final twice (0 duplicates), no
// Job or pod of the runner is left and its NetworkPolicy names no run,
// and the secret's value is in none of the journal, the check records,
// their log blobs and the namespace's objects. The figures go to the
// test log.
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
	if *chaosKill < 0 || *chaosKill > 1 {
		t.Fatalf("-chaos.sigkill=%v: want a share from 0 to 1", *chaosKill)
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
	var reruns []chaosRerun
	push := func() {
		i := len(pushed)
		kind := chaosKinds[i%len(chaosKinds)]
		branch := fmt.Sprintf("chaos-%d", i)
		// Each push's steps write their starts where only the test reads
		// (witness): the push's index and the attempt name them.
		wf := strings.ReplaceAll(kind.workflow, "WITNESS", strings.ReplaceAll(witnessLine, "WITNESS_ID", fmt.Sprintf("p%d-${CHAOS_RERUN:-0}", i)))
		old := w.Src.Head("refs/heads/" + branch)
		uri, commit := w.pushRecord(branch, map[string]string{".knotless/workflows/chaos.yaml": wf})
		pushed = append(pushed, chaosPush{kind: kind, commit: commit, old: old, subject: forge.Subject{Repo: w.RepoURI.String(), Commit: commit,
			Ref: "refs/heads/" + branch, Event: uri.String(), Kind: forge.KindPush}})
	}
	// A duplicate delivery: a push's record written again, the same
	// ref update with a new createdAt: the same event (its AT-URI and
	// commit), which the runner hears of and considers again, queued,
	// running or final. It must never make a second run.
	redelivered := 0
	redeliver := func() {
		p := pushed[rng.IntN(len(pushed))]
		w.Put(w.Owner, forge.CollectionRefUpdate, syntax.ATURI(p.subject.Event).RecordKey().String(), forge.RefUpdate{
			Type: forge.CollectionRefUpdate, Repo: p.subject.Repo, Ref: p.subject.Ref, Old: p.old, New: p.commit, CreatedAt: forge.Now()})
		redelivered++
	}
	// Run control in the cycle: on even rounds the owner cancels the
	// newest push's check (queued, running or already final), on odd
	// ones re-runs the oldest push whose check is final, with a run
	// variable; each record is written just before a signal, so some
	// are read by the process the signal ends, some by its successor.
	control := func(round int) {
		if round%2 == 0 {
			p := &pushed[len(pushed)-1]
			if p.cancel != "" {
				return
			}
			rec := forge.Cancel{Type: forge.CollectionCancel, Check: p.key(), Runner: w.Runner.DID.String(), Repo: w.RepoURI.String(), CreatedAt: forge.Now()}
			p.cancel = w.Put(w.Owner, forge.CollectionCancel, forge.CancelKey(rec.Runner, rec.Check), rec).String()
			return
		}
		final := map[string]bool{}
		for _, cs := range w.allChecks() {
			for _, c := range cs {
				final[c.URI.RecordKey().String()] = c.Value.Final()
			}
		}
		for i := range pushed {
			if p := &pushed[i]; !p.rerun && final[p.key()] {
				p.rerun = true
				uri := w.Put(w.Owner, forge.CollectionRerun, "", forge.Rerun{Type: forge.CollectionRerun, Check: p.key(), Runner: w.Runner.DID.String(),
					Repo: w.RepoURI.String(), Env: []forge.Variable{{Name: "CHAOS_RERUN", Value: "1"}}, CreatedAt: forge.Now()})
				reruns = append(reruns, chaosRerun{uri: uri.String(), push: i})
				return
			}
		}
	}
	// Spread the pushes over the signals: some before the first.
	perRound := func(round int) int {
		return (round+1)*pushes/(kills+1) - round*pushes/(kills+1)
	}

	seen := startWitness(k)
	began := time.Now()
	var sigKill, sigTerm int
	killedAt := map[string]time.Time{} // by the PID of the process that came after a SIGKILL
	termAt := map[string]time.Time{}   // by the PID of the process that came after a SIGTERM
	pid := k.show(service, "MainPID")
	for round := range kills {
		for range perRound(round) {
			push()
		}
		redeliver()
		time.Sleep(time.Second + time.Duration(rng.Int64N(int64(*chaosGap-time.Second)+1)))
		control(round)
		// SIGKILL: every process of the unit, git's too (systemctl
		// kill); the unit starts again after its RestartSec. SIGTERM:
		// the unit restarted (stopped: its runs handed over; started at
		// once), as an upgrade or a switch of the NixOS configuration
		// does.
		sig, args := "KILL", []string{"kill", "--signal=KILL", service}
		if rng.Float64() >= *chaosKill {
			sig, args = "TERM", []string{"restart", service}
		}
		at := time.Now()
		if out, err := k.systemctl(args...); err != nil {
			t.Fatalf("signal %d (%s): systemctl %s: %v\n%s", round+1, sig, args[0], err, out)
		}
		if sig == "KILL" {
			sigKill++
		} else {
			sigTerm++
		}
		pid = k.restarted(pid, 3*time.Minute)
		if sig == "KILL" {
			killedAt[pid] = at
		} else {
			termAt[pid] = at
		}
	}
	for len(pushed) < pushes {
		push()
	}
	lastSignal := time.Now()

	// Settle: every push's and every re-run's check final, then the
	// runner's objects gone.
	deadline := lastSignal.Add(*chaosSettle)
	var lost []chaosPush
	var lostReruns []chaosRerun
	for {
		lost, lostReruns = lost[:0], lostReruns[:0]
		firsts, caused := w.byAttempt()
		for _, p := range pushed {
			if cs := firsts[p.key()]; len(cs) != 1 || !cs[0].Value.Final() {
				lost = append(lost, p)
			}
		}
		for _, r := range reruns {
			if cs := caused[r.uri]; len(cs) != 1 || !cs[0].Value.Final() {
				lostReruns = append(lostReruns, r)
			}
		}
		if len(lost)+len(lostReruns) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	settledChecks := time.Since(lastSignal)
	objectsGone := k.waitNoRunObjects(2 * time.Minute)
	settled := time.Since(lastSignal)
	witnessed, podsFollowed, podsMissed := seen.stop()
	startedTwice := 0
	for step, n := range witnessed {
		if n > 1 {
			startedTwice++
			t.Errorf("step %s started %d times in its pods (the witness)", step, n)
		}
	}

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
	takenUp := len(find(journal, "a run of a process that died is taken up where it stands"))
	// The takeovers: from a SIGKILL to the next process following a run
	// it took up from its checkpoint (the unit's RestartSec included).
	// After a SIGTERM: from the restart to the next process following
	// a run handed over to it. Each run counts once: the first process
	// that resumed it after the signal.
	var takeovers, termTakeovers []time.Duration
	for _, e := range find(journal, "session resumed") {
		us, err := strconv.ParseInt(e["__REALTIME_TIMESTAMP"], 10, 64)
		if err != nil {
			continue
		}
		if at, ok := killedAt[e["_PID"]]; ok && e["REPLAY"] == "true" {
			takeovers = append(takeovers, time.UnixMicro(us).Sub(at))
		}
		if at, ok := termAt[e["_PID"]]; ok && e["REPLAY"] != "true" {
			termTakeovers = append(termTakeovers, time.UnixMicro(us).Sub(at))
		}
	}
	takeover, termTakeover := spread(takeovers), spread(termTakeovers)
	// The fence: a create of a run's Job that found it there, and the
	// runs whose Job was created more than once (a run released before
	// its session started, or whose pod was gone, is created again by
	// the next process: one after the other, never two at once).
	fenced := len(find(journal, "the run's Job exists already: another process drives this run; not run twice"))
	jobsOf := map[string]int{}
	for _, e := range find(journal, "job created") {
		jobsOf[e["RUN"]]++
	}
	recreated := 0
	for _, n := range jobsOf {
		if n > 1 {
			recreated++
		}
	}
	endedDead := len(find(journal, "a run of a process that died cannot go on; its check ends error"))
	released := len(find(journal, "run released: its session had not started"))
	gone := len(find(journal, "the session of a handed-over run is gone"))
	handedOver := fieldSum(find(journal, "handed over "), "GOING_ON")
	starts := len(find(journal, "logged in"))
	firsts, caused := w.byAttempt()
	var cancels, cancelsWon int
	for _, p := range pushed {
		if p.cancel != "" {
			cancels++
			if cs := firsts[p.key()]; len(cs) == 1 && cs[0].Value.Status == "cancelled" {
				cancelsWon++
			}
		}
	}
	t.Logf("chaos figures: seed %d; signals %d (SIGKILL %d, SIGTERM %d) over %s; pushes %d; cancels %d (%d stopped their check, %d came after its end); re-runs %d; daemon starts %d; runs started %d (again %d: %d forgotten after a kill before any step started, %d released at a stop before their session started, %d handed-over sessions gone); handed over %d, adopted %d (%d taken up after a kill; %d ended error after a kill, unable to go on); lost %d; duplicates %d; duplicate deliveries %d (fenced Job creates %d; %d runs' Jobs created again after the earlier one went); steps started %d, twice %d (the pods' witness; %d pods followed, %d gone before their log was read); takeovers after SIGKILL %s, after SIGTERM %s; checks final %s after the last signal, objects gone %s after it",
		seed, kills, sigKill, sigTerm, lastSignal.Sub(began).Round(time.Second), pushes, cancels, cancelsWon, cancels-cancelsWon, len(reruns), starts, runsStarted,
		runsStarted-pushes-len(reruns), forgotten, released, gone,
		handedOver, adopted, takenUp, endedDead, len(lost)+len(lostReruns), finishedTwice, redelivered, fenced, recreated, len(witnessed), startedTwice, podsFollowed, podsMissed, takeover, termTakeover, settledChecks.Round(time.Second), settled.Round(time.Second))

	checks := w.allChecks()
	for _, p := range lost {
		t.Errorf("lost: push %s (%s) has checks %+v after %s", p.commit, p.kind.name, checks[p.commit], *chaosSettle)
	}
	for _, r := range lostReruns {
		t.Errorf("lost: re-run %s of push %s (%s) has checks %+v after %s", r.uri, pushed[r.push].commit, pushed[r.push].kind.name, caused[r.uri], *chaosSettle)
	}
	for _, p := range pushed {
		cs := firsts[p.key()]
		if len(cs) > 1 {
			t.Errorf("duplicate: push %s (%s) has %d check records", p.commit, p.kind.name, len(cs))
		}
		if len(cs) != 1 || !cs[0].Value.Final() {
			continue
		}
		switch c := cs[0].Value; {
		case p.cancel != "" && c.Status == "cancelled":
			if c.CancelledBy != p.cancel {
				t.Errorf("push %s (%s) cancelled by %q, want %s", p.commit, p.kind.name, c.CancelledBy, p.cancel)
			}
		case c.Status != p.kind.want:
			t.Errorf("push %s (%s) ended %s (%s), want %s", p.commit, p.kind.name, c.Status, c.Error, p.kind.want)
		}
	}
	for _, r := range reruns {
		p := pushed[r.push]
		cs := caused[r.uri]
		if len(cs) > 1 {
			t.Errorf("duplicate: re-run %s of push %s has %d check records", r.uri, p.commit, len(cs))
		}
		if len(cs) != 1 || !cs[0].Value.Final() {
			continue
		}
		if c := cs[0].Value; c.Status != p.kind.want || c.Attempt != 2 || c.Subject != p.subject || cs[0].URI.RecordKey().String() != forge.AttemptKey(p.subject, "chaos", 2) {
			t.Errorf("re-run %s of push %s (%s): %s attempt %d at %s (%s), want %s, attempt 2", r.uri, p.commit, p.kind.name, c.Status, c.Attempt,
				cs[0].URI.RecordKey(), c.Error, p.kind.want)
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

// byAttempt lists the runner's checks of first attempts by key, and
// the others by the record that caused them.
func (w *world) byAttempt() (firsts, caused map[string][]forge.Record[forge.Check]) {
	firsts, caused = map[string][]forge.Record[forge.Check]{}, map[string][]forge.Record[forge.Check]{}
	for _, cs := range w.allChecks() {
		for _, c := range cs {
			if c.Value.Cause != "" {
				caused[c.Value.Cause] = append(caused[c.Value.Cause], c)
				continue
			}
			firsts[c.URI.RecordKey().String()] = append(firsts[c.URI.RecordKey().String()], c)
		}
	}
	return firsts, caused
}

// pushRecord commits files on branch and writes the refUpdate; it
// returns the record's AT-URI and the commit.
func (w *world) pushRecord(branch string, files map[string]string) (syntax.ATURI, string) {
	w.t.Helper()
	ref := "refs/heads/" + branch
	old := w.Src.Head(ref)
	trimmed := map[string]string{}
	for name, content := range files {
		trimmed[name] = strings.TrimLeft(content, "\n")
	}
	commit := w.Src.Commit(branch, trimmed)
	uri := w.Put(w.Owner, forge.CollectionRefUpdate, "", forge.RefUpdate{
		Type: forge.CollectionRefUpdate, Repo: w.RepoURI.String(), Ref: ref, Old: old, New: commit, CreatedAt: forge.Now(),
	})
	return uri, commit
}

// spread sums durations up: how many, the median, p95 and the longest.
func spread(ds []time.Duration) string {
	slices.Sort(ds)
	n := len(ds)
	if n == 0 {
		return "none"
	}
	return fmt.Sprintf("%d, median %s, p95 %s, max %s", n, ds[n/2].Round(10*time.Millisecond),
		ds[(n*95+99)/100-1].Round(10*time.Millisecond), ds[n-1].Round(10*time.Millisecond))
}

// allChecks lists the runner's checks by commit.
func (w *world) allChecks() map[string][]forge.Record[forge.Check] {
	w.t.Helper()
	recs, _, err := pdsclient.List[forge.Check](context.Background(), w.Reader, w.Runner.DID, forge.CollectionCheck)
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
