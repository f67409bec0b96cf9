package daemon_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/forge"
)

// waitFile waits for a file a step creates.
func (w *world) waitFile(name string, timeout time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(name); err == nil {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s not created after %s\nlog:\n%s", name, timeout, w.logText())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitStatus waits until a check of workflow on commit was written with
// status.
func (w *world) waitStatus(workflow, commit, status string, timeout time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for !slices.Contains(w.checkLog.statuses(workflow, commit), status) {
		if time.Now().After(deadline) {
			w.t.Fatalf("no %s check of %s on %s after %s; writes: %v\nlog:\n%s", status, workflow, commit, timeout,
				w.checkLog.statuses(workflow, commit), w.logText())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pushBranch commits files on branch and writes the refUpdate.
func (w *world) pushBranch(branch string, files map[string]string) (syntax.ATURI, string) {
	w.t.Helper()
	commit := w.Src.Commit(branch, files)
	uri := w.Put(w.Owner, forge.CollectionRefUpdate, "", forge.RefUpdate{
		Type: forge.CollectionRefUpdate, Repo: w.RepoURI.String(), Ref: "refs/heads/" + branch, New: commit, CreatedAt: forge.Now(),
	})
	return uri, commit
}

// waitFor is a sh loop that waits up to about 30 s for a file, then
// fails the step.
func waitFor(name string) string {
	return `i=0; while [ ! -e ` + name + ` ]; do i=$((i+1)); if [ $i -gt 150 ]; then echo "never saw ` + name + `"; exit 1; fi; sleep 0.2; done`
}

// TestSupersedeCancels: a newer push to the same ref cancels the older
// run of the same workflow while it runs; its check says which event
// superseded it, and the newer run succeeds.
func TestSupersedeCancels(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	started := filepath.Join(t.TempDir(), "started")
	_, old := w.Push(map[string]string{".knotless/workflows/build.yaml": workflowFile(`
on: [push]
steps:
  - name: slow
    run: |
      touch ` + started + `
      sleep 600
`)})
	// StopWait 0: should the run not be cancelled, the test's end does
	// not wait for the sleep.
	w.start(w.config(func(c *daemon.Config) { c.StopWait = 0 }))
	w.waitFile(started, 30*time.Second)

	newer, commit := w.Push(map[string]string{".knotless/workflows/build.yaml": workflowFile(`
on: [push]
steps:
  - name: fast
    run: echo fast
`)})
	_, got := w.waitFinal("build", old, 30*time.Second)
	if got.Status != "cancelled" || got.Error != "superseded by "+newer.String() {
		t.Errorf("older run: got %s %q, want cancelled, superseded by %s", got.Status, got.Error, newer)
	}
	_, got = w.waitFinal("build", commit, 30*time.Second)
	if got.Status != "success" {
		t.Errorf("newer run: got %s (%s), want success", got.Status, got.Error)
	}
	if diff := cmp.Diff([]string{"running", "cancelled"}, w.checkLog.statuses("build", old)); diff != "" {
		t.Errorf("older run's check writes (-want +got):\n%s", diff)
	}
}

// TestSupersedeQueued: with the one worker busy, of two pushes to the
// same ref the older one's run waits in the queue, is cancelled there
// when the newer one arrives and never runs.
func TestSupersedeQueued(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	dir := t.TempDir()
	started, release := filepath.Join(dir, "started"), filepath.Join(dir, "release")
	// A run on another branch holds the only worker until released.
	_, hold := w.pushBranch("hold", map[string]string{".knotless/workflows/hold.yaml": workflowFile(`
on: [push]
branches: [hold]
steps:
  - name: hold
    run: |
      touch ` + started + `
      ` + waitFor(release) + `
`)})
	w.start(w.config())
	w.waitFile(started, 30*time.Second)

	build := func(msg string) map[string]string {
		return map[string]string{".knotless/workflows/build.yaml": "on: [push]\nbranches: [main]\nsteps:\n  - name: build\n    run: echo " + msg + "\n"}
	}
	_, middle := w.Push(build("middle"))
	newest, last := w.Push(build("newest"))
	w.waitStatus("build", last, "queued", 30*time.Second)
	w.waitStatus("build", middle, "cancelled", 30*time.Second)
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	if _, got := w.waitFinal("hold", hold, 30*time.Second); got.Status != "success" {
		t.Errorf("holding run: got %s (%s), want success", got.Status, got.Error)
	}
	if _, got := w.waitFinal("build", last, 30*time.Second); got.Status != "success" {
		t.Errorf("newest run: got %s (%s), want success", got.Status, got.Error)
	}
	_, got := w.waitFinal("build", middle, 30*time.Second)
	if got.Status != "cancelled" || got.Error != "superseded by "+newest.String() || got.StartedAt != "" {
		t.Errorf("middle run: got %s %q started %q, want cancelled before it started, superseded by %s", got.Status, got.Error, got.StartedAt, newest)
	}
	if diff := cmp.Diff([]string{"queued", "cancelled"}, w.checkLog.statuses("build", middle)); diff != "" {
		t.Errorf("middle run's check writes (-want +got):\n%s", diff)
	}
}

// TestSupersededFinish: a newer push whose workflow says superseded:
// finish lets the older run finish; both succeed. The older commit's file
// says nothing (cancel, the default): the newer push's file decides.
func TestSupersededFinish(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	dir := t.TempDir()
	started, release := filepath.Join(dir, "started"), filepath.Join(dir, "release")
	_, old := w.Push(map[string]string{".knotless/workflows/deploy.yaml": workflowFile(`
on: [push]
steps:
  - name: slow
    run: |
      touch ` + started + `
      ` + waitFor(release) + `
`)})
	// Two workers, so the newer run goes while the older one waits.
	w.start(w.config(func(c *daemon.Config) { c.Scheduler.Concurrency = 2 }))
	w.waitFile(started, 30*time.Second)

	_, commit := w.Push(map[string]string{".knotless/workflows/deploy.yaml": workflowFile(`
on: [push]
superseded: finish
steps:
  - name: fast
    run: echo fast
`)})
	if _, got := w.waitFinal("deploy", commit, 30*time.Second); got.Status != "success" {
		t.Fatalf("newer run: got %s (%s), want success", got.Status, got.Error)
	}
	if diff := cmp.Diff([]string{"running"}, w.checkLog.statuses("deploy", old)); diff != "" {
		t.Fatalf("older run's check writes (-want +got): want it still running:\n%s", diff)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, got := w.waitFinal("deploy", old, 30*time.Second)
	if got.Status != "success" || got.Error != "" {
		t.Errorf("older run: got %s %q, want success", got.Status, got.Error)
	}
	if diff := cmp.Diff([]string{"running", "success"}, w.checkLog.statuses("deploy", old)); diff != "" {
		t.Errorf("older run's check writes (-want +got):\n%s", diff)
	}
}

// TestConcurrency: with two workers, the two workflows of one push run
// at the same time: each waits for the other to have started.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	dir := t.TempDir()
	wf := func(me, other string) string {
		return workflowFile(`
on: [push]
steps:
  - name: meet
    run: |
      touch ` + filepath.Join(dir, me) + `
      ` + waitFor(filepath.Join(dir, other)) + `
`)
	}
	_, commit := w.Push(map[string]string{
		".knotless/workflows/a.yaml": wf("a", "b"),
		".knotless/workflows/b.yaml": wf("b", "a"),
	})
	w.start(w.config(func(c *daemon.Config) { c.Scheduler.Concurrency = 2 }))
	for _, name := range []string{"a", "b"} {
		if _, got := w.waitFinal(name, commit, 45*time.Second); got.Status != "success" {
			t.Errorf("workflow %s: got %s (%s), want success: the runs did not overlap", name, got.Status, got.Error)
		}
	}
}

// TestConcurrencyOne: with one worker, the two workflows of one push run
// one after the other: each holds a lock directory through its step, and
// neither finds it taken.
func TestConcurrencyOne(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	dir := t.TempDir()
	lock, order := filepath.Join(dir, "lock"), filepath.Join(dir, "order")
	wf := func(me string) string {
		return workflowFile(`
on: [push]
steps:
  - name: alone
    run: |
      mkdir ` + lock + ` || { echo "the other run holds the lock"; exit 1; }
      echo "` + me + ` start" >> ` + order + `
      sleep 2
      echo "` + me + ` end" >> ` + order + `
      rmdir ` + lock + `
`)
	}
	_, commit := w.Push(map[string]string{
		".knotless/workflows/a.yaml": wf("a"),
		".knotless/workflows/b.yaml": wf("b"),
	})
	w.start(w.config())
	for _, name := range []string{"a", "b"} {
		if _, got := w.waitFinal(name, commit, 45*time.Second); got.Status != "success" {
			t.Errorf("workflow %s: got %s (%s), want success: the runs overlapped", name, got.Status, got.Error)
		}
	}
	b, err := os.ReadFile(order)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(string(b)), "\n")
	first := strings.TrimSuffix(got[0], " start")
	second := map[string]string{"a": "b", "b": "a"}[first]
	want := []string{first + " start", first + " end", second + " start", second + " end"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("steps ran (-want +got), want one whole run, then the other:\n%s", diff)
	}
}

// TestDiscover: with no repositories named and discovery on, the runner
// finds the repository that names it on its PDS and runs its push; a
// repository of another owner that names another runner is not watched
// and gets no check.
func TestDiscover(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	other := newWorld(t) // its repository names its own runner, not w's
	wf := func(who string) map[string]string {
		return map[string]string{
			"who.txt":                        who + "\n", // distinct commits
			".knotless/workflows/build.yaml": "on: [push]\nsteps:\n  - name: build\n    run: cat who.txt\n",
		}
	}
	_, foreign := other.Push(wf("other"))
	_, commit := w.Push(wf("owner"))

	w.start(w.config(func(c *daemon.Config) {
		c.Sources.Targets = nil
		c.Sources.Discover = true
		c.Intake.Poll = time.Second
	}))
	if _, got := w.waitFinal("build", commit, 45*time.Second); got.Status != "success" {
		t.Fatalf("discovered repository's push: got %s (%s), want success", got.Status, got.Error)
	}
	// Both pushes were in the reconcile that queued the first: had the
	// foreign one been work, its queued check would be written by now.
	for _, c := range w.Checks() {
		if c.Value.Subject.Repo != w.RepoURI.String() || c.Value.Subject.Commit == foreign {
			t.Errorf("a check for a repository that does not name the runner: %s %+v", c.URI, c.Value.Subject)
		}
	}
	if s := w.checkLog.statuses("build", foreign); len(s) > 0 {
		t.Errorf("check writes for the foreign push: %v, want none", s)
	}
	logs := w.logText()
	watched := slices.ContainsFunc(strings.Split(logs, "\n"), func(line string) bool {
		return strings.Contains(line, `msg="watching repository"`) && strings.Contains(line, " repo="+w.RepoURI.String()+" ")
	})
	if !watched {
		t.Errorf("the owner's repository was not reported as watched\n%s", logs)
	}
	if strings.Contains(logs, other.RepoURI.String()) {
		t.Errorf("the log mentions the repository that does not name the runner\n%s", logs)
	}
}
