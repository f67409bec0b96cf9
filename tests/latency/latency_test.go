// Package latency measures the runner end to end: `knotless-run serve`
// as a process of its own, a real PDS (tests/pds) and the test cluster
// (tests/cluster), the owner's pushes written as a client would write
// them. Where the time goes is read from the daemon's own log records
// (JSON, with their sub-second timestamps), not from the outside.
//
//	tests/cluster/up && eval "$(tests/cluster/env)"
//	go test ./tests/latency -run XXX -bench PushToCheck -benchtime 10x
package latency

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/cli"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/gitrepo"
	"knotless.dev/run/tests/pds"
)

// envServe makes the test binary the serve process (serveHelper);
// envHeap, when set, is where it writes a heap profile as it exits.
const (
	envServe = "KNOTLESS_LATENCY_SERVE"
	envHeap  = "KNOTLESS_LATENCY_HEAP_PROFILE"
	// envTimeline set: BenchmarkBurstToRunning logs each burst's
	// daemon records, from the first event to the last running check,
	// and the processor time each command on the machine used meanwhile.
	envTimeline = "KNOTLESS_LATENCY_TIMELINE"
)

func TestMain(m *testing.M) {
	if os.Getenv(envServe) == "1" {
		serveHelper()
		return
	}
	clustertest.Main(m)
}

// serveHelper runs knotless-run with the arguments after "--".
func serveHelper() {
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	env := cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
	code := cli.Main(context.Background(), args, env)
	if name := os.Getenv(envHeap); name != "" {
		writeHeapProfile(name)
	}
	os.Exit(code)
}

// writeHeapProfile writes the heap in use, after a collection, to name.
func writeHeapProfile(name string) {
	f, err := os.Create(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, "heap profile:", err)
		return
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		fmt.Fprintln(os.Stderr, "heap profile:", err)
	}
	// Beside it, where the rest of the process's memory is.
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	stats := fmt.Sprintf("HeapInuse %d\nHeapIdle %d\nHeapReleased %d\nStackInuse %d\nSys %d\nNumGC %d\n",
		m.HeapInuse, m.HeapIdle, m.HeapReleased, m.StackInuse, m.Sys, m.NumGC)
	if err := os.WriteFile(name+".memstats", []byte(stats), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "heap profile:", err)
	}
}

// oneStep is the workflow: one trivial step.
const oneStep = "on: [push]\nsteps:\n  - name: hi\n    run: echo hi\n"

// BenchmarkPushToCheck pushes the one-step workflow to a repository a
// `serve` process on the Kubernetes executor watches, one push at a
// time, and reports the medians of where the time goes, in
// milliseconds: from the push record written (what a client such as
// goat returns after) to the final check visible on the PDS, and
// within it, from the daemon's own records: the event received (the
// event stream's hint), the Job created, its pod Ready, the final check
// written, and the clean-up (the Job deleted and its pod gone; negative
// when it came before the final check).
func BenchmarkPushToCheck(b *testing.B) {
	c := clustertest.Start(b)
	srv := startPDS(b)
	w := forgeworld.New(b, srv, forgeworld.Options{App: "latency"})
	d := startServe(b, w, c, "", nil)

	d.push(b, w, -1) // the first run: the network policies made, the image warm
	var phases phaseSet
	for i := 0; b.Loop(); i++ {
		p := d.push(b, w, i)
		phases.add(p)
	}
	phases.report(b)
}

