package runctl

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/rules/control"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// Run control on the rig, with intake beside it: cancel, rerun and
// dispatch records decided by internal/rules/control's rules and acted on
// through the scheduler, the checks part and intake; schedules' ticks.

// A queued check is cancelled by its repository's owner, and a pull's
// by its author; a stranger's cancel, a pull author's cancel of a push
// and a cancel for another runner change nothing; a final check stays
// as it is.
func TestCancelRecords(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.git.SetWorkflows(rig.CI("ci", "make"))
	push := rig.Push("3k1", "c1")
	pull := rig.Pull("did:plc:author", "3p1", "h1")
	w.lister.Set(push, pull)
	w.reconcile(t)
	pushKey, pullKey := forge.CheckKey(push.Subject(), "ci"), forge.CheckKey(pull.Subject(), "ci")
	other := rig.CancelOf(rig.Owner, "elsewhere", pushKey)
	other.Value.Runner = "did:plc:another"
	w.lister.SetControls(ingest.Controls{Cancels: []forge.Record[forge.Cancel]{
		rig.CancelOf(stranger, "s1", pushKey),
		rig.CancelOf("did:plc:author", "a1", pushKey),
		other,
	}})
	w.reconcile(t)
	for _, key := range []string{pushKey, pullKey} {
		if got := w.pds.Statuses(key); !slices.Equal(got, []string{"queued"}) {
			t.Errorf("%s after refused cancels: %v, want queued only", key, got)
		}
	}
	byOwner, byAuthor := rig.CancelOf(rig.Owner, "o1", pushKey), rig.CancelOf("did:plc:author", "a2", pullKey)
	w.lister.AddControls(ingest.Controls{Cancels: []forge.Record[forge.Cancel]{byOwner, byAuthor}})
	w.reconcile(t)
	for key, by := range map[string]syntax.ATURI{pushKey: byOwner.URI, pullKey: byAuthor.URI} {
		c, _ := w.keeper.Get(key)
		if c.Status != "cancelled" || c.CancelledBy != by.String() || c.Error != control.CancelledText(by.String()) {
			t.Errorf("%s: %s by %q (%q), want cancelled by %s", key, c.Status, c.CancelledBy, c.Error, by)
		}
		if w.sched.HasCheck(key) {
			t.Errorf("%s still in hand", key)
		}
	}
	// Read again: a final check stays as it is.
	w.reconcile(t)
	for _, key := range []string{pushKey, pullKey} {
		if got := w.pds.Statuses(key); !slices.Equal(got, []string{"queued", "cancelled"}) {
			t.Errorf("%s: writes %v", key, got)
		}
	}
}

// A check an earlier process left queued (listed at start, not in hand)
// is cancelled, not queued again by the same reconcile.
func TestCancelOfWorkLeftQueued(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.git.SetWorkflows(rig.CI("ci", "make"))
	push := rig.Push("3k1", "c1")
	key := forge.CheckKey(push.Subject(), "ci")
	w.keeper.Know(key, forge.Check{Type: forge.CollectionCheck, Subject: push.Subject(), Workflow: "ci", Status: "queued", CreatedAt: forge.Now()})
	w.lister.Set(push)
	w.lister.SetControls(ingest.Controls{Cancels: []forge.Record[forge.Cancel]{rig.CancelOf(rig.Owner, "o1", key)}})
	w.reconcile(t)
	if got := w.pds.Statuses(key); !slices.Equal(got, []string{"cancelled"}) {
		t.Errorf("writes %v, want cancelled only", got)
	}
	if w.sched.HasCheck(key) {
		t.Error("queued again")
	}
}

