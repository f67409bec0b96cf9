package daemon_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/forge"
)

// TestPullSourcesRefused: a pull whose head.source is the path of the
// runner's own mirror of another repository is refused (even with local
// sources allowed, as this test's repository needs), and so is a pull
// whose head.ref is a refspec: each gets an error check saying why, and
// no workflow of it runs. A pull from an ordinary fork still runs, from
// a mirror of its own.
func TestPullSourcesRefused(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	wf := workflowFile(`
on: [push, pull]
steps:
  - name: build
    run: ls
`)
	_, commit := w.Push(map[string]string{".knotless/workflows/build.yaml": wf, "private.txt": "the owner's\n"})
	// The stranger's pull is found by listing the PDS's accounts: these
	// tests follow no event stream.
	w.start(w.config(func(c *daemon.Config) { c.Sources.Pulls, c.Sources.Discover = true, true }))
	if _, got := w.waitFinal("build", commit, 90*time.Second); got.Status != "success" {
		t.Fatalf("push: %s (%s)", got.Status, got.Error)
	}
	mirrors, err := filepath.Glob(filepath.Join(w.cacheDir, "mirrors", "*.git"))
	if err != nil || len(mirrors) != 1 {
		t.Fatalf("mirrors: %v %v, want the repository's one", mirrors, err)
	}

	author, err := srv.CreateAccount(ctx, "author")
	if err != nil {
		t.Fatal(err)
	}
	pull := func(source, ref, head string) {
		w.Put(author, forge.CollectionPull, "", forge.Pull{
			Type: forge.CollectionPull, Repo: w.RepoURI.String(), Base: "main",
			Head:  forge.PullHead{Source: source, Ref: ref, Commit: head},
			Title: "x", State: forge.PullOpen, CreatedAt: forge.Now(),
		})
	}
	// The mirror's commit, asked for by the mirror's path.
	pull(mirrors[0], "refs/heads/main", commit)
	fork := w.Src.Clone(t)
	bad := fork.Commit("feature", map[string]string{"b.txt": "b\n"})
	pull("file://"+fork.Dir, "refs/heads/feature:refs/heads/evil", bad)
	good := fork.Commit("other", map[string]string{"c.txt": "c\n"})
	pull("file://"+fork.Dir, "refs/heads/other", good)

	for _, tc := range []struct{ commit, want string }{
		{commit, "inside the runner's own directory"},
		{bad, `ref "refs/heads/feature:refs/heads/evil"`},
	} {
		_, got := w.waitFinal("(refused)", tc.commit, 90*time.Second)
		if got.Status != "error" || got.Subject.Kind != forge.KindPull || !strings.Contains(got.Error, tc.want) {
			t.Errorf("refused pull of %s: %s %q, want an error check with %q", tc.commit[:8], got.Status, got.Error, tc.want)
		}
	}
	if _, got := w.waitFinal("build", good, 90*time.Second); got.Status != "success" {
		t.Errorf("pull from a fork: %s (%s)", got.Status, got.Error)
	}
	for _, c := range w.Checks() {
		if c.Value.Workflow == "build" && c.Value.Subject.Kind == forge.KindPull && c.Value.Subject.Commit != good {
			t.Errorf("a refused pull ran: %+v", c.Value)
		}
	}
	if err := exec.Command("git", "--git-dir", mirrors[0], "cat-file", "-e", good).Run(); err == nil {
		t.Errorf("the fork's pull fetched %s into the repository's mirror, not one of its own", good[:8])
	}
	if out := w.Src.Git("--git-dir", mirrors[0], "for-each-ref"); strings.Contains(out, "evil") {
		t.Errorf("a pull's ref wrote into the repository's mirror:\n%s", out)
	}
	if !strings.Contains(w.logText(), "event refused") {
		t.Error("no log line says why the events were refused")
	}
}
