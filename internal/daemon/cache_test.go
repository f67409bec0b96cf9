package daemon_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/engine/cache"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/scheduler"
)

// cacheWorkflow prints what its cache holds, adds the commit's who.txt
// to it, waits at a barrier when the checkout names one (so that two
// runs overlap), and fails when fail.txt says so.
const cacheWorkflow = `
on: [push, pull]
cache: [cache]
secrets: [OPERATOR_TOKEN]
steps:
  - name: use
    secrets: [OPERATOR_TOKEN]
    run: |
      who=$(cat who.txt)
      if [ -f cache/seen ]; then sed 's/^/seen: /' cache/seen; else echo "nothing seen"; fi
      echo "$who" >> cache/seen
      if [ -f barrier.txt ]; then
        b=$(cat barrier.txt); touch "$b/$who"; n=0
        while [ "$(ls "$b" | wc -l)" -lt 2 ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done
      fi
      if [ "$(cat fail.txt 2>/dev/null)" = yes ]; then exit 1; fi
`

// TestCachesKeptApartByTrust: a pull does not see the cache of a push
// that bore a secret (it reads the apart base), a push does not see a
// pull's layer, only a passing push promotes, and two pushes at once
// keep their uppers apart, the later push's becoming the base.
func TestCachesKeptApartByTrust(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	store, err := cache.Open(cache.Config{Dir: filepath.Join(w.cacheDir, "caches")})
	if err != nil {
		t.Fatal(err)
	}
	w.start(w.config(func(c *daemon.Config) {
		c.Engine.Caches = store
		c.Sources.Pulls, c.Sources.Discover = true, true
		c.Scheduler.Concurrency = 2
		c.Scheduler.Secrets = []scheduler.OperatorSecret{{Name: "OPERATOR_TOKEN", Value: "operator-value", Repos: []string{w.RepoURI.String()}}}
	}))
	final := func(commit, wantStatus string) string {
		t.Helper()
		_, c := w.waitFinal("ci", commit, 90*time.Second)
		log := w.runLog(c)
		if c.Status != wantStatus {
			t.Fatalf("%s: %s (%s), want %s; log:\n%s", commit, c.Status, c.Error, wantStatus, log)
		}
		return log
	}
	expect := func(what, log string, want, notWant []string) {
		t.Helper()
		for _, s := range want {
			if !strings.Contains(log, s) {
				t.Errorf("%s: log lacks %q:\n%s", what, s, log)
			}
		}
		for _, s := range notWant {
			if strings.Contains(log, s) {
				t.Errorf("%s: log has %q:\n%s", what, s, log)
			}
		}
	}

	_, push1 := w.Push(map[string]string{".knotless/workflows/ci.yaml": workflowFile(cacheWorkflow), "who.txt": "push1\n", "fail.txt": "no\n"})
	expect("first push", final(push1, "success"), []string{"cache cache: cold", "nothing seen", "cache cache: saved"}, nil)

	// A pull after it: the push bore a secret, so the apart base is cold.
	author, err := srv.CreateAccount(ctx, "author")
	if err != nil {
		t.Fatal(err)
	}
	fork := w.Src.Clone(t)
	pullHead := fork.Commit("feature", map[string]string{"who.txt": "pull\n"})
	w.openPull(author, fork.Dir, "feature", pullHead)
	expect("pull", final(pullHead, "success"), []string{"cache cache: cold", "nothing seen", "caches not saved: untrusted run"}, []string{"seen: push1"})

	_, push2 := w.Push(map[string]string{"who.txt": "push2\n"})
	expect("second push", final(push2, "success"), []string{"cache cache: restored", "seen: push1"}, []string{"seen: pull"})

	_, push3 := w.Push(map[string]string{"who.txt": "push3\n", "fail.txt": "yes\n"})
	expect("failing push", final(push3, "failure"), []string{"seen: push2", "caches not saved: the run did not pass"}, nil)

	_, push4 := w.Push(map[string]string{"who.txt": "push4\n", "fail.txt": "no\n"})
	expect("push after a failing one", final(push4, "success"), []string{"seen: push1", "seen: push2"}, []string{"seen: push3", "seen: pull"})

	// Two pushes at once, on two branches: both start from push4's
	// base, each saves its own upper, the later record's is promoted.
	barrier := t.TempDir()
	b1 := w.Src.Commit("b1", map[string]string{"who.txt": "b1\n", "barrier.txt": barrier})
	w.Put(w.Owner, forge.CollectionRefUpdate, "", forge.RefUpdate{Type: forge.CollectionRefUpdate, Repo: w.RepoURI.String(), Ref: "refs/heads/b1", New: b1, CreatedAt: forge.Now()})
	b2 := w.Src.Commit("b2", map[string]string{"who.txt": "b2\n", "barrier.txt": barrier})
	w.Put(w.Owner, forge.CollectionRefUpdate, "", forge.RefUpdate{Type: forge.CollectionRefUpdate, Repo: w.RepoURI.String(), Ref: "refs/heads/b2", New: b2, CreatedAt: forge.Now()})
	for _, c := range []string{b1, b2} {
		expect("parallel push", final(c, "success"), []string{"seen: push4"}, []string{"seen: b1", "seen: b2"})
	}
	_, push5 := w.Push(map[string]string{"who.txt": "push5\n"})
	expect("push after the parallel pair", final(push5, "success"), []string{"seen: push4", "seen: b2"}, []string{"seen: b1", "seen: pull", "seen: push3"})

	entries, err := store.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || len(entries[0].Uppers) != 0 || entries[0].Apart != nil {
		t.Errorf("store: %+v; want one cache with a base, no apart base (every push bore a secret) and no upper left", entries)
	}
}