// BenchmarkPushToCheckWarm is BenchmarkPushToCheck with `--warm-pods 1`:
// each push waits until the pool's pod is Ready (on the one-node test
// cluster the replacement starts once the last run's pod is gone), so
// that every run takes a warm pod. The job created and pod Ready moments
// are then both the warm pod taken.
func BenchmarkPushToCheckWarm(b *testing.B) {
	c := clustertest.Start(b)
	srv := startPDS(b)
	w := forgeworld.New(b, srv, forgeworld.Options{App: "latency"})
	d := startServe(b, w, c, "", []string{"--warm-pods", "1"})

	since := time.Time{}
	warmPush := func(i int) pushTimes {
		if _, ok := d.logs.wait(since, 2*time.Minute, func(r record) bool {
			job, _ := r.Fields["job"].(string)
			return r.Msg == "pod ready" && strings.HasPrefix(job, "knotless-warm-") && r.Fields["run"] == nil
		}); !ok {
			b.Fatalf("push %d: no warm pod ready\n%s", i, d.logs.text())
		}
		p := d.push(b, w, i)
		if !p.warm {
			b.Fatalf("push %d: the run did not take the warm pod\n%s", i, d.logs.text())
		}
		since = p.jobCreated
		return p
	}
	warmPush(-1)
	var phases phaseSet
	for i := 0; b.Loop(); i++ {
		phases.add(warmPush(i))
	}
	phases.report(b)
}

// startPDS starts a PDS of the benchmark's own.
func startPDS(tb testing.TB) *pds.Server {
	tb.Helper()
	return startPDSWith(tb, pds.Options{})
}

