package latency

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
)

// envEventsAtOnce sets how many pushes TestServeEventsAtOnceOnPDS
// writes (50 by default; the figure is 1,000). The daemon's
// in-memory rig's TestServeEventsAtOnce (internal/daemon) reads it too.
const envEventsAtOnce = "KNOTLESS_EVENTS_AT_ONCE"

// TestServeEventsAtOnceOnPDS is TestServeEventsAtOnce (internal/daemon)
// on the real PDS, through `serve` as a process of its own on the
// shell executor: N pushes, each to a branch of its own (none
// supersedes another) with a commit of its own, are written to the PDS
// before serve starts, so that its first listing finds them all at
// once. Its 4 workers are held by their steps (each waits for a file
// the test makes). Asserted, while they are held: every push has its
// one check, none dropped: 4 running, the others queued, their
// queuedBehind each of 0 to N-5 once; once released, every check ends
// success on its own commit, and serve's metrics count N-4 queued, N
// running and N success checks written. The times are logged, not
// asserted.
//
//	KNOTLESS_EVENTS_AT_ONCE=1000 go test -count=1 -timeout 30m -run '^TestServeEventsAtOnceOnPDS$' -v ./tests/latency
func TestServeEventsAtOnceOnPDS(t *testing.T) {
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	n := 50
	if s := os.Getenv(envEventsAtOnce); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 5 {
			t.Fatalf("%s=%q: want a count of 5 or more", envEventsAtOnce, s)
		}
	}
	const workers = 4
	srv := startPDS(t)
	w := forgeworld.New(t, srv, forgeworld.Options{App: "atonce"})
	gate := filepath.Join(t.TempDir(), "gate")
	wf := fmt.Sprintf("on: [push]\nsteps:\n  - name: held\n    run: 'while [ ! -e %s ]; do sleep 0.2; done'\n", gate)

	// The commits: one tree, N commits on main's, each on its branch.
	base := w.Src.Commit("main", map[string]string{".knotless/workflows/ci.yaml": wf})
	tree := w.Src.Git("rev-parse", base+"^{tree}")
	commits := make([]string, n)
	var refs strings.Builder
	for i := range commits {
		commits[i] = w.Src.Git("commit-tree", tree, "-p", base, "-m", fmt.Sprintf("push %d", i))
		fmt.Fprintf(&refs, "create refs/heads/at-%04d %s\n", i, commits[i])
	}
	cmd := exec.Command("git", "-C", w.Src.Dir, "update-ref", "--stdin")
	cmd.Stdin = strings.NewReader(refs.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git update-ref: %v\n%s", err, out)
	}

	// The refUpdates, written by a few writers at once.
	t0 := time.Now()
	uris := make([]syntax.ATURI, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				uris[i], errs[i] = w.Owner.Put(context.Background(), forge.CollectionRefUpdate, "", forge.RefUpdate{Type: forge.CollectionRefUpdate,
					Repo: w.RepoURI.String(), Ref: fmt.Sprintf("refs/heads/at-%04d", i), Old: "", New: commits[i], CreatedAt: forge.Now()})
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
	}
	written := time.Since(t0)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = forge.CheckKey(forge.Subject{Repo: w.RepoURI.String(), Commit: commits[i], Ref: fmt.Sprintf("refs/heads/at-%04d", i),
			Event: uris[i].String(), Kind: forge.KindPush}, "ci")
	}

	shell := []string{"--executor", "shell", "--shell-root", t.TempDir()}
	t1 := time.Now()
	d := startServeOn(t, w, shell, "", []string{"--concurrency", strconv.Itoa(workers), "--log-blobs", "never", "--metrics-listen", "127.0.0.1:0"})
	ready := time.Since(t1)
	listening, ok := d.logs.wait(time.Time{}, time.Minute, func(r record) bool { return r.Msg == "serving metrics" })
	if !ok {
		t.Fatalf("serve: no metrics address\n%s", d.logs.text())
	}
	metricsURL, _ := listening.Fields["address"].(string)

	// Held: every push gets its check.
	deadline := time.Now().Add(time.Duration(n)*200*time.Millisecond + 3*time.Minute)
	var checks map[string]forge.Check
	for {
		checks = checksByKey(t, w)
		have := 0
		for _, k := range keys {
			if _, ok := checks[k]; ok {
				have++
			}
		}
		if have == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pushes have a check after %s\n%s", have, n, time.Since(t1), d.logs.text())
		}
		time.Sleep(500 * time.Millisecond)
	}
	allChecked := time.Since(t1)
	running, behind := 0, map[int64]int{}
	for i, k := range keys {
		switch ch := checks[k]; {
		case ch.Subject.Commit != commits[i]:
			t.Errorf("push %d: check on %s, want %s", i, ch.Subject.Commit, commits[i])
		case ch.Status == forge.StatusRunning:
			running++
		case ch.Status == forge.StatusQueued:
			behind[ch.QueuedBehind]++
		default:
			t.Errorf("push %d: check %s (%s) while the workers are held, want running or queued", i, ch.Status, ch.Error)
		}
	}
	queued := 0
	for b, k := range behind {
		queued += k
		if k != 1 || b < 0 || b >= int64(n-workers) {
			t.Errorf("%d queued checks say %d runs wait ahead, want one each of 0 to %d", k, b, n-workers-1)
		}
	}
	t.Logf("%d events at once on the PDS: %d running, %d queued (%d distinct positions), %d without a check", n, running, queued, len(behind), n-running-queued)
	if running != workers || queued != n-workers {
		t.Fatalf("%d running and %d queued, want %d and %d", running, queued, workers, n-workers)
	}

	// Released: every one ends success.
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t2 := time.Now()
	deadline = time.Now().Add(time.Duration(n)*time.Second + 3*time.Minute)
	for {
		checks = checksByKey(t, w)
		final := 0
		for i, k := range keys {
			ch := checks[k]
			if !ch.Final() {
				continue
			}
			final++
			if ch.Status != "success" || ch.Subject.Commit != commits[i] {
				t.Fatalf("push %d: final check %s (%s) on %s, want success on %s\n%s", i, ch.Status, ch.Error, ch.Subject.Commit, commits[i], d.logs.text())
			}
		}
		if final == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d checks final %s after the release\n%s", final, n, time.Since(t2), d.logs.text())
		}
		time.Sleep(time.Second)
	}
	// Each check written once queued (but the workers' first 4), once
	// running, once success: the runner's own count of its writes.
	// (Its count follows the write, which the PDS shows first.)
	m := scrape(t, metricsURL)
	for end := time.Now().Add(30 * time.Second); int(m[`knotless_run_check_writes_total{status="success"}`]) < n && time.Now().Before(end); {
		time.Sleep(200 * time.Millisecond)
		m = scrape(t, metricsURL)
	}
	writes := 0.0
	for status, want := range map[string]int{"queued": n - workers, "running": n, "success": n} {
		got := m[`knotless_run_check_writes_total{status="`+status+`"}`]
		writes += got
		if int(got) != want {
			t.Errorf("serve wrote %.0f %s checks, want %d", got, status, want)
		}
	}
	t.Logf("%d events at once on the PDS: %.0f check writes", n, writes)
	t.Logf("%d events at once on the PDS: written by 8 writers in %s; serve ready %s after; every push checked %s after serve started; all %d success %s after the release",
		n, written.Round(time.Millisecond), ready.Round(time.Millisecond), allChecked.Round(time.Millisecond), n, time.Since(t2).Round(time.Millisecond))
}
