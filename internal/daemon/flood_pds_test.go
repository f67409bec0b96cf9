package daemon_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/tests/pds"
)

// movePull points author's pull at a new head commit: the record is
// written again in place, as a force-push of its branch does.
func (w *world) movePull(author *pds.Account, uri syntax.ATURI, forkDir, branch, head string) {
	w.t.Helper()
	w.Put(author, forge.CollectionPull, uri.RecordKey().String(), forge.Pull{
		Type: forge.CollectionPull, Repo: w.RepoURI.String(), Base: "main",
		Head:  forge.PullHead{Source: "file://" + forkDir, Ref: "refs/heads/" + branch, Commit: head},
		Title: branch, State: forge.PullOpen, CreatedAt: forge.Now(),
	})
}

// eventWrites are the check writes for the event uri, in order.
func (c *checkLog) eventWrites(uri syntax.ATURI) []forge.Check {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []forge.Check
	for _, w := range c.writes {
		if w.check.Subject.Event == uri.String() {
			out = append(out, w.check)
		}
	}
	return out
}

// all are the check writes so far, in order.
func (c *checkLog) all() []forge.Check {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]forge.Check, len(c.writes))
	for i, w := range c.writes {
		out[i] = w.check
	}
	return out
}

// pullWorkflows are n workflow files that run on pulls.
func pullWorkflows(n int) map[string]string {
	files := map[string]string{}
	for i := range n {
		files[fmt.Sprintf(".knotless/workflows/w%02d.yaml", i)] = "on: [pull]\nsteps:\n  - name: ok\n    run: 'true'\n"
	}
	return files
}

// waitSeen waits until the daemon has acted on commit of the pull: a
// check written for it, or its deferral logged.
func (w *world) waitSeen(commit string, timeout time.Duration) {
	w.t.Helper()
	waitUntil(w.t, "the daemon acting on commit "+commit, timeout, func() bool {
		for _, c := range w.checkLog.all() {
			if c.Subject.Commit == commit {
				return true
			}
		}
		for _, l := range strings.Split(w.logText(), "\n") {
			if strings.Contains(l, "pull deferred") && strings.Contains(l, "commit="+commit) {
				return true
			}
		}
		return false
	})
}

// TestPullFloodWorkflowsPerEvent: a stranger's pull whose merge runs
// more workflows than --max-workflows-per-event, moved to a new head
// commit three times, costs one check write per commit: an error check
// naming the limit; none of its workflows runs. (Without the cap, each
// commit queued every workflow and each move cancelled them.)
func TestPullFloodWorkflowsPerEvent(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	const workflows, perEvent = 8, 5
	w.Push(pullWorkflows(workflows))
	author, err := srv.CreateAccount(ctx, "flooder")
	if err != nil {
		t.Fatal(err)
	}
	fork := w.Src.Clone(t)
	head := fork.Commit("flood", map[string]string{"flood.txt": "0\n"})
	uri := w.openPull(author, fork.Dir, "flood", head)
	w.start(w.config(func(c *daemon.Config) {
		c.Sources.Pulls = true
		c.Sources.Discover = true // the stranger's pulls are found by listing the PDS's accounts
		c.Intake.Caps.WorkflowsPerEvent = perEvent
	}))
	heads := []string{head}
	w.waitSeen(head, 60*time.Second)
	for i := 1; i < 3; i++ {
		head = fork.Commit("flood", map[string]string{"flood.txt": fmt.Sprintf("%d\n", i)})
		heads = append(heads, head)
		w.movePull(author, uri, fork.Dir, "flood", head)
		w.waitSeen(head, 60*time.Second)
	}
	// The last commit settles: its one error check, or (without the
	// cap) a final check of each of its workflows.
	waitUntil(t, "the last commit's checks to be final", 120*time.Second, func() bool {
		final := 0
		for _, c := range w.checkLog.eventWrites(uri) {
			if c.Subject.Commit == head && c.Final() {
				if c.Workflow == "(refused)" {
					return true
				}
				final++
			}
		}
		return final == workflows
	})

	writes := w.checkLog.eventWrites(uri)
	t.Logf("a pull of %d workflows moved %d times: %d check writes", workflows, len(heads)-1, len(writes))
	if len(writes) != len(heads) {
		t.Errorf("%d check writes for the pull, want %d: one per commit", len(writes), len(heads))
	}
	for _, c := range writes {
		want := fmt.Sprintf("%d workflows match this event, more than --max-workflows-per-event allows (%d)", workflows, perEvent)
		if c.Workflow != "(refused)" || c.Status != "error" || !strings.Contains(c.Error, want) {
			t.Errorf("check of %s on %s: %s %q, want only (refused) error checks saying %q", c.Workflow, c.Subject.Commit, c.Status, c.Error, want)
			break
		}
	}
}