// A re-run runs a final check's event again as new attempts: all its
// workflows, one, or the failed ones; each with its own key, its
// attempt, the record as its cause and the record's env; the original
// kept. A re-run read again, or while its attempts go, runs nothing
// more; a stranger's runs nothing.
func TestRerunRecords(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s := w.spied()
	w.git.SetWorkflows(rig.CI("a", "make"), rig.CI("b", "make"))
	push := rig.Push("3k1", "c1")
	w.lister.Set(push)
	w.reconcile(t)
	keyA, keyB := forge.CheckKey(push.Subject(), "a"), forge.CheckKey(push.Subject(), "b")
	w.drop(t, keyA)
	w.drop(t, keyB)
	w.finish(keyA, push, "a", "success")
	w.finish(keyB, push, "b", "failure")

	failed := rig.RerunOf(rig.Owner, tid(1), keyA, forge.Rerun{Failed: true, Env: []forge.Variable{{Name: "DEBUG", Value: "1"}}})
	w.lister.SetControls(ingest.Controls{Reruns: []forge.Record[forge.Rerun]{rig.RerunOf(stranger, tid(0), keyA, forge.Rerun{}), failed}})
	base := len(w.pds.Writes())
	w.reconcile(t)
	b2 := forge.AttemptKey(push.Subject(), "b", 2)
	c, _ := w.keeper.Get(b2)
	if c.Status != "queued" || c.Attempt != 2 || c.Cause != failed.URI.String() || c.Workflow != "b" || c.Subject != push.Subject() {
		t.Errorf("attempt 2 of b: %+v", c)
	}
	j := s.job(b2)
	if j == nil || !j.Event.Trusted || !slices.Equal(j.Vars, []workflow.EnvVar{{Name: "DEBUG", Value: "1"}}) {
		t.Fatalf("attempt 2's job: %+v", j)
	}
	if n := len(w.pds.Writes()) - base; n != 1 {
		t.Errorf("%d writes (a stranger's re-run, or a re-run of a passing workflow, wrote?): %v", n, w.pds.Writes()[base:])
	}
	// All of them, while b's attempt 2 is queued: it waits.
	all := rig.RerunOf(rig.Owner, tid(2), keyA, forge.Rerun{})
	w.lister.AddControls(ingest.Controls{Reruns: []forge.Record[forge.Rerun]{all}})
	w.reconcile(t)
	if n := len(w.pds.Writes()) - base; n != 1 {
		t.Errorf("a re-run that waits wrote: %v", w.pds.Writes()[base:])
	}
	w.drop(t, b2)
	w.finish(b2, push, "b", "success")
	w.reconcile(t)
	a2, b3 := forge.AttemptKey(push.Subject(), "a", 2), forge.AttemptKey(push.Subject(), "b", 3)
	for key, want := range map[string]int64{a2: 2, b3: 3} {
		if c, _ := w.keeper.Get(key); c.Status != "queued" || c.Attempt != want || c.Cause != all.URI.String() {
			t.Errorf("%s: %+v, want queued attempt %d caused by %s", key, c, want, all.URI)
		}
	}
	// Read again: served, nothing more.
	before := len(w.pds.Writes())
	w.reconcile(t)
	if n := len(w.pds.Writes()); n != before {
		t.Errorf("re-runs read again wrote %v", w.pds.Writes()[before:])
	}
	if c, _ := w.keeper.Get(keyB); c.Status != "failure" {
		t.Errorf("the original check changed: %+v", c)
	}
}

