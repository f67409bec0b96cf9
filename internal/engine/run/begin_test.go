package run_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/rules/workflow"
)

// Begin starts the session before the checkout exists (what the caller
// does meanwhile overlaps the start); Run then goes on with the
// checkout and gives the same result and log as Engine.Run.
func TestBeginStartsTheSessionBeforeTheCheckout(t *testing.T) {
	t.Parallel()
	dir := t.TempDir() + "/checkout" // not there yet
	started := make(chan executor.Spec, 1)
	ex := &fakeexec.Executor{OnStart: func(s executor.Spec) {
		if _, err := os.Stat(dir); err == nil {
			t.Error("the session started after the checkout was there")
		}
		started <- s
	}, Script: func(_, id string) fakeexec.Step { return fakeexec.Step{Output: "step " + id + "\n"} }}
	eng := run.New(run.Config{Executor: ex, DefaultImage: "alpine"})
	st := eng.Begin(t.Context(), run.Request{RunID: "r", Workflow: twoSteps(), Trusted: true,
		Annotations: map[string]string{"knotless.dev/check": "k"}})
	spec := <-started
	if spec.RunID != "r" || spec.Image != "alpine" || spec.Annotations["knotless.dev/check"] != "k" || !spec.Trusted {
		t.Errorf("spec %+v: want the request's run, image, annotations and trust", spec)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	res := st.Run(t.Context(), dir, nil)
	if res.Status != run.Success {
		t.Fatalf("status %s (%s), want success\n%s", res.Status, res.Error, res.Log)
	}
	for _, want := range []string{"knotless-run: workflow ci, run r", "step 1\n", "step 2\n"} {
		if !strings.Contains(string(res.Log), want) {
			t.Errorf("log lacks %q:\n%s", want, res.Log)
		}
	}
	if s := ex.Session("r"); s == nil || !s.Stopped() {
		t.Error("the session was not stopped after the run")
	}
}

// A run the engine refuses before any session (a maximum passed) starts
// none at Begin; Run ends it with the limit's error.
func TestBeginRefusedStartsNoSession(t *testing.T) {
	t.Parallel()
	var starts int
	var mu sync.Mutex
	ex := &fakeexec.Executor{OnStart: func(executor.Spec) { mu.Lock(); starts++; mu.Unlock() }}
	eng := run.New(run.Config{Executor: ex, Max: run.Maximums{Images: []string{"ok/*"}}})
	wf := twoSteps()
	wf.Image = "evil/image"
	res := eng.Begin(t.Context(), run.Request{RunID: "r", Workflow: wf}).Run(t.Context(), t.TempDir(), nil)
	if res.Status != run.Error || !strings.Contains(res.Error, "--allow-image") {
		t.Errorf("status %s (%q), want error naming --allow-image", res.Status, res.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	if starts != 0 {
		t.Errorf("%d sessions started for a refused run, want none", starts)
	}
}

// A secret the runner has no value for, known only at Run: the run ends
// error naming it, and the session Begin started is stopped.
func TestBeginThenMissingSecretStopsTheSession(t *testing.T) {
	t.Parallel()
	ex := &fakeexec.Executor{}
	cleaner := run.NewCleaner(nil)
	eng := run.New(run.Config{Executor: ex, Cleaner: cleaner})
	wf := &workflow.Workflow{Name: "ci", Secrets: []string{"TOKEN"}, Steps: []workflow.Step{{Name: "s", Run: "true", Secrets: []string{"TOKEN"}}}}
	res := eng.Begin(t.Context(), run.Request{RunID: "r", Workflow: wf, Trusted: true}).Run(t.Context(), t.TempDir(), map[string]string{})
	if err := cleaner.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if res.Status != run.Error || !strings.Contains(res.Error, "secret TOKEN") {
		t.Errorf("status %s (%q), want error naming the secret", res.Status, res.Error)
	}
	if s := ex.Session("r"); s != nil && !s.Stopped() {
		t.Error("the session Begin started is left")
	}
}

// Discard gives a run up before Run: a start still waiting is cancelled
// (no session made), a session already there is stopped under the
// Cleaner.
func TestBeginDiscard(t *testing.T) {
	t.Parallel()
	t.Run("waiting", func(t *testing.T) {
		t.Parallel()
		gate := make(chan struct{}) // never opens: the pod stays Pending
		called := make(chan struct{})
		ex := &fakeexec.Executor{StartGate: gate, OnStart: func(executor.Spec) { close(called) }}
		st := run.New(run.Config{Executor: ex}).Begin(t.Context(), run.Request{RunID: "r", Workflow: twoSteps()})
		<-called
		st.Discard(t.Context())
		if ex.Session("r") != nil {
			t.Error("a session was made after Discard")
		}
	})
	t.Run("started", func(t *testing.T) {
		t.Parallel()
		called := make(chan struct{})
		ex := &fakeexec.Executor{OnStart: func(executor.Spec) { close(called) }}
		cleaner := run.NewCleaner(nil)
		st := run.New(run.Config{Executor: ex, Cleaner: cleaner}).Begin(t.Context(), run.Request{RunID: "r", Workflow: twoSteps()})
		<-called
		st.Discard(t.Context())
		if err := cleaner.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
		if s := ex.Session("r"); s != nil && !s.Stopped() {
			t.Error("the session is left after Discard")
		}
	})
}

// A run detached (a stopping daemon) while Begin's session is still
// starting is released: nothing is handed over, the start is cancelled.
func TestBeginDetachedWhileStarting(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	called := make(chan struct{})
	ex := &fakeexec.Executor{StartGate: gate, OnStart: func(executor.Spec) { close(called) }}
	detach := make(chan struct{})
	st := run.New(run.Config{Executor: ex}).Begin(t.Context(), run.Request{RunID: "r", Workflow: twoSteps(), Detach: detach})
	<-called
	close(detach)
	res := st.Run(context.Background(), t.TempDir(), nil)
	if res.Status != run.Detached || res.Handover != nil {
		t.Errorf("status %s, handover %v; want detached with nothing handed over", res.Status, res.Handover)
	}
	if ex.Session("r") != nil {
		t.Error("a session was made after the detach")
	}
}
