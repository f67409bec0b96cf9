package docker

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/engine/cache"
	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/rules/workflow"
)

// TestCachePathTurnedIntoLink: a step that replaces its cache path (a
// relative one, a directory of the work tree) with a link to / does not
// fail its run, has its save refused, and leaves the cache as the last
// good run saved it; the next run gets a directory again. The checkout
// has no .cache: a cold cache's directory is made by the restore.
func TestCachePathTurnedIntoLink(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	did := runner(t)
	store, err := cache.Open(cache.Config{Dir: t.TempDir(), MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	eng := run.New(run.Config{Executor: newExecutor(t, d, did, Config{}), DefaultImage: d.Image(), Runner: did, CleanupTimeout: time.Minute, Caches: store})
	scope := run.CacheScope{Repo: "link-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	runOnce := func(order, script string) *run.Result {
		t.Helper()
		scope.Order = order
		src := "on: push\ncache: [.cache]\nsteps:\n  - name: use\n    run: |\n      " + strings.ReplaceAll(script, "\n", "\n      ") + "\n"
		wf, err := workflow.Parse("link.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		res := eng.Run(context.Background(), run.Request{RunID: "cl" + order + strconv.FormatInt(time.Now().UnixNano()%1e9, 36), Workflow: wf, Checkout: t.TempDir(), Trusted: true, Cache: scope})
		if res.Status != run.Success {
			t.Fatalf("run %s: status %s (%s), log:\n%s", order, res.Status, res.Error, res.Log)
		}
		return res
	}
	res := runOnce("1", "echo first > .cache/warm")
	if !strings.Contains(string(res.Log), "cache .cache: saved") {
		t.Fatalf("first run: not saved:\n%s", res.Log)
	}
	res = runOnce("2", "cat .cache/warm\nrm -rf .cache\nln -s / .cache")
	for _, want := range []string{"cache .cache: restored", "first", "warning: cache .cache not saved", "not a directory"} {
		if !strings.Contains(string(res.Log), want) {
			t.Errorf("run with the link: log lacks %q:\n%s", want, res.Log)
		}
	}
	res = runOnce("3", "test -d .cache && test ! -L .cache && echo \"warm: $(cat .cache/warm)\" && test ! -e .cache/etc && echo clean")
	for _, want := range []string{"warm: first", "clean"} {
		if !strings.Contains(string(res.Log), want) {
			t.Errorf("run after the link: log lacks %q:\n%s", want, res.Log)
		}
	}
	if left := objects(t, d, did); len(left) > 0 {
		t.Errorf("left after the runs:\n%s", strings.Join(left, "\n"))
	}
}