// A pull's re-run by its author stays untrusted and counts against the
// author; the same author may not re-run the owner's push.
func TestRerunOfAPull(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s := w.spied()
	w.git.SetWorkflows(rig.CI("ci", "make"))
	pull := rig.Pull("did:plc:author", "3p1", "h1")
	push := rig.Push("3k1", "c1")
	for _, ev := range []work.Event{pull, push} {
		key := forge.CheckKey(ev.Subject(), "ci")
		w.finish(key, ev, "ci", "failure")
		w.store.MarkDone(ev.Key())
	}
	w.lister.Set(pull, push)
	rr := rig.RerunOf("did:plc:author", tid(1), forge.CheckKey(pull.Subject(), "ci"), forge.Rerun{})
	w.lister.SetControls(ingest.Controls{Reruns: []forge.Record[forge.Rerun]{
		rr, rig.RerunOf("did:plc:author", tid(2), forge.CheckKey(push.Subject(), "ci"), forge.Rerun{}),
	}})
	w.reconcile(t)
	key := forge.AttemptKey(pull.Subject(), "ci", 2)
	j := s.job(key)
	if j == nil || j.Event.Trusted || j.Event.Pull == nil || j.Tree != "merge-h1" {
		t.Fatalf("the pull's re-run: %+v", j)
	}
	if got := job.Author(j.Event, false); got != "did:plc:author" {
		t.Errorf("counted against %q", got)
	}
	if runs, _ := w.sched.Load("did:plc:author", work.Event{}); runs != 1 {
		t.Errorf("the author holds %d runs, want 1", runs)
	}
	if _, known := w.keeper.Get(forge.AttemptKey(push.Subject(), "ci", 2)); known {
		t.Error("a pull's author re-ran the owner's push")
	}
}

// A re-run record counts against its author's caps: over them it waits,
// without a check (logged once however many reconciles see it), and
// runs once runs have ended.
func TestRerunWaitsForTheAuthorsCaps(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.cfg.Caps.QueuedPerAuthor = 1
	var logs bytes.Buffer
	w.log = slog.New(slog.NewTextHandler(&logs, nil))
	w.build(t)
	w.git.SetWorkflows(rig.CI("ci", "make"))
	var events []work.Event
	var reruns []forge.Record[forge.Rerun]
	for i := range 2 {
		ev := rig.Push(fmt.Sprintf("3k%d", i), fmt.Sprintf("c%d", i))
		key := forge.CheckKey(ev.Subject(), "ci")
		w.finish(key, ev, "ci", "failure")
		w.store.MarkDone(ev.Key())
		events = append(events, ev)
		reruns = append(reruns, rig.RerunOf(rig.Owner, tid(i), key, forge.Rerun{}))
	}
	w.lister.Set(events...)
	w.lister.SetControls(ingest.Controls{Reruns: reruns})
	w.reconcile(t)
	first, second := forge.AttemptKey(events[0].Subject(), "ci", 2), forge.AttemptKey(events[1].Subject(), "ci", 2)
	if _, known := w.keeper.Get(first); !known {
		t.Fatal("the first re-run is not queued")
	}
	if _, known := w.keeper.Get(second); known {
		t.Fatal("the second re-run went past the owner's cap of 1")
	}
	w.reconcile(t)
	if n := strings.Count(logs.String(), "deferred"); n != 1 {
		t.Errorf("the waiting re-run logged %d times, want once:\n%s", n, logs.String())
	}
	w.drop(t, first)
	w.reconcile(t)
	if c, _ := w.keeper.Get(second); c.Status != "queued" {
		t.Errorf("the second re-run after the first ended: %+v", c)
	}
}