// TestPullFloodCheckWriteBudget: a stranger's pull of four workflows,
// moved twice while its first commit's runs wait for the worker,
// writes no more checks than its author's budget: the first commit is
// queued (12 writes: queued, running, final each), the newer commits
// would overdraw the budget and wait, deferred without a check; the
// first commit's runs are not cancelled by them. (Without the budget,
// each move cancelled four queued checks and queued four more: 28
// writes.)
func TestPullFloodCheckWriteBudget(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	dir := t.TempDir()
	started, release := filepath.Join(dir, "started"), filepath.Join(dir, "release")
	// A push on another branch holds the only worker until released.
	w.pushBranch("hold", map[string]string{".knotless/workflows/hold.yaml": workflowFile(`
on: [push]
branches: [hold]
steps:
  - name: hold
    run: |
      touch ` + started + `
      ` + waitFor(release) + `
`)})
	const workflows, budget = 4, 20
	w.Push(pullWorkflows(workflows))
	w.start(w.config(func(c *daemon.Config) {
		c.Sources.Pulls = true
		c.Sources.Discover = true
		c.Intake.Caps.CheckWritesPerAuthor = budget
		c.Intake.Caps.Window = 24 * time.Hour // no refill to speak of within the test
	}))
	w.waitFile(started, 60*time.Second)

	author, err := srv.CreateAccount(ctx, "flooder")
	if err != nil {
		t.Fatal(err)
	}
	fork := w.Src.Clone(t)
	first := fork.Commit("flood", map[string]string{"flood.txt": "0\n"})
	uri := w.openPull(author, fork.Dir, "flood", first)
	w.waitSeen(first, 60*time.Second)
	head := first
	for i := 1; i < 3; i++ {
		head = fork.Commit("flood", map[string]string{"flood.txt": fmt.Sprintf("%d\n", i)})
		w.movePull(author, uri, fork.Dir, "flood", head)
		w.waitSeen(head, 60*time.Second)
	}
	if err := writeFile(release); err != nil {
		t.Fatal(err)
	}
	// Every check written for the pull settles (the newest commit's,
	// without the budget).
	waitUntil(t, "the pull's checks to be final", 120*time.Second, func() bool {
		writes := w.checkLog.eventWrites(uri)
		last := map[string]forge.Check{}
		for _, c := range writes {
			last[c.Subject.Commit+" "+c.Workflow] = c
		}
		for _, c := range last {
			if !c.Final() {
				return false
			}
		}
		return len(last) > 0
	})
	// One more reconcile after the runs ended: an owner's push, queued
	// by a reconcile that looked at the pull again first (it is older).
	_, sync := w.pushBranch("sync", map[string]string{".knotless/workflows/sync.yaml": "on: [push]\nbranches: [sync]\nsteps:\n  - name: ok\n    run: 'true'\n"})
	w.waitFinal("sync", sync, 60*time.Second)

	writes := w.checkLog.eventWrites(uri)
	t.Logf("a pull of %d workflows moved twice: %d check writes", workflows, len(writes))
	if len(writes) > budget {
		t.Errorf("%d check writes for the pull, more than its author's budget of %d", len(writes), budget)
	}
	byCommit := map[string][]string{}
	for _, c := range writes {
		byCommit[c.Subject.Commit] = append(byCommit[c.Subject.Commit], c.Status)
	}
	if got := len(byCommit[first]); got != 3*workflows {
		t.Errorf("the first commit: %d writes %v, want queued, running and success of each of its %d workflows", got, byCommit[first], workflows)
	}
	for commit, statuses := range byCommit {
		if commit != first {
			t.Errorf("commit %s, over the budget, has checks %v; want none while it waits", commit, statuses)
		}
	}
	deferred := false
	for _, l := range strings.Split(w.logText(), "\n") {
		deferred = deferred || (strings.Contains(l, "pull deferred") && strings.Contains(l, "commit="+head) && strings.Contains(l, "--max-check-writes-per-author"))
	}
	if !deferred {
		t.Errorf("the newest commit's deferral naming --max-check-writes-per-author is not logged")
	}
}
