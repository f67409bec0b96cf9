package run_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/cache"
	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/rules/workflow"
)

// recorder is an Observer that keeps what it was told.
type recorder struct {
	mu     sync.Mutex
	events []string
	durs   []time.Duration
	bytes  []int64
}

func (r *recorder) add(ev string, d time.Duration, n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	r.durs = append(r.durs, d)
	r.bytes = append(r.bytes, n)
}

func (r *recorder) StepEnded(status string, d time.Duration) { r.add("step "+status, d, 0) }
func (r *recorder) CacheRestored(hit bool, n int64) {
	if hit {
		r.add("cache hit", 0, n)
	} else {
		r.add("cache miss", 0, n)
	}
}
func (r *recorder) CacheSaved(n int64) { r.add("cache saved", 0, n) }

// TestEngineObserver: the engine tells its observer each step's end with
// its status and duration, a cold cache as a miss, a saved layer with its
// size, and the next run's restore of it as a hit of that size.
func TestEngineObserver(t *testing.T) {
	t.Parallel()
	store, err := cache.Open(cache.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	wf := &workflow.Workflow{Name: "ci", Cache: []string{"/cache"}, Steps: []workflow.Step{{Name: "build", Run: "make"}, {Name: "test", Run: "make test"}}}
	runOnce := func(runID string, code int) *recorder {
		t.Helper()
		rec := &recorder{}
		ex := &fakeexec.Executor{Script: func(_, id string) fakeexec.Step {
			if id == "2" {
				return fakeexec.Step{Code: code}
			}
			return fakeexec.Step{}
		}}
		res := run.New(run.Config{Executor: ex, Caches: store, Observer: rec}).Run(t.Context(), run.Request{
			RunID: runID, Workflow: wf, Checkout: t.TempDir(), Trusted: true, Cache: run.CacheScope{Repo: "repo", Order: runID},
		})
		if res.Status == run.Error {
			t.Fatalf("%s: %s\n%s", runID, res.Error, res.Log)
		}
		for i, d := range rec.durs {
			if rec.events[i] == "step success" && d != res.Steps[0].Duration && d != res.Steps[1].Duration {
				t.Errorf("%s: step duration %s is none of the result's %s, %s", runID, d, res.Steps[0].Duration, res.Steps[1].Duration)
			}
		}
		return rec
	}

	first := runOnce("1", 0)
	if diff := cmp.Diff([]string{"cache miss", "step success", "step success", "cache saved"}, first.events); diff != "" {
		t.Fatalf("first run (cold cache, passes) (-want +got):\n%s", diff)
	}
	saved := first.bytes[len(first.bytes)-1]
	if saved <= 0 {
		t.Errorf("saved %d bytes, want the layer's size", saved)
	}

	second := runOnce("2", 3)
	if diff := cmp.Diff([]string{"cache hit", "step success", "step failure"}, second.events); diff != "" {
		t.Fatalf("second run (warm cache, fails) (-want +got):\n%s", diff)
	}
	if second.bytes[0] != saved {
		t.Errorf("restored %d bytes, want the %d the first run saved", second.bytes[0], saved)
	}
}

// TestEngineProgress: the request's Progress is told each step as it
// starts; a run adopted mid-step is told the step it goes on with and
// when that step first started.
func TestEngineProgress(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []run.Progress
	progress := func(p run.Progress) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, p)
	}
	detach, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ex := &fakeexec.Executor{Script: func(_, id string) fakeexec.Step {
		if id == "2" {
			once.Do(func() { close(detach) })
			return fakeexec.Step{Gate: gate} // goes on until the gate opens
		}
		return fakeexec.Step{}
	}}
	req := run.Request{RunID: "p", Workflow: twoSteps(), Checkout: t.TempDir(), Detach: detach, Progress: progress}
	res := run.New(run.Config{Executor: ex}).Run(t.Context(), req)
	if res.Status != run.Detached || res.Handover == nil {
		t.Fatalf("status %s, handover %+v: %s", res.Status, res.Handover, res.Error)
	}
	names := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, p := range got {
			out = append(out, fmt.Sprintf("%d/%d %s", p.Step, p.Steps, p.Name))
		}
		return out
	}
	if diff := cmp.Diff([]string{"1/2 build", "2/2 test"}, names()); diff != "" {
		t.Errorf("progress of the first process (-want +got):\n%s", diff)
	}
	second := got[1].Started

	got = nil
	req.Detach = nil
	close(gate)
	res = run.New(run.Config{Executor: ex}).Adopt(t.Context(), req, *res.Handover, res.Log)
	if res.Status != run.Success {
		t.Fatalf("adopted: %s %s\n%s", res.Status, res.Error, res.Log)
	}
	if diff := cmp.Diff([]string{"2/2 test"}, names()); diff != "" {
		t.Errorf("progress of the adopting process (-want +got):\n%s", diff)
	}
	if !got[0].Started.Equal(second) {
		t.Errorf("adopted step started %s, want its first start %s", got[0].Started, second)
	}
}