// A dispatch runs its workflow on the branch's head, trusted, with its
// inputs (defaults filled in), once per record; a bad input, a
// workflow not on dispatch and an unknown workflow are error checks
// naming what is wrong; a stranger's dispatch writes nothing.
func TestDispatchRecords(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s := w.spied()
	deploy := rig.CI("deploy", "make")
	deploy.On = []workflow.Trigger{workflow.Dispatch}
	def := "staging"
	deploy.Inputs = []workflow.Input{{Name: "TARGET", Type: workflow.InputChoice, Options: []string{"staging", "production"}, Default: &def},
		{Name: "DRY", Type: workflow.InputBoolean}}
	w.git.SetWorkflows(deploy, rig.CI("ci", "make"))
	w.git.MoveHead("main", rig.CommitID("main head"))
	good := rig.DispatchOf(tid(1), "refs/heads/main", "deploy", forge.Variable{Name: "DRY", Value: "true"})
	bad := rig.DispatchOf(tid(2), "refs/heads/main", "deploy", forge.Variable{Name: "TARGET", Value: "moon"})
	notOn := rig.DispatchOf(tid(3), "refs/heads/main", "ci")
	missing := rig.DispatchOf(tid(4), "refs/heads/main", "nope")
	strangers := rig.DispatchOf(tid(5), "refs/heads/main", "deploy")
	strangers.URI = syntax.ATURI(strings.Replace(string(strangers.URI), rig.Owner, stranger, 1))
	w.lister.SetRepos(rig.RepoRecord())
	w.lister.SetControls(ingest.Controls{Dispatches: []forge.Record[forge.Dispatch]{good, bad, notOn, missing, strangers}})
	w.reconcile(t)
	key := func(r forge.Record[forge.Dispatch]) string {
		return forge.CheckKey(control.DispatchSubject(r.URI.String(), r.Value, ""), r.Value.Workflow)
	}
	c, _ := w.keeper.Get(key(good))
	if c.Status != "queued" || c.Cause != good.URI.String() || c.Subject.Kind != forge.KindDispatch || c.Subject.Commit != rig.CommitID("main head") {
		t.Errorf("the dispatch's check: %+v", c)
	}
	j := s.job(key(good))
	if j == nil || !j.Event.Trusted {
		t.Fatalf("the dispatch's job: %+v", j)
	}
	if diff := cmp.Diff([]workflow.EnvVar{{Name: "TARGET", Value: "staging"}, {Name: "DRY", Value: "true"}}, j.Vars); diff != "" {
		t.Errorf("vars (-want +got):\n%s", diff)
	}
	for r, want := range map[*forge.Record[forge.Dispatch]]string{&bad: `input "TARGET"`, &notOn: "does not run on dispatch", &missing: "has no workflow nope"} {
		if c, _ := w.keeper.Get(key(*r)); c.Status != "error" || !strings.Contains(c.Error, want) || c.Cause != r.URI.String() {
			t.Errorf("%s: %s %q, want error with %q", r.Value.Workflow, c.Status, c.Error, want)
		}
	}
	if _, known := w.keeper.Get(key(strangers)); known {
		t.Error("a stranger's dispatch wrote a check")
	}
	before := len(w.pds.Writes())
	w.git.MoveHead("main", rig.CommitID("moved"))
	w.reconcile(t)
	if n := len(w.pds.Writes()); n != before {
		t.Errorf("dispatches read again wrote %v", w.pds.Writes()[before:])
	}
}

// A dispatch to a branch the source does not have ends as one error
// check naming the branch (on the all-zeroes commit, as a deleted ref),
// written once: the record is served, not tried at every reconcile.
func TestDispatchToAMissingBranch(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	deploy := rig.CI("deploy", "make")
	deploy.On = []workflow.Trigger{workflow.Dispatch}
	w.git.SetWorkflows(deploy)
	w.git.Lock()
	w.git.Gone = map[string]bool{"gone": true}
	w.git.Unlock()
	d := rig.DispatchOf(tid(1), "refs/heads/gone", "deploy")
	w.lister.SetRepos(rig.RepoRecord())
	w.lister.SetControls(ingest.Controls{Dispatches: []forge.Record[forge.Dispatch]{d}})
	w.reconcile(t)
	key := forge.CheckKey(control.DispatchSubject(d.URI.String(), d.Value, ""), "deploy")
	c, _ := w.keeper.Get(key)
	if c.Status != "error" || !strings.Contains(c.Error, `branch "gone"`) || c.Cause != d.URI.String() || c.Subject.Commit != strings.Repeat("0", 40) {
		t.Fatalf("the dispatch's check: %s %q cause %s commit %s, want an error naming branch gone", c.Status, c.Error, c.Cause, c.Subject.Commit)
	}
	before := len(w.pds.Writes())
	w.reconcile(t)
	w.reconcile(t)
	if n := len(w.pds.Writes()); n != before {
		t.Errorf("the dispatch read again wrote %v", w.pds.Writes()[before:])
	}
}

