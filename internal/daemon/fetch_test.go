package daemon_test

import (
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/intake"
)

// TestUnfetchableCommit: a push whose commit is not in the source is
// tried a bounded number of times, then gets one error check saying so,
// and is not tried again.
func TestUnfetchableCommit(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	// A first push that works, so the repository is known and the bad
	// push below is new work, not history.
	_, good := w.Push(map[string]string{".knotless/workflows/test.yaml": workflowFile(`
on: [push]
steps:
  - name: ok
    run: echo fine
`)})
	w.start(w.config(func(c *daemon.Config) {
		c.Intake.FetchTries, c.Intake.FetchBackoff = 3, 100*time.Millisecond
	}))
	w.waitFinal("test", good, 90*time.Second)
	missing := strings.Repeat("ab", 20)
	w.Put(w.Owner, forge.CollectionRefUpdate, "", forge.RefUpdate{
		Type: forge.CollectionRefUpdate, Repo: w.RepoURI.String(), Ref: "refs/heads/main", Old: good, New: missing, CreatedAt: forge.Now(),
	})
	_, got := w.waitFinal(intake.SourceCheck, missing, 60*time.Second)
	if got.Status != "error" || !strings.Contains(got.Error, "is not in the source") {
		t.Fatalf("check %s %q, want error saying the commit is not in the source", got.Status, got.Error)
	}
	time.Sleep(2 * time.Second) // several reconciles (poll 300 ms)
	if n := strings.Count(w.logText(), "event not handled"); n != 2 {
		t.Errorf("%d failed tries logged, want 2 (then the error check)", n)
	}
	if n := len(w.checkLog.statuses(intake.SourceCheck, missing)); n != 1 {
		t.Errorf("%d check writes for the missing commit, want 1", n)
	}
}