// startPDSWith is startPDS with options.
func startPDSWith(tb testing.TB, o pds.Options) *pds.Server {
	tb.Helper()
	if err := pds.Installed(); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := pds.StartWith(ctx, tb.TempDir(), o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(srv.Stop)
	return srv
}

// daemon is a serve process and its log records.
type daemon struct {
	cmd  *exec.Cmd
	logs *records
	done chan struct{}
	// stop interrupts the process and waits for it to end; once, from
	// the test or its clean-up, whichever comes first.
	stop func()
}

// startServe starts serve on the cluster for w's repository, with
// extra arguments (flags, more repositories), and waits until it is
// ready. The process is bin (a knotless-run binary), or with bin ""
// this test binary run as knotless-run (serveHelper).
func startServe(tb testing.TB, w *forgeworld.World, c *clustertest.Cluster, bin string, extra []string) *daemon {
	tb.Helper()
	executor := []string{"--executor", "kubernetes", "--kubeconfig", c.Kubeconfig, "--namespace", c.Namespace, "--image", c.Image}
	return startServeOn(tb, w, executor, bin, extra)
}

// startServeOn is startServe with the executor's flags given.
func startServeOn(tb testing.TB, w *forgeworld.World, executor []string, bin string, extra []string) *daemon {
	tb.Helper()
	dir := tb.TempDir()
	pw := filepath.Join(dir, "app-password")
	if err := os.WriteFile(pw, []byte(w.Password+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	args := []string{"--log-format", "json", "--log-level", "debug", "serve",
		"--did", w.Runner.DID.String(), "--pds", w.Server.PublicURL, "--plc-url", w.Server.PLCURL,
		"--app-password-file", pw, "--state-dir", filepath.Join(dir, "state"), "--cache-dir", filepath.Join(dir, "cache"),
		"--allow-local-sources", "--poll", "10m", "--stop-wait", "1m"}
	args = append(append(append(args, executor...), extra...), w.Owner.DID.String()+"/"+forgeworld.RepoName)
	var cmd *exec.Cmd
	if bin != "" {
		cmd = exec.Command(bin, args...)
	} else {
		cmd = exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
		cmd.Env = append(os.Environ(), envServe+"=1")
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	d := &daemon{cmd: cmd, logs: &records{}, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		d.logs.read(stderr)
	}()
	d.stop = sync.OnceFunc(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		<-d.done
		_ = cmd.Wait()
	})
	tb.Cleanup(func() {
		d.stop()
		if tb.Failed() {
			tb.Logf("serve log:\n%s", d.logs.text())
		}
	})
	// Ready, and following the PDS's event stream (it starts once the
	// first reconcile has found the repository's host).
	for _, msg := range []string{"ready", "following events"} {
		if _, ok := d.logs.wait(time.Time{}, 2*time.Minute, func(r record) bool { return r.Msg == msg }); !ok {
			tb.Fatalf("serve: no %q\n%s", msg, d.logs.text())
		}
	}
	return d
}

// pushTimes are one push's moments: sent as the push record's write
// began, t0 as it returned, the rest the daemon's records, and visible
// when the final check was seen on the PDS.
type pushTimes struct {
	sent, t0, event, listed, jobCreated, podReady, firstStep, verdict, finalWritten, visible, cleaned time.Time
	warm                                                                                              bool // the run took a warm pod: jobCreated and podReady are when
}

// push commits a change on main (the workflow file is there from the
// first push) and waits for its final check on the PDS and for the
// clean-up of its Job.
func (d *daemon) push(tb testing.TB, w *forgeworld.World, i int) pushTimes {
	tb.Helper()
	r := mainRepo(w)
	old, commit := r.commit(i)
	sent := time.Now()
	uri := w.PushCommit(old, commit)
	t0 := time.Now()
	return d.settle(tb, w, r.checkKey(commit, uri), i, sent, t0)
}

// repo is a repository of w's owner that the runner watches, and its
// git source.
type repo struct {
	uri syntax.ATURI
	src *gitrepo.Repo
}

// mainRepo is forgeworld's repository.
func mainRepo(w *forgeworld.World) repo { return repo{uri: w.RepoURI, src: w.Src} }

// commit commits push i's change on main (with the workflow file) and
// returns main's commit before it and the new one.
func (r repo) commit(i int) (old, commit string) {
	files := map[string]string{"n.txt": fmt.Sprintf("%d\n", i), ".knotless/workflows/ci.yaml": oneStep}
	old = r.src.Head("refs/heads/main")
	return old, r.src.Commit("main", files)
}

// checkKey is the key of the check of the push of commit that the
// refUpdate event wrote.
func (r repo) checkKey(commit string, event syntax.ATURI) string {
	return forge.CheckKey(forge.Subject{Repo: r.uri.String(), Commit: commit, Ref: "refs/heads/main", Event: event.String(), Kind: forge.KindPush}, "ci")
}

// settle waits for the final check of key (a push sent at sent and
// written at t0) on the PDS and for the clean-up of its Job, and reads
// the push's moments from the daemon's records, from sent on: the
// event stream may tell the daemon of the push before its write
// returns.
func (d *daemon) settle(tb testing.TB, w *forgeworld.World, key string, i int, sent, t0 time.Time) pushTimes {
	tb.Helper()
	p := pushTimes{sent: sent, t0: t0}
	checkURI := "at://" + w.Runner.DID.String() + "/" + forge.CollectionCheck + "/" + key
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var ch forge.Check
		_, err := w.Reader.Get(context.Background(), mustATURI(tb, checkURI), &ch)
		if err == nil && ch.Final() {
			p.visible = time.Now()
			if ch.Status != "success" {
				tb.Fatalf("push %d: check %s: %s\n%s", i, ch.Status, ch.Error, d.logs.text())
			}
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("push %d: no final check after 3 min\n%s", i, d.logs.text())
		}
		time.Sleep(20 * time.Millisecond)
	}
	find := func(what string, match func(record) bool) time.Time {
		r, ok := d.logs.wait(p.sent, time.Minute, match)
		if !ok {
			tb.Fatalf("push %d: no %s in the serve log\n%s", i, what, d.logs.text())
		}
		return r.Time
	}
	p.event = find("event", func(r record) bool {
		return r.Msg == "records changed" && r.Fields["collection"] == forge.CollectionRefUpdate
	})
	// The reconcile the event woke: its listing done.
	r, ok := d.logs.wait(p.event, time.Minute, func(r record) bool { return r.Msg == "listed" })
	if !ok {
		tb.Fatalf("push %d: no listing after the event in the serve log\n%s", i, d.logs.text())
	}
	p.listed = r.Time
	p.finalWritten = find("final check written", func(r record) bool {
		return r.Msg == "run finished" && r.Fields["check"] == key
	})
	run := ""
	find("run started", func(r record) bool {
		if r.Msg == "run started" && r.Fields["check"] == key {
			run, _ = r.Fields["run"].(string)
			return true
		}
		return false
	})
	ofRun := func(msg string) func(record) bool {
		return func(r record) bool { return r.Msg == msg && r.Fields["run"] == run }
	}
	p.jobCreated = find("job created or warm pod taken", func(r record) bool {
		return (r.Msg == "job created" || r.Msg == "warm pod taken") && r.Fields["run"] == run
	})
	if r, ok := d.logs.wait(p.sent, 0, ofRun("warm pod taken")); ok {
		p.warm, p.podReady = true, r.Time
	} else {
		p.podReady = find("pod ready", ofRun("pod ready"))
	}
	p.firstStep = find("first step started", ofRun("step started in pod"))
	p.cleaned = find("job deleted", ofRun("job deleted"))
	// The engine's verdict: its own "run finished" (the daemon's names
	// the check, and comes after the final check is written).
	p.verdict = find("verdict", func(r record) bool {
		return r.Msg == "run finished" && r.Fields["run"] == run && r.Fields["check"] == nil
	})
	return p
}

// phaseSet collects each push's phases.
type phaseSet struct{ pushes []pushTimes }

func (s *phaseSet) add(p pushTimes) { s.pushes = append(s.pushes, p) }

func (s *phaseSet) report(b *testing.B) {
	phases := []struct {
		unit     string
		from, to func(pushTimes) time.Time
	}{
		{"push-to-visible-ms", func(p pushTimes) time.Time { return p.t0 }, func(p pushTimes) time.Time { return p.visible }},
		{"push-to-event-ms", func(p pushTimes) time.Time { return p.t0 }, func(p pushTimes) time.Time { return p.event }},
		{"event-to-final-ms", func(p pushTimes) time.Time { return p.event }, func(p pushTimes) time.Time { return p.finalWritten }},
		{"event-to-listed-ms", func(p pushTimes) time.Time { return p.event }, func(p pushTimes) time.Time { return p.listed }},
		{"event-to-job-ms", func(p pushTimes) time.Time { return p.event }, func(p pushTimes) time.Time { return p.jobCreated }},
		{"job-to-ready-ms", func(p pushTimes) time.Time { return p.jobCreated }, func(p pushTimes) time.Time { return p.podReady }},
		{"event-to-first-step-ms", func(p pushTimes) time.Time { return p.event }, func(p pushTimes) time.Time { return p.firstStep }},
		{"ready-to-final-ms", func(p pushTimes) time.Time { return p.podReady }, func(p pushTimes) time.Time { return p.finalWritten }},
		{"ready-to-verdict-ms", func(p pushTimes) time.Time { return p.podReady }, func(p pushTimes) time.Time { return p.verdict }},
		{"verdict-to-final-ms", func(p pushTimes) time.Time { return p.verdict }, func(p pushTimes) time.Time { return p.finalWritten }},
		{"final-to-cleaned-ms", func(p pushTimes) time.Time { return p.finalWritten }, func(p pushTimes) time.Time { return p.cleaned }},
		{"final-to-visible-ms", func(p pushTimes) time.Time { return p.finalWritten }, func(p pushTimes) time.Time { return p.visible }},
	}
	for _, ph := range phases {
		var ds []time.Duration
		for _, p := range s.pushes {
			ds = append(ds, ph.to(p).Sub(ph.from(p)))
		}
		b.ReportMetric(ms(median(ds)), ph.unit)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// record is one log record of the daemon (--log-format json).
type record struct {
	Time   time.Time
	Msg    string
	Fields map[string]any
}

// records keeps the daemon's log records as they come.
type records struct {
	mu      sync.Mutex
	all     []record
	raw     strings.Builder
	changed chan struct{}
}

func (rs *records) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var f map[string]any
		rec := record{}
		if json.Unmarshal([]byte(line), &f) == nil {
			rec.Fields = f
			rec.Msg, _ = f["msg"].(string)
			if ts, ok := f["time"].(string); ok {
				rec.Time, _ = time.Parse(time.RFC3339Nano, ts)
			}
		}
		rs.mu.Lock()
		rs.raw.WriteString(line + "\n")
		if rec.Msg != "" {
			rs.all = append(rs.all, rec)
		}
		if rs.changed != nil {
			close(rs.changed)
			rs.changed = nil
		}
		rs.mu.Unlock()
	}
}

// wait returns the first record at or after since that match says
// is the one, waiting up to timeout for it. The daemon's records carry
// milliseconds only, so since counts from its millisecond.
func (rs *records) wait(since time.Time, timeout time.Duration, match func(record) bool) (record, bool) {
	since = since.Truncate(time.Millisecond)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		rs.mu.Lock()
		for _, r := range rs.all {
			if !r.Time.Before(since) && match(r) {
				rs.mu.Unlock()
				return r, true
			}
		}
		if rs.changed == nil {
			rs.changed = make(chan struct{})
		}
		ch := rs.changed
		rs.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			return record{}, false
		}
	}
}