// A re-run of a dispatch runs with the dispatch's inputs again, the
// re-run's env on top.
func TestRerunOfADispatch(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s := w.spied()
	deploy := rig.CI("deploy", "make")
	deploy.On = []workflow.Trigger{workflow.Dispatch}
	deploy.Inputs = []workflow.Input{{Name: "TARGET", Type: workflow.InputString}, {Name: "DRY", Type: workflow.InputString}}
	w.git.SetWorkflows(deploy)
	d := rig.DispatchOf(tid(1), "refs/heads/main", "deploy", forge.Variable{Name: "TARGET", Value: "prod"}, forge.Variable{Name: "DRY", Value: "no"})
	w.lister.SetRepos(rig.RepoRecord())
	w.lister.SetControls(ingest.Controls{Dispatches: []forge.Record[forge.Dispatch]{d}})
	w.reconcile(t)
	first := forge.CheckKey(control.DispatchSubject(d.URI.String(), d.Value, ""), "deploy")
	w.drop(t, first)
	w.finish(first, work.Event{}, "deploy", "failure")
	c, _ := w.keeper.Get(first)
	rr := rig.RerunOf(rig.Owner, tid(2), first, forge.Rerun{Env: []forge.Variable{{Name: "DRY", Value: "yes"}}})
	w.lister.AddControls(ingest.Controls{Reruns: []forge.Record[forge.Rerun]{rr}})
	w.reconcile(t)
	j := s.job(forge.AttemptKey(c.Subject, "deploy", 2))
	if j == nil {
		t.Fatal("not re-run")
	}
	if diff := cmp.Diff([]workflow.EnvVar{{Name: "TARGET", Value: "prod"}, {Name: "DRY", Value: "yes"}}, j.Vars); diff != "" {
		t.Errorf("vars (-want +got):\n%s", diff)
	}
}

// A re-run's attempt an earlier process left queued is queued again
// (its record still listed): a restart loses no attempt.
func TestResumeRerunAttempt(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s := w.spied()
	w.git.SetWorkflows(rig.CI("ci", "make"))
	push := rig.Push("3k1", "c1")
	first := forge.CheckKey(push.Subject(), "ci")
	w.finish(first, push, "ci", "failure")
	w.store.MarkDone(push.Key())
	rr := rig.RerunOf(rig.Owner, tid(1), first, forge.Rerun{Env: []forge.Variable{{Name: "X", Value: "1"}}})
	second := forge.AttemptKey(push.Subject(), "ci", 2)
	w.keeper.Know(second, forge.Check{Type: forge.CollectionCheck, Subject: push.Subject(), Workflow: "ci", Status: "queued",
		Attempt: 2, Cause: rr.URI.String(), CreatedAt: forge.Now()})
	w.lister.Set(push)
	w.lister.SetControls(ingest.Controls{Reruns: []forge.Record[forge.Rerun]{rr}})
	w.reconcile(t)
	j := s.job(second)
	if j == nil || !slices.Equal(j.Vars, []workflow.EnvVar{{Name: "X", Value: "1"}}) {
		t.Fatalf("the attempt left queued: %+v", j)
	}
	if _, known := w.keeper.Get(forge.AttemptKey(push.Subject(), "ci", 3)); known {
		t.Error("a third attempt")
	}
}

