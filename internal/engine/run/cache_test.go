package run_test

import (
	"archive/tar"
	"bytes"
	"context"
	"testing"

	"knotless.dev/run/internal/engine/cache"
	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/rules/workflow"
)

// TestAdoptedRunKeepsCacheTaint: what a run restored goes with its
// handover, so the process that adopts it saves a clean layer only when
// the first process restored clean ones; a handover that does not say
// (an older process's) counts as tainted, and its layer never becomes
// the apart base.
func TestAdoptedRunKeepsCacheTaint(t *testing.T) {
	t.Parallel()
	store, err := cache.Open(cache.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	key := cache.Key{Repo: "repo", Workflow: "ci", Path: "/cache"}
	var empty bytes.Buffer
	_ = tar.NewWriter(&empty).Close()
	if _, err := store.Save(context.Background(), key, "seed", cache.Layer{Order: "0", Clean: true}, bytes.NewReader(empty.Bytes())); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Promote(key, "seed"); err != nil {
		t.Fatal(err)
	}
	wf := &workflow.Workflow{Name: "ci", Cache: []string{"/cache"}, Steps: []workflow.Step{{Name: "build", Run: "make"}, {Name: "test", Run: "make test"}}}
	handOver := func(runID, order string) (*fakeexec.Executor, run.Request, *run.Result) {
		t.Helper()
		detach := make(chan struct{})
		ex := &fakeexec.Executor{Script: func(_, id string) fakeexec.Step {
			if id == "1" {
				close(detach)
			}
			return fakeexec.Step{}
		}}
		req := run.Request{RunID: runID, Workflow: wf, Checkout: t.TempDir(), Trusted: true, Detach: detach,
			Cache: run.CacheScope{Repo: key.Repo, Order: order}}
		res := run.New(run.Config{Executor: ex, Caches: store}).Run(t.Context(), req)
		if res.Status != run.Detached || res.Handover == nil {
			t.Fatalf("%s: status %s, handover %+v\n%s", runID, res.Status, res.Handover, res.Log)
		}
		req.Detach = nil
		return ex, req, res
	}
	adopt := func(ex *fakeexec.Executor, req run.Request, h run.Handover, prior []byte) {
		t.Helper()
		res := run.New(run.Config{Executor: ex, Caches: store}).Adopt(t.Context(), req, h, prior)
		if res.Status != run.Success {
			t.Fatalf("adopted %s: status %s: %s\n%s", req.RunID, res.Status, res.Error, res.Log)
		}
	}
	refs := func() (base, apart string) {
		t.Helper()
		entries, err := store.List()
		if err != nil || len(entries) != 1 || entries[0].Base == nil || entries[0].Apart == nil {
			t.Fatalf("list: %+v, %v", entries, err)
		}
		return entries[0].Base.Run, entries[0].Apart.Run
	}

	// The first process restored the clean seed: the adopter's layer is
	// clean, both bases take it.
	ex, req, res := handOver("r1", "1")
	if !res.Handover.CachesClean {
		t.Fatalf("handover after restoring a clean layer: %+v", res.Handover)
	}
	adopt(ex, req, *res.Handover, res.Log)
	if base, apart := refs(); base != "r1" || apart != "r1" {
		t.Errorf("after the clean adopted run: base %s, apart %s; want r1, r1", base, apart)
	}

	// A handover without the mark: the adopter's layer is tainted.
	ex, req, res = handOver("r2", "2")
	h := *res.Handover
	h.CachesClean = false
	adopt(ex, req, h, res.Log)
	if base, apart := refs(); base != "r2" || apart != "r1" {
		t.Errorf("after an adopted run whose handover did not record its restores: base %s, apart %s; want r2, r1", base, apart)
	}
}