// timeline logs the records from..to, each at its time after from in
// milliseconds (-v shows them).
func (rs *records) timeline(tb testing.TB, what string, from, to time.Time) {
	tb.Helper()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var b strings.Builder
	for _, r := range rs.all {
		if r.Time.Before(from) || r.Time.After(to) {
			continue
		}
		fmt.Fprintf(&b, "\n%7.1f ms  %s", float64(r.Time.Sub(from).Microseconds())/1000, r.Msg)
		if c, ok := r.Fields["check"].(string); ok {
			fmt.Fprintf(&b, " check=%s", c)
		}
		if a, ok := r.Fields["at_once"].(bool); ok {
			fmt.Fprintf(&b, " at_once=%v", a)
		}
	}
	tb.Logf("%s, from the first event received:%s", what, b.String())
}

func (rs *records) text() string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.raw.String()
}

func mustATURI(tb testing.TB, s string) syntax.ATURI {
	tb.Helper()
	u, err := syntax.ParseATURI(s)
	if err != nil {
		tb.Fatal(err)
	}
	return u
}

// BenchmarkServeRSS reports the resident memory of a `serve` process on
// the Kubernetes executor (VmRSS of /proc/PID/status, in MB): idle once
// it is ready and follows the PDS's event stream, then after 20
// one-step runs, one after another. The process is knotless-run built
// as the Nix package builds it (buildBinary): most of its resident
// memory is pages of its own binary that package initialisation
// touched, so this test binary (which links and initialises the test
// harnesses too) would measure them wrong. With
// KNOTLESS_LATENCY_HEAP_PROFILE=FILE in the environment the process is
// this test binary instead (serveHelper), and it writes its heap in use
// to FILE as it exits (go tool pprof -top -inuse_space FILE).
func BenchmarkServeRSS(b *testing.B) {
	bin := ""
	if os.Getenv(envHeap) == "" {
		bin = buildBinary(b)
	}
	c := clustertest.Start(b)
	srv := startPDS(b)
	w := forgeworld.New(b, srv, forgeworld.Options{App: "latency"})
	d := startServe(b, w, c, bin, nil)
	pid := d.cmd.Process.Pid
	idle, idleAnon := memMB(b, pid, "VmRSS"), memMB(b, pid, "RssAnon")
	for i := range 20 {
		d.push(b, w, i)
	}
	after, afterAnon := memMB(b, pid, "VmRSS"), memMB(b, pid, "RssAnon")
	// Idle again: the runtime returns freed heap to the system in the
	// background, over tens of seconds.
	time.Sleep(idleAgain)
	rested, restedAnon := memMB(b, pid, "VmRSS"), memMB(b, pid, "RssAnon")
	for b.Loop() {
		// The figures are the process's, not the loop's.
	}
	b.ReportMetric(idle, "rss-idle-MB")
	b.ReportMetric(idleAnon, "rss-anon-idle-MB")
	b.ReportMetric(after, "rss-after-20-runs-MB")
	b.ReportMetric(afterAnon, "rss-anon-after-20-runs-MB")
	b.ReportMetric(rested, "rss-idle-after-20-runs-MB")
	b.ReportMetric(restedAnon, "rss-anon-idle-after-20-runs-MB")
}

