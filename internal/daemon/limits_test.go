package daemon_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/tests/pds"
)

// openPull writes author's open pull of fork's branch onto main.
func (w *world) openPull(author *pds.Account, forkDir, branch, head string) syntax.ATURI {
	w.t.Helper()
	return w.Put(author, forge.CollectionPull, "", forge.Pull{
		Type: forge.CollectionPull, Repo: w.RepoURI.String(), Base: "main",
		Head:  forge.PullHead{Source: "file://" + forkDir, Ref: "refs/heads/" + branch, Commit: head},
		Title: branch, State: forge.PullOpen, CreatedAt: forge.Now(),
	})
}

// firstWrite is the index in the write log of the first write of
// workflow on commit with status, or -1.
func (c *checkLog) firstWrite(workflow, commit, status string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, w := range c.writes {
		if w.check.Workflow == workflow && w.check.Subject.Commit == commit && (status == "" || w.check.Status == status) {
			return i
		}
	}
	return -1
}

// TestPullLimits: the operator's maximums end a stranger's pull whose
// workflow asks for more with an error check naming the limit and the
// value; the owner's push of the same workflow is not bound.
func TestPullLimits(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	_, commit := w.Push(map[string]string{".knotless/workflows/big.yaml": workflowFile(`
on: [push, pull]
timeout: 6h
steps:
  - name: hi
    run: echo hi
`)})
	author, err := srv.CreateAccount(ctx, "author")
	if err != nil {
		t.Fatal(err)
	}
	fork := w.Src.Clone(t)
	head := fork.Commit("feature", map[string]string{"feature.txt": "new\n"})
	w.openPull(author, fork.Dir, "feature", head)
	w.start(w.config(func(c *daemon.Config) {
		c.Sources.Pulls = true
		c.Sources.Discover = true // the stranger's pulls are found by listing the PDS's accounts
		c.Engine.Max = run.Maximums{Timeout: time.Hour, MilliCPU: 1000, Images: []string{"busybox:*"}}
	}))
	if _, got := w.waitFinal("big", commit, 60*time.Second); got.Status != "success" {
		t.Errorf("the owner's push: got %s (%s), want success: trusted runs are not bound by default", got.Status, got.Error)
	}
	_, got := w.waitFinal("big", head, 60*time.Second)
	if want := "timeout 6h0m0s exceeds --max-timeout 1h0m0s"; got.Status != "error" || !strings.Contains(got.Error, want) {
		t.Errorf("the stranger's pull: got %s %q, want error %q", got.Status, got.Error, want)
	}
}

// TestAuthorCap: with --max-queued-per-author 2, a stranger's third pull
// waits without any check write while two of theirs are queued; the
// owner's push, queued after all of them, runs first; when a slot frees
// the third pull is queued and runs.
func TestAuthorCap(t *testing.T) {
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
	w.Push(map[string]string{".knotless/workflows/check.yaml": "on: [pull]\nsteps:\n  - name: check\n    run: echo pull\n"})
	w.start(w.config(func(c *daemon.Config) {
		c.Sources.Pulls = true
		c.Sources.Discover = true // the stranger's pulls are found by listing the PDS's accounts
		c.Intake.Caps.QueuedPerAuthor = 2
	}))
	w.waitFile(started, 30*time.Second)

	spammer, err := srv.CreateAccount(ctx, "spammer")
	if err != nil {
		t.Fatal(err)
	}
	fork := w.Src.Clone(t)
	var heads []string
	var uris []syntax.ATURI
	for i := range 3 {
		branch := fmt.Sprintf("spam%d", i)
		head := fork.Commit(branch, map[string]string{branch + ".txt": "spam\n"})
		heads = append(heads, head)
		uris = append(uris, w.openPull(spammer, fork.Dir, branch, head))
	}
	w.waitStatus("check", heads[0], "queued", 30*time.Second)
	w.waitStatus("check", heads[1], "queued", 30*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for !slices.ContainsFunc(strings.Split(w.logText(), "\n"), func(l string) bool {
		return strings.Contains(l, "pull deferred") && strings.Contains(l, uris[2].String())
	}) {
		if time.Now().After(deadline) {
			t.Fatalf("the third pull was not deferred\nlog:\n%s", w.logText())
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, push := w.Push(map[string]string{".knotless/workflows/build.yaml": "on: [push]\nbranches: [main]\nsteps:\n  - name: build\n    run: echo push\n"})
	w.waitStatus("build", push, "queued", 30*time.Second)
	if s := w.checkLog.statuses("check", heads[2]); len(s) != 0 {
		t.Fatalf("the deferred pull's check writes: %v, want none while its author holds 2", s)
	}

	if err := writeFile(release); err != nil {
		t.Fatal(err)
	}
	if _, got := w.waitFinal("build", push, 60*time.Second); got.Status != "success" {
		t.Errorf("the owner's push: got %s (%s), want success", got.Status, got.Error)
	}
	for i, head := range heads {
		if _, got := w.waitFinal("check", head, 90*time.Second); got.Status != "success" {
			t.Errorf("pull %d: got %s (%s), want success", i, got.Status, got.Error)
		}
	}
	pushRan := w.checkLog.firstWrite("build", push, "running")
	for i, head := range heads[:2] {
		if ran := w.checkLog.firstWrite("check", head, "running"); ran < pushRan {
			t.Errorf("pull %d started (write %d) before the owner's push (write %d), which was queued after it", i, ran, pushRan)
		}
	}
	firstDone := min(w.checkLog.firstWrite("check", heads[0], "success"), w.checkLog.firstWrite("check", heads[1], "success"))
	if queued := w.checkLog.firstWrite("check", heads[2], ""); queued < firstDone {
		t.Errorf("the third pull's first check write (%d) came before a slot freed (%d)", queued, firstDone)
	}
	// Its check is created queued only if the one worker was still
	// busy with the author's other pull when the slot freed (which of
	// the two comes first is the intake's timing); then it runs.
	writes := w.checkLog.statuses("check", heads[2])
	if len(writes) > 0 && writes[0] == "queued" {
		writes = writes[1:]
	}
	if diff := cmp.Diff([]string{"running", "success"}, writes); diff != "" {
		t.Errorf("the third pull's check writes after an optional queued (-want +got):\n%s", diff)
	}
}

func writeFile(name string) error { return os.WriteFile(name, nil, 0o600) }