// taintWorkflow shows whether its cache holds a token file and whose
// cache it is, then leaves its own name, and the secret when granted.
const taintWorkflow = `
on: [push, pull]
cache: [cache]
secrets: [OPERATOR_TOKEN]
steps:
  - name: use
    secrets: [OPERATOR_TOKEN]
    run: |
      if [ -f cache/token ]; then echo "token file: $(cat cache/token)"; else echo "no token file"; fi
      if [ -f cache/who ]; then echo "seen: $(cat cache/who)"; fi
      cat who.txt > cache/who
      if [ -n "${OPERATOR_TOKEN:-}" ]; then printf %s "$OPERATOR_TOKEN" > cache/token; fi
`

// TestCacheTaintFollowsLineage: a push granted the operator's secret
// leaves a file of it in the cache; a later push granted no secret (its
// workflow asks for none) saves the cache on; a pull after both must not
// see the file. The secret-less push starts from the clean lineage, so
// it does not see it either, and its layer is what the pull reads.
func TestCacheTaintFollowsLineage(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	store, err := cache.Open(cache.Config{Dir: filepath.Join(w.cacheDir, "caches")})
	if err != nil {
		t.Fatal(err)
	}
	const secret = "operator-taint-value"
	w.start(w.config(func(c *daemon.Config) {
		c.Engine.Caches = store
		c.Sources.Pulls, c.Sources.Discover = true, true
		c.Scheduler.Secrets = []scheduler.OperatorSecret{{Name: "OPERATOR_TOKEN", Value: secret, Repos: []string{w.RepoURI.String()}}}
	}))
	final := func(commit string) string {
		t.Helper()
		_, c := w.waitFinal("ci", commit, 90*time.Second)
		log := w.runLog(c)
		if c.Status != "success" {
			t.Fatalf("%s: %s (%s); log:\n%s", commit, c.Status, c.Error, log)
		}
		return log
	}
	expect := func(what, log string, want, notWant []string) {
		t.Helper()
		for _, s := range want {
			if !strings.Contains(log, s) {
				t.Errorf("%s: log lacks %q:\n%s", what, s, log)
			}
		}
		for _, s := range notWant {
			if strings.Contains(log, s) {
				t.Errorf("%s: log has %q:\n%s", what, s, log)
			}
		}
	}

	_, push1 := w.Push(map[string]string{".knotless/workflows/ci.yaml": workflowFile(taintWorkflow), "who.txt": "push1\n"})
	expect("secret-bearing push", final(push1), []string{"no token file", "cache cache: saved", "tainted"}, nil)

	plain := strings.ReplaceAll(strings.ReplaceAll(taintWorkflow, "    secrets: [OPERATOR_TOKEN]\n", ""), "secrets: [OPERATOR_TOKEN]\n", "")
	_, push2 := w.Push(map[string]string{".knotless/workflows/ci.yaml": workflowFile(plain), "who.txt": "push2\n"})
	expect("push granted no secret", final(push2), []string{"no token file", "cache cache: saved"}, []string{"token file:", "seen: push1"})

	author, err := srv.CreateAccount(ctx, "tainter")
	if err != nil {
		t.Fatal(err)
	}
	fork := w.Src.Clone(t)
	pullHead := fork.Commit("feature", map[string]string{"who.txt": "pull\n"})
	w.openPull(author, fork.Dir, "feature", pullHead)
	expect("pull", final(pullHead), []string{"no token file", "seen: push2"}, []string{"token file:", secret, "seen: push1"})

	entries, err := store.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Apart == nil || !entries[0].Apart.Clean || entries[0].Base == nil || entries[0].Base.Run != entries[0].Apart.Run {
		t.Errorf("store: %+v; want push2's clean layer as both bases", entries)
	}
}