// idleAgain is how long BenchmarkServeRSS leaves the daemon idle after
// its runs before it reads its memory again.
const idleAgain = 30 * time.Second

// BenchmarkServeRSSPerRun reports what a run in hand adds to the
// resident memory of `serve` (VmRSS and RssAnon, MB per run), built as
// BenchmarkServeRSS builds it, with --concurrency 8 and 8 repositories
// watched. It reads the memory idle; after one run (the code of a
// run's path touched once, the connections to the API server and the
// PDS made); once the 8 running checks of a first burst of 8 pushes are
// written (8 runs in hand, 7 repositories new to the process); after
// that burst; and once the 8 running checks of a second burst are
// written. The cluster's one node takes one run at a time: of the 8
// runs in hand, one has its pod running and the others wait for
// theirs, Pending, each with its Job, its watch and its goroutines in
// the daemon.
//
//	go test ./tests/latency -run XXX -bench ServeRSSPerRun -benchtime 1x
func BenchmarkServeRSSPerRun(b *testing.B) {
	const runs = 8
	bin := buildBinary(b)
	c := clustertest.Start(b)
	srv := startPDS(b)
	w := forgeworld.New(b, srv, forgeworld.Options{App: "latency"})
	repos, extra := reposAtOnce(b, w, runs)
	d := startServe(b, w, c, bin, extra)
	pid := d.cmd.Process.Pid
	rss := func() (float64, float64) { return memMB(b, pid, "VmRSS"), memMB(b, pid, "RssAnon") }
	idle, idleAnon := rss()
	n := 0
	d.burst(b, w, repos[:1], &n, nil)
	one, oneAnon := rss()
	var firstInHand, firstInHandAnon float64
	d.burst(b, w, repos, &n, func() { firstInHand, firstInHandAnon = rss() })
	before, beforeAnon := rss()
	var inHand, inHandAnon float64
	d.burst(b, w, repos, &n, func() { inHand, inHandAnon = rss() })
	for b.Loop() {
		// The figures are the process's, not the loop's.
	}
	b.ReportMetric(idle, "rss-idle-MB")
	b.ReportMetric(one, "rss-after-one-run-MB")
	b.ReportMetric(one-idle, "rss-first-run-MB")
	b.ReportMetric(oneAnon-idleAnon, "rss-anon-first-run-MB")
	// The first burst, over a process that has made one run: the
	// one-time costs of a run's path left out, those of the 7 new
	// repositories (their mirrors) in.
	b.ReportMetric((firstInHand-one)/runs, "rss-first-burst-per-run-MB")
	b.ReportMetric((firstInHandAnon-oneAnon)/runs, "rss-anon-first-burst-per-run-MB")
	// The second burst, over a process that has had 8 runs in hand.
	b.ReportMetric(inHand, "rss-8-in-hand-MB")
	b.ReportMetric((inHand-before)/runs, "rss-per-run-MB")
	b.ReportMetric((inHandAnon-beforeAnon)/runs, "rss-anon-per-run-MB")
}

// buildBinary builds knotless-run from this checkout as nix/package.nix
// does: no cgo, -trimpath, the symbol table stripped (-s).
func buildBinary(tb testing.TB) string {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), "knotless-run")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s", "-o", bin, "knotless.dev/run/cmd/knotless-run")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// memMB reads field (VmRSS, RssAnon: its anonymous part, not pages of
// files such as the binary) of /proc/PID/status, in MB.
func memMB(tb testing.TB, pid int, field string) float64 {
	tb.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			var kb float64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%f kB", &kb); err != nil {
				tb.Fatal(err)
			}
			return kb / 1024
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