// A schedule runs on the default branch's head at its ticks: not at
// first sight, once per tick, the newest one only after a runner was
// down, woken by its next tick; a new process (the same state and
// checks) does not run a tick again.
func TestSchedules(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		w.cfg.Poll = 24 * time.Hour
		w.build(t)
		s := w.spied()
		nightly := rig.CI("nightly", "make")
		nightly.On = []workflow.Trigger{workflow.Schedule}
		nightly.Schedule = []workflow.Cron{{Spec: "0 * * * *"}}
		w.git.SetWorkflows(nightly, rig.CI("ci", "make"))
		w.lister.SetRepos(rig.RepoRecord())
		time.Sleep(time.Until(time.Now().Truncate(time.Hour).Add(10 * time.Minute))) // hh:10
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { w.in.Run(ctx); close(done) }()
		synctest.Wait()
		if n := len(w.pds.Writes()); n != 0 {
			t.Fatalf("ran at first sight: %v", w.pds.Writes())
		}
		time.Sleep(50 * time.Minute) // the next hour: the timer wakes the loop
		synctest.Wait()
		tick := time.Now().Truncate(time.Hour)
		subject := control.ScheduleSubject(rig.Repo, "refs/heads/main", rig.BaseCommit("main"), tick)
		key := forge.CheckKey(subject, "nightly")
		c, _ := w.keeper.Get(key)
		if c.Status != "queued" || c.Subject != subject || c.Workflow != "nightly" {
			t.Fatalf("the tick's check: %+v", c)
		}
		if j := s.job(key); j == nil || !j.Event.Trusted {
			t.Errorf("the tick's job: %+v", j)
		}
		cancel()
		<-done
		if got := w.store.ScheduleLast(rig.Repo, "nightly"); !got.Equal(tick) {
			t.Errorf("last tick %s, want %s", got, tick)
		}
		// A new process (its checks listed): the tick is not run again.
		w.drop(t, key)
		w.finish(key, work.Event{}, "nightly", "success")
		c, _ = w.keeper.Get(key)
		w.build(t)
		w.keeper.Know(key, c)
		before := len(w.pds.Writes())
		w.reconcile(t)
		if n := len(w.pds.Writes()); n != before {
			t.Errorf("the tick after a restart: %v", w.pds.Writes()[before:])
		}
		// Down for three hours: the newest tick runs, once.
		time.Sleep(3*time.Hour + time.Minute)
		w.build(t)
		w.reconcile(t)
		w.reconcile(t)
		ticks := w.pds.Writes()[before:]
		newest := forge.CheckKey(control.ScheduleSubject(rig.Repo, "refs/heads/main", rig.BaseCommit("main"), time.Now().Truncate(time.Hour)), "nightly")
		if diff := cmp.Diff([]string{newest + " queued"}, ticks); diff != "" {
			t.Errorf("ticks after three hours down (-want +got):\n%s", diff)
		}
	})
}

// A dispatch of a matrix workflow runs each leg, with a check of its
// own; once every leg's check is final or in hand, the record is served
// without opening the mirror again (its own key names no check).
func TestDispatchOfAMatrix(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	deploy, err := workflow.Parse(".knotless/workflows/deploy.yaml", []byte("on: dispatch\nmatrix:\n  env: [staging, production]\nsteps: [{run: make}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	w.git.SetWorkflows(deploy)
	w.git.MoveHead("main", rig.CommitID("main head"))
	d := rig.DispatchOf(tid(1), "refs/heads/main", "deploy")
	w.lister.SetRepos(rig.RepoRecord())
	w.lister.SetControls(ingest.Controls{Dispatches: []forge.Record[forge.Dispatch]{d}})
	w.reconcile(t)
	for _, leg := range []string{"deploy (env=staging)", "deploy (env=production)"} {
		key := forge.CheckKey(control.DispatchSubject(d.URI.String(), d.Value, ""), leg)
		if c, _ := w.keeper.Get(key); c.Status != "queued" || c.Cause != d.URI.String() {
			t.Errorf("%s: %+v, want queued for the dispatch", leg, c)
		}
	}
	if _, known := w.keeper.Get(forge.CheckKey(control.DispatchSubject(d.URI.String(), d.Value, ""), "deploy")); known {
		t.Error("a check of the matrix workflow itself")
	}
	opened := len(w.git.Opened())
	w.reconcile(t)
	w.reconcile(t)
	if n := len(w.git.Opened()); n != opened {
		t.Errorf("the served dispatch opened the mirror %d more times", n-opened)
	}
}
