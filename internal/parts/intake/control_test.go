package intake

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/rules/control"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// The events run control makes (internal/parts/runctl, whose tests drive
// them from the records) as intake considers them: the workflows they
// name, each at its attempt, their variables, and an error check for
// each named workflow that cannot run.

const rerunCause = "at://" + rig.Owner + "/dev.knotless.rerun/3r1"

// rerun is a re-run event of push: workflows at their attempts.
func rerun(runs map[string]int64) work.Event {
	ev := rig.Push("3k1", "c1")
	ev.Control = work.Control{Cause: rerunCause, Workflows: runs}
	return ev
}

func TestConsiderControl(t *testing.T) {
	t.Parallel()
	deploy := rig.CI("deploy", "make")
	deploy.Inputs = []workflow.Input{{Name: "TARGET", Type: workflow.InputString}, {Name: "DRY", Type: workflow.InputString}}
	dispatched := func(inputs ...workflow.EnvVar) work.Event {
		ev := rerun(map[string]int64{"deploy": 2})
		ev.Inputs = inputs
		ev.Vars = []workflow.EnvVar{{Name: "DRY", Value: "yes"}}
		return ev
	}
	for _, tc := range []struct {
		name string
		ev   work.Event
		// want are the statuses of each workflow's check at the
		// event's attempt ("queued": its job taken); why, the text an
		// error check holds.
		want map[string]string
		why  map[string]string
	}{
		{"a named workflow at its attempt, the others not", rerun(map[string]int64{"ci": 2}),
			map[string]string{"ci": "queued", "deploy": ""}, nil},
		{"a named workflow not at the commit", rerun(map[string]int64{"ci": 2, "gone": 3}),
			map[string]string{"ci": "queued", "gone": "error"}, map[string]string{"gone": "workflow gone does not run at c1 on this runner"}},
		{"a dispatch's inputs again, the re-run's env on top", dispatched(workflow.EnvVar{Name: "TARGET", Value: "prod"}, workflow.EnvVar{Name: "DRY", Value: "no"}),
			map[string]string{"deploy": "queued"}, nil},
		{"a dispatch's input the workflow no longer takes", dispatched(workflow.EnvVar{Name: "NOPE", Value: "x"}),
			map[string]string{"deploy": "error"}, map[string]string{"deploy": "NOPE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			sched := &recordingScheduler{}
			w.ports.Scheduler = sched
			w.in = New(w.cfg, w.facts, w.ports, nil)
			w.git.SetWorkflows(rig.CI("ci", "make"), deploy)
			if err := w.in.ConsiderControl(t.Context(), tc.ev); err != nil {
				t.Fatal(err)
			}
			for wf, want := range tc.want {
				c, _ := w.keeper.Get(tc.ev.CheckKey(wf))
				got := c.Status
				if slices.Contains(sched.keys, tc.ev.CheckKey(wf)) {
					got = "queued"
				}
				if got != want || !strings.Contains(c.Error, tc.why[wf]) {
					t.Errorf("%s: %q %q, want %q with %q", wf, got, c.Error, want, tc.why[wf])
				}
			}
			if tc.ev.Inputs != nil && tc.want["deploy"] == "queued" {
				if got, want := sched.vars, [][]workflow.EnvVar{{{Name: "TARGET", Value: "prod"}, {Name: "DRY", Value: "yes"}}}; !slices.EqualFunc(got, want, slices.Equal) {
					t.Errorf("vars %v, want %v", got, want)
				}
			}
		})
	}
}

// A run-control event's error check counts against its author's
// budget: spent, it waits without a check, listed or not, and is not
// forgotten by the reconcile that considered it.
func TestControlErrorWaitsForTheBudget(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.cfg.Caps.CheckWritesPerAuthor = 1
	w.build(t)
	first, second := rerun(map[string]int64{"ci": 2}), rerun(map[string]int64{"ci": 3})
	second.Cause = rerunCause + "b"
	w.in.ControlError(t.Context(), first, "ci", "no")
	w.in.ControlError(t.Context(), second, "ci", "no")
	if c, _ := w.keeper.Get(first.CheckKey("ci")); c.Status != "error" {
		t.Errorf("the first: %q, want error", c.Status)
	}
	if _, known := w.keeper.Get(second.CheckKey("ci")); known {
		t.Error("the second went past its author's budget")
	}
	w.in.pruneAfter(&ingest.Snapshot{})
	w.in.mu.Lock()
	defer w.in.mu.Unlock()
	if _, waits := w.in.deferred[second.Key()]; !waits {
		t.Errorf("the waiting run-control event was forgotten: %v", w.in.deferred)
	}
}

// A schedule's tick counts against the repository's owner: its check
// writes spend the owner's budget.
func TestTickCountsAgainstTheOwner(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.git.SetWorkflows(rig.CI("nightly", "make"))
	tick := time.Now().Truncate(time.Minute)
	ev := work.Event{Kind: forge.KindSchedule, URI: rig.RepoRecord().URI, Repo: rig.RepoRecord(), Ref: "refs/heads/main", Commit: rig.BaseCommit("main"),
		Trusted: true, Control: work.Control{Workflows: map[string]int64{"nightly": 1}, Tick: control.TickID(tick)}}
	before := w.in.budget.left(rig.Owner, time.Now())
	if err := w.in.ConsiderControl(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	if c, _ := w.keeper.Get(ev.CheckKey("nightly")); c.Status != "queued" {
		t.Fatalf("the tick's check: %q", c.Status)
	}
	if left := w.in.budget.left(rig.Owner, time.Now()); left >= before {
		t.Errorf("the owner's budget %.0f after the tick's writes, %.0f before: not counted against the owner", left, before)
	}
}

// nextControl is run control with a tick every hour, counting its
// calls.
type nextControl struct {
	mu            sync.Mutex
	next          time.Time
	cancels, acts atomic.Int32
	cancelsFirst  atomic.Bool
}

func (c *nextControl) Cancel(context.Context, *ingest.Snapshot) {
	c.cancels.Add(1)
	c.cancelsFirst.Store(c.acts.Load() < c.cancels.Load())
}
func (c *nextControl) Act(context.Context, *ingest.Snapshot) {
	c.acts.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !time.Now().Before(c.next) {
		c.next = c.next.Add(time.Hour)
	}
}

func (c *nextControl) Next() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.next
}

// Each reconcile hands run control its listing, cancels first; the
// loop wakes at run control's next tick, without a hint or a poll.
func TestRunWakesAtTheNextTick(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		w.cfg.Poll = 24 * time.Hour
		ctl := &nextControl{next: time.Now().Add(time.Hour)}
		w.ports.Control = ctl
		w.in = New(w.cfg, w.facts, w.ports, nil)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { w.in.Run(ctx); close(done) }()
		synctest.Wait()
		if n := ctl.acts.Load(); n != 1 {
			t.Fatalf("%d listings at start, want 1", n)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if c, a := ctl.cancels.Load(), ctl.acts.Load(); c != 2 || a != 2 || !ctl.cancelsFirst.Load() {
			t.Errorf("after the tick: %d cancels, %d acts (cancels first: %v), want 2 each", c, a, ctl.cancelsFirst.Load())
		}
		cancel()
		<-done
	})
}
