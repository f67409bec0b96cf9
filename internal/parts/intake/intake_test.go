package intake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// Intake alone on the rig: from a listing to queued checks, or to the
// error check of work that cannot run.

func (w *world) statuses(ev work.Event, wf string) []string {
	return w.pds.Statuses(forge.CheckKey(ev.Subject(), wf))
}

func (w *world) final(ev work.Event, wf string) forge.Check {
	c, _ := w.keeper.Get(forge.CheckKey(ev.Subject(), wf))
	return c
}

// A push is queued, once per workflow that runs for it and allows this
// runner; its repository is noted, the listing handed to the lander.
func TestReconcileQueuesAPush(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	pullsOnly := rig.CI("pulls-only", "make")
	pullsOnly.On = []workflow.Trigger{workflow.Pull}
	elsewhere := rig.CI("elsewhere", "make")
	elsewhere.Runners = []string{"did:plc:another"}
	w.git.SetWorkflows(rig.CI("ci", "make"), pullsOnly, elsewhere)
	ev := rig.Push("3k1", "c1")
	ev.Vars = []workflow.EnvVar{{Name: "A", Value: "b"}}
	w.lister.Set(ev)
	w.reconcile(t)
	if diff := cmp.Diff([]string{"queued"}, w.statuses(ev, "ci")); diff != "" {
		t.Errorf("ci (-want +got):\n%s", diff)
	}
	for _, wf := range []string{"pulls-only", "elsewhere"} {
		if got := w.statuses(ev, wf); len(got) != 0 {
			t.Errorf("%s: checks %v, want none", wf, got)
		}
	}
	if !w.sched.InHand(ev.Key()) || w.store.Done(ev.Key()) {
		t.Error("the push is not in hand, or done while in hand")
	}
	if w.lander.count() != 1 {
		t.Errorf("the lander was offered %d listings, want 1", w.lander.count())
	}
	if _, seen := w.store.Snapshot().Repos[rig.Repo]; !seen {
		t.Error("the repository is not noted")
	}
	// Listed again while in hand: nothing more.
	w.reconcile(t)
	if got := w.statuses(ev, "ci"); len(got) != 1 {
		t.Errorf("checks after a second reconcile: %v", got)
	}
}

// The event's run variables go with each of its jobs.
func TestConsiderCarriesRunVariables(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	sched := &recordingScheduler{}
	w.ports.Scheduler = sched
	w.in = New(w.cfg, w.facts, w.ports, nil)
	w.git.SetWorkflows(rig.CI("a", "make"), rig.CI("b", "make"))
	ev := rig.Push("3k1", "c1")
	ev.Vars = []workflow.EnvVar{{Name: "INPUT", Value: "x"}}
	if err := w.in.Consider(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	if len(sched.vars) != 2 || !slices.Equal(sched.vars[0], ev.Vars) || !slices.Equal(sched.vars[1], ev.Vars) {
		t.Errorf("jobs' vars %v, want the event's on each", sched.vars)
	}
}

// recordingScheduler takes jobs and keeps their keys and run
// variables.
type recordingScheduler struct {
	mu   sync.Mutex
	keys []string
	vars [][]workflow.EnvVar
}

func (s *recordingScheduler) Enqueue(_ context.Context, j *job.Job) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, j.Key)
	s.vars = append(s.vars, j.Vars)
	return true, nil
}
func (s *recordingScheduler) InHand(string) bool                      { return false }
func (s *recordingScheduler) HasCheck(string) bool                    { return false }
func (s *recordingScheduler) Load(string, work.Event) (int, int)      { return 0, 0 }
func (s *recordingScheduler) TakeOver(context.Context, *job.Job) bool { return false }
func (s *recordingScheduler) Elsewhere(string) bool                   { return false }

// What cannot run gets one final error check, and the event is done:
// a pull that does not merge, a refused source, an unreadable workflow
// file, more workflows than an event may run.
func TestConsiderErrorChecks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		ev       work.Event
		setup    func(w *world)
		workflow string
		errHas   string
	}{
		{"conflict", rig.Pull("did:plc:author", "3p1", "h1"), func(w *world) { w.git.Conflict = true }, "ci", "merge conflict"},
		{"refused source", rig.Push("3k1", "c1"), func(w *world) { w.git.FetchErr = fmt.Errorf("source file:///etc: %w", mirror.ErrRefused) },
			RefusedCheck, "file:///etc"},
		{"invalid workflow file", rig.Push("3k1", "c1"), func(w *world) {
			w.git.Workflows = nil
			w.git.Bad = []error{workflow.Errors{{Position: workflow.Position{File: ".knotless/workflows/lint.yml", Line: 3}, Msg: "steps: required"}}}
		}, "lint", "invalid workflow file"},
		{"too many workflows", rig.Push("3k1", "c1"), func(w *world) {
			w.cfg.Caps.WorkflowsPerEvent = 1
			w.git.Workflows = append(w.git.Workflows, rig.CI("other", "make"))
			w.build(t)
		}, RefusedCheck, "2 workflows match this event, more than --max-workflows-per-event allows (1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			w.git.SetWorkflows(rig.CI("ci", "make"))
			tc.setup(w)
			w.lister.Set(tc.ev)
			w.reconcile(t)
			if c := w.final(tc.ev, tc.workflow); c.Status != "error" || !strings.Contains(c.Error, tc.errHas) {
				t.Errorf("check %s: status %q, error %q; want error with %q", tc.workflow, c.Status, c.Error, tc.errHas)
			}
			if !w.store.Done(tc.ev.Key()) {
				t.Error("the event is not done")
			}
		})
	}
}

// An event whose checks are all final is done, not queued; a known
// final check of one workflow leaves the others to run.
func TestConsiderSkipsFinalChecks(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.git.SetWorkflows(rig.CI("a", "make"), rig.CI("b", "make"))
	ev := rig.Push("3k1", "c1")
	w.keeper.Know(forge.CheckKey(ev.Subject(), "a"), forge.Check{Status: "success"})
	if err := w.in.Consider(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	if len(w.statuses(ev, "a")) != 0 || !slices.Equal(w.statuses(ev, "b"), []string{"queued"}) {
		t.Errorf("a %v, b %v", w.statuses(ev, "a"), w.statuses(ev, "b"))
	}
	done := rig.Push("3k2", "c2")
	for _, wf := range []string{"a", "b"} {
		w.keeper.Know(forge.CheckKey(done.Subject(), wf), forge.Check{Status: "failure"})
	}
	if err := w.in.Consider(t.Context(), done); err != nil {
		t.Fatal(err)
	}
	if !w.store.Done(done.Key()) {
		t.Error("an event whose checks are final is not done")
	}
}

// A pre-flight and its pull share the check of a workflow that is both
// on: pull and queue: first: queued once.
func TestPreflightSharesItsPullsCheck(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	wf := rig.CI("pre", "make")
	wf.Queue = "first"
	w.git.SetWorkflows(wf)
	p := rig.Pull("did:plc:author", "3p1", "h1")
	pre := p
	pre.Preflight = true
	for _, ev := range []work.Event{p, pre} {
		if err := w.in.Consider(t.Context(), ev); err != nil {
			t.Fatal(err)
		}
	}
	if got := w.statuses(p, "pre"); !slices.Equal(got, []string{"queued"}) {
		t.Errorf("the shared check: %v, want queued once", got)
	}
}

// Prepare: a push's commit is fetched, a pull merged onto its base (or
// its conflict said), a batch taken from the lander's mirror.
func TestPrepare(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	if _, tree, conflict, err := w.in.Prepare(ctx, rig.Push("3k1", "c1")); err != nil || tree != "c1" || conflict != nil {
		t.Errorf("push: %s %v %v", tree, conflict, err)
	}
	if _, tree, _, err := w.in.Prepare(ctx, rig.Pull("did:plc:a", "3p1", "h1")); err != nil || tree != "merge-h1" {
		t.Errorf("pull: %s %v", tree, err)
	}
	batch := work.Event{Kind: forge.KindBatch, URI: rig.OwnURI(forge.CollectionBatch, "b"), Repo: rig.RepoRecord(), Commit: "s1"}
	if _, tree, _, err := w.in.Prepare(ctx, batch); err != nil || tree != "s1" {
		t.Errorf("batch: %s %v", tree, err)
	}
	want := []string{rig.Repo, "pull at://did:plc:a/dev.knotless.pull/3p1", "batch " + rig.Repo}
	if diff := cmp.Diff(want, w.git.Opened()); diff != "" {
		t.Errorf("mirrors (-want +got):\n%s", diff)
	}
	w.git.Conflict = true
	if _, _, conflict, err := w.in.Prepare(ctx, rig.Pull("did:plc:a", "3p1", "h1")); err != nil || conflict == nil {
		t.Errorf("conflicting pull: %v %v", conflict, err)
	}
	w.git.FetchErr = rig.ErrDown
	var fe *fetchError
	if _, _, _, err := w.in.Prepare(ctx, rig.Pull("did:plc:a", "3p1", "h1")); !errors.As(err, &fe) {
		t.Errorf("a pull whose head does not fetch: %v, want a fetchError", err)
	}
}

// A commit that does not fetch is tried again after a backoff, and
// after FetchTries gets one error check naming the source.
func TestFetchTriesThenErrorCheck(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		w.cfg.FetchTries = 2
		w.build(t)
		w.git.FetchErr = rig.ErrDown
		w.git.SetWorkflows(rig.CI("ci", "make"))
		ev := rig.Push("3k1", "c1")
		if err := w.in.Consider(t.Context(), ev); err == nil || !strings.Contains(err.Error(), "try 1 of 2") {
			t.Fatalf("first failed fetch: %v, want an error to retry", err)
		}
		if w.in.fetchDue(ev) {
			t.Error("due again before its backoff")
		}
		if err := w.in.Consider(t.Context(), ev); err != nil {
			t.Errorf("considered before its backoff: %v", err)
		}
		time.Sleep(time.Minute)
		if !w.in.fetchDue(ev) {
			t.Error("not due after its backoff")
		}
		if err := w.in.Consider(t.Context(), ev); err != nil {
			t.Fatalf("last try: %v", err)
		}
		if c := w.final(ev, SourceCheck); c.Status != "error" || !strings.Contains(c.Error, "is not in the source "+rig.Source) {
			t.Errorf("source check %+v", c)
		}
		if !w.store.Done(ev.Key()) {
			t.Error("event not done after its error check")
		}
	})
}

// A pull's author has at most QueuedPerAuthor runs in hand: the next
// event waits, without a check or a fetch, and is logged once; it goes
// once the runs are out of hand.
func TestAuthorCapDefers(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	w := newWorld(t)
	w.cfg.Caps.QueuedPerAuthor = 1
	w.build(t)
	w.in.log = slog.New(slog.NewTextHandler(&logs, nil))
	obs := &observed{}
	w.in.p.Observer = obs
	w.git.SetWorkflows(rig.CI("ci", "make"))
	a, b := rig.Pull("did:plc:author", "3p1", "h1"), rig.Pull("did:plc:author", "3p2", "h2")
	w.lister.Set(a, b)
	w.reconcile(t)
	w.reconcile(t)
	if got := w.statuses(b, "ci"); len(got) != 0 {
		t.Errorf("the pull over its author's cap has checks %v", got)
	}
	if n := strings.Count(logs.String(), "pull deferred"); n != 1 {
		t.Errorf("deferral logged %d times, want once:\n%s", n, logs.String())
	}
	if !slices.Contains(obs.get(), "deferred --max-queued-per-author") || !slices.Contains(obs.get(), "reconciled 2") {
		t.Errorf("observed %v", obs.get())
	}
	// The first pull closes: its run leaves the queue (cancelled by a
	// newer commit here), and the second goes.
	w.lister.Set(b)
	w.sched.Cancel(t.Context(), forge.CheckKey(a.Subject(), "ci"), "closed")
	w.reconcile(t)
	if got := w.statuses(b, "ci"); !slices.Equal(got, []string{"queued"}) {
		t.Errorf("after the cap freed: %v", got)
	}
	w.in.mu.Lock()
	defer w.in.mu.Unlock()
	if len(w.in.deferred) != 0 {
		t.Errorf("deferred %v after it went", w.in.deferred)
	}
}

type observed struct {
	mu sync.Mutex
	s  []string
}

func (o *observed) add(s string) { o.mu.Lock(); o.s = append(o.s, s); o.mu.Unlock() }
func (o *observed) get() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.s)
}
func (o *observed) Reconciled(n int, err error)         { o.add(fmt.Sprintf("reconciled %d", n)) }
func (o *observed) Deferred(_ work.Event, flag string)  { o.add("deferred " + flag) }
func (o *observed) Refused(_ work.Event, reason string) { o.add("refused " + reason) }

// TestDeferral: an event waiting for its author's caps is logged once
// per limit it waits for, and what it needs, once known, is kept for
// the next look (no second fetch to know it); admitted, it is
// forgotten; no longer listed, it is forgotten too (but a pre-flight,
// which is never listed).
func TestDeferral(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	in := w.in
	byRuns := decision{verdict: wait, flag: flagPerAuthor}
	byWrites := decision{verdict: wait, flag: flagWrites}
	known := need{known: true, checks: 3, runs: 3}
	for i, tc := range []struct {
		d         decision
		n         need
		wantFirst bool
		wantNeed  need
	}{
		{byRuns, need{}, true, need{}},
		{byRuns, known, false, known},
		{byRuns, need{}, false, known},
		{byWrites, need{}, true, known},
		{decision{verdict: admit}, need{}, false, need{}},
		{byWrites, need{}, true, need{}},
		{decision{verdict: refuse}, known, false, need{}},
	} {
		if got := in.hold("ev", tc.d, tc.n); got != tc.wantFirst {
			t.Errorf("call %d: hold(%s) first = %v, want %v", i, tc.d.flag, got, tc.wantFirst)
		}
		if got := in.deferred["ev"].need; got != tc.wantNeed {
			t.Errorf("call %d: need %+v, want %+v", i, got, tc.wantNeed)
		}
	}
	in.hold("gone@c", byRuns, need{})
	in.hold("listed@c", byRuns, need{})
	in.hold("preflight at://x@c", byRuns, need{})
	in.pruneAfter(&ingest.Snapshot{Events: []work.Event{{Kind: forge.KindPull, URI: "listed", Commit: "c"}}})
	if _, ok := in.deferred["gone@c"]; ok || len(in.deferred) != 2 {
		t.Errorf("deferred %v after forgetting the event no longer listed", in.deferred)
	}
}

// The check writes of an author's events are counted against its
// budget: spent, its next event waits.
func TestCheckWriteBudgetDefers(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.cfg.Caps.CheckWritesPerAuthor = 3 // one run
	w.build(t)
	w.git.SetWorkflows(rig.CI("ci", "make"))
	a := rig.Pull("did:plc:author", "3p1", "h1")
	if err := w.in.Consider(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if left := w.in.budget.left("did:plc:author", time.Now()); left > 2.01 || left < 1.99 {
		t.Errorf("%v writes left after the queued check, want 2", left)
	}
	b := rig.Pull("did:plc:author", "3p2", "h2")
	if err := w.in.Consider(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	if got := w.statuses(b, "ci"); len(got) != 0 {
		t.Errorf("over the budget: checks %v", got)
	}
}

// TestNoteReposSkipsHistory: of a repository seen for the first time,
// the older pushes of each ref are history (done), the newest is work.
func TestNoteReposSkipsHistory(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	repo := rig.RepoRecord()
	push := func(rkey, ref string) work.Event {
		ev := rig.Push(rkey, "c"+rkey)
		ev.Ref = ref
		return ev
	}
	events := []work.Event{push("3k1", "refs/heads/main"), push("3k2", "refs/heads/main"), push("3k3", "refs/heads/dev"), push("3k4", "refs/heads/main")}
	w.in.noteRepos(&ingest.Snapshot{Repos: []forge.Record[forge.Repo]{repo}, Events: events})
	want := []string{events[0].Key(), events[1].Key()}
	slices.Sort(want)
	if diff := cmp.Diff(want, w.store.DoneKeys()); diff != "" {
		t.Errorf("done (-want +got):\n%s", diff)
	}
	// Seen already: its next pushes are work, not history.
	w.in.noteRepos(&ingest.Snapshot{Repos: []forge.Record[forge.Repo]{repo}, Events: append(events, push("3k5", "refs/heads/main"))})
	if got := len(w.store.DoneKeys()); got != 2 {
		t.Errorf("%d done after a second look, want 2", got)
	}
}

// TestPastRetention: a push older than the retention is never work; a
// pull is judged by its listing, not by its age.
func TestPastRetention(t *testing.T) {
	t.Parallel()
	now := time.Now()
	cutoff := now.Add(-30 * 24 * time.Hour)
	uri := func(coll string, at time.Time) syntax.ATURI {
		return syntax.ATURI("at://did:plc:owner/" + coll + "/" + syntax.NewTID(at.UnixMicro(), 0).String())
	}
	for _, tc := range []struct {
		name string
		ev   work.Event
		want bool
	}{
		{"old push", work.Event{Kind: forge.KindPush, URI: uri(forge.CollectionRefUpdate, now.Add(-40*24*time.Hour))}, true},
		{"new push", work.Event{Kind: forge.KindPush, URI: uri(forge.CollectionRefUpdate, now.Add(-time.Hour))}, false},
		{"old pull", work.Event{Kind: forge.KindPull, URI: uri(forge.CollectionPull, now.Add(-40*24*time.Hour))}, false},
	} {
		if got := pastRetention(tc.ev, cutoff); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Retention after a reconcile: done events and final checks older than
// it are forgotten, those of events still listed kept.
func TestPruneAfterReconcile(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.cfg.Retention = time.Nanosecond
	w.build(t)
	old := rig.Pull("did:plc:a", "3p1", "h1")
	listed := rig.Pull("did:plc:a", "3p2", "h2")
	for _, ev := range []work.Event{old, listed} {
		if err := w.store.MarkDone(ev.Key()); err != nil {
			t.Fatal(err)
		}
		w.keeper.Know(forge.CheckKey(ev.Subject(), "ci"), forge.Check{Status: "success", Subject: ev.Subject(), FinishedAt: "2020-01-01T00:00:00Z"})
	}
	w.lister.Set(listed)
	time.Sleep(time.Millisecond)
	w.reconcile(t)
	if w.store.Done(old.Key()) || !w.store.Done(listed.Key()) {
		t.Errorf("done %v: want the listed event alone", w.store.DoneKeys())
	}
	if _, known := w.keeper.Get(forge.CheckKey(old.Subject(), "ci")); known {
		t.Error("the old final check is still known")
	}
}

// TestWarnUnactedOncePerWorkflow: a workflow's fields that are not acted
// on are logged the first time intake reads it, not at every event.
func TestWarnUnactedOncePerWorkflow(t *testing.T) {
	t.Parallel()
	wf, err := workflow.Parse(".knotless/workflows/ci.yaml", []byte("on: []\ncache: .cache\nqueue: first\nsteps:\n  - run: x\n"))
	if err != nil {
		t.Fatal(err)
	}
	quiet, err := workflow.Parse(".knotless/workflows/quiet.yaml", []byte("on: push\nsteps:\n  - run: x\n"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	in := New(Config{}, Facts{}, Ports{}, nil)
	for range 3 {
		in.warnUnacted(log, "at://did:plc:owner/dev.knotless.repo/r", []*workflow.Workflow{wf, quiet})
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "field=on") || !strings.Contains(lines[0], "line=1") ||
		!strings.Contains(lines[0], "file=.knotless/workflows/ci.yaml") {
		t.Errorf("logged:\n%s\nwant one warning, for on: [], once (cache: and queue: are acted on)", buf.String())
	}
}

// The loop: a reconcile at start, one on every hint and every poll;
// a failed one is tried again at the next poll.
func TestRunReconcilesOnWakeAndPoll(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		w.cfg.Poll = time.Minute
		w.build(t)
		w.git.SetWorkflows(rig.CI("ci", "make"))
		w.lister.Fail(rig.ErrDown)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { w.in.Run(ctx); close(done) }()
		synctest.Wait()
		first := rig.Push("3k1", "c1")
		w.lister.Set(first)
		w.lister.Fail(nil)
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := w.statuses(first, "ci"); !slices.Equal(got, []string{"queued"}) {
			t.Errorf("after the poll: %v", got)
		}
		second := rig.Push("3k2", "c2")
		second.Ref = "refs/heads/dev"
		w.lister.Set(first, second)
		w.in.Wake()
		synctest.Wait()
		if got := w.statuses(second, "ci"); !slices.Equal(got, []string{"queued"}) {
			t.Errorf("after the hint: %v", got)
		}
		cancel()
		<-done
	})
}

// stream is an event stream that sends the changes set, then waits.
type stream struct {
	changes []ingest.Change
}

func (s stream) Run(ctx context.Context, changed func(ingest.Change)) error {
	for _, c := range s.changes {
		changed(c)
	}
	<-ctx.Done()
	return ctx.Err()
}

// The event streams' changes: cursors are kept and saved, a change of
// another account's record wakes the reconciler (the runner's own check
// writes do not), the lister is told; each host is followed once.
func TestFollow(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		var mu sync.Mutex
		followed := map[string]int64{}
		w.ports.Stream = func(host string, cursor int64) ingest.Source {
			mu.Lock()
			defer mu.Unlock()
			followed[host] = cursor
			return stream{changes: []ingest.Change{
				{Host: host, Seq: 41, DID: rig.Runner, Collection: forge.CollectionCheck},
				{Host: host, Seq: 42, DID: "did:plc:author", Collection: forge.CollectionPull},
			}}
		}
		w.store.SetCursor("http://127.0.0.1:1", 7)
		w.in = New(w.cfg, w.facts, w.ports, nil)
		w.reconcile(t) // learns the hosts
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { w.in.Follow(ctx); close(done) }()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		select {
		case <-w.in.wake:
		default:
			t.Error("a pull record's change did not wake the reconciler")
		}
		cancel()
		<-done
		if diff := cmp.Diff(map[string]int64{"http://127.0.0.1:1": 7}, followed); diff != "" {
			t.Errorf("followed (-want +got):\n%s", diff)
		}
		if got := w.store.Snapshot().Cursors["http://127.0.0.1:1"]; got != 42 {
			t.Errorf("cursor saved %d, want 42", got)
		}
		if len(w.lister.Changes()) != 2 {
			t.Errorf("lister told of %d changes", len(w.lister.Changes()))
		}
	})
}

// TestOwnChecksDoNotWake: the runner's own check writes come back on
// the event stream; they must not wake the reconciler (one bad push once
// gave a reconcile per check write), while an owner's change does.
func TestOwnChecksDoNotWake(t *testing.T) {
	t.Parallel()
	owner := syntax.DID("did:plc:owner")
	for _, tt := range []struct {
		name string
		c    ingest.Change
		wake bool
	}{
		{"own check", ingest.Change{Host: "h", DID: rig.Runner, Collection: forge.CollectionCheck, Seq: 1}, false},
		{"owner push", ingest.Change{Host: "h", DID: owner, Collection: forge.CollectionRefUpdate, Seq: 2}, true},
		{"gap", ingest.Change{Host: "h", Gap: true}, true},
		{"other's check", ingest.Change{Host: "h", DID: owner, Collection: forge.CollectionCheck, Seq: 3}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			w.in.changed(tt.c)
			if got := len(w.in.wake) == 1; got != tt.wake {
				t.Errorf("woke: %v, want %v", got, tt.wake)
			}
		})
	}
}

// With a relay, the relay is the one host followed.
func TestEventHostsRelay(t *testing.T) {
	t.Parallel()
	in := New(Config{}, Facts{Relay: "http://relay.test"}, Ports{}, nil)
	if hosts := in.eventHosts(); !slices.Equal(hosts, []string{"http://relay.test"}) {
		t.Errorf("event hosts %v", hosts)
	}
}

// imageChecks is an executor that finds some images and records what
// it was asked.
type imageChecks struct {
	mu     sync.Mutex
	asked  []string
	absent map[string]bool
}

func (c *imageChecks) check(_ context.Context, image string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = append(c.asked, image)
	if c.absent[image] {
		return fmt.Errorf("image %s is not on the docker daemon and its registry does not serve it", image)
	}
	return nil
}

func (c *imageChecks) got() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.asked)
}

// TestWarnImages: at start the runner asks the executor about the
// images of the workflows that run for each watched repository's
// newest push, done or not, whose commit its mirror holds, and then of
// each new push's; it warns once per image it cannot find, naming the
// image, the workflow and the repository. A stranger's pull makes it
// ask nothing (issue 35: after a move to Docker, a workflow whose image
// the Docker daemon cannot find said so only when its run failed). A
// step's own image and a service's are asked about as the run's is.
func TestWarnImages(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	deploy := rig.CI("deploy", "make deploy")
	deploy.Image = "127.0.0.1:1/team/deploy:1"
	deploy.On = []workflow.Trigger{workflow.Push}
	deploy.Services = []workflow.Service{{Name: "db", Image: "127.0.0.1:1/team/db:1"}}
	deploy.Steps[0].Image = "127.0.0.1:1/team/tool:1"
	strangers := rig.CI("strangers", "make")
	strangers.Image = "127.0.0.1:1/stranger/probe:1"
	strangers.On = []workflow.Trigger{workflow.Pull}
	w.git.SetWorkflows(rig.CI("ci", "make"), deploy, strangers)
	checks := &imageChecks{absent: map[string]bool{deploy.Image: true}}
	var logs syncbuf.Buffer
	w.facts.DefaultImage = "busybox:stable"
	w.ports.CheckImage = checks.check
	w.in = New(w.cfg, w.facts, w.ports, slog.New(slog.NewTextHandler(&logs, nil)))

	// The newest push ran already (it is done): no work, but its
	// workflows are looked at, from the mirror.
	old, done := rig.Push("3k1", "c1"), rig.Push("3k2", "c2")
	if err := w.store.MarkDone(done.Key()); err != nil {
		t.Fatal(err)
	}
	if err := w.store.MarkDone(old.Key()); err != nil {
		t.Fatal(err)
	}
	w.git.Hold("c1", "c2")
	w.lister.Set(old, done, rig.Pull("did:plc:stranger", "3k3", "c3"))
	w.reconcile(t)
	if diff := cmp.Diff([]string{"busybox:stable", deploy.Image, "127.0.0.1:1/team/tool:1", "127.0.0.1:1/team/db:1"}, checks.got()); diff != "" {
		t.Errorf("images asked at start (-want +got):\n%s", diff)
	}
	warned := func() []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "cannot find the image") {
				out = append(out, l)
			}
		}
		return out
	}
	if got := warned(); len(got) != 1 || !strings.Contains(got[0], "image="+deploy.Image) || !strings.Contains(got[0], "workflow=deploy") ||
		!strings.Contains(got[0], "repo="+rig.Repo) || !strings.Contains(got[0], "level=WARN") {
		t.Errorf("warnings %q, want one naming %s, the workflow deploy and the repository", got, deploy.Image)
	}

	// A new push: its workflows' images were asked about already.
	w.lister.Set(old, done, rig.Push("3k4", "c4"))
	w.reconcile(t)
	w.reconcile(t)
	if got := checks.got(); len(got) != 4 {
		t.Errorf("images asked after more pushes: %v, want each once", got)
	}
	if got := warned(); len(got) != 1 {
		t.Errorf("warnings %q, want one", got)
	}
}

// A workflow's if decides whether it runs for an event: one whose if
// does not hold gets no check (as one whose branches do not match), one
// whose if cannot be decided an error check naming why.
func TestConsiderDecidesTheWorkflowsIf(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	sched := &recordingScheduler{}
	w.ports.Scheduler = sched
	w.in = New(w.cfg, w.facts, w.ports, nil)
	parse := func(name, cond string) *workflow.Workflow {
		wf, err := workflow.Parse(".knotless/workflows/"+name+".yaml", []byte("on: push\nif: \""+cond+"\"\nsteps:\n  - run: make\n"))
		if err != nil {
			t.Fatal(err)
		}
		return wf
	}
	const costly = "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, a+b+c+d > 0))))"
	w.git.SetWorkflows(parse("main", "event.branch == 'main' && event.trusted"), parse("dev", "event.branch == 'dev'"), parse("costly", costly))
	ev := rig.Push("3k1", "c1")
	if err := w.in.Consider(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	if want := []string{ev.CheckKey("main")}; !slices.Equal(sched.keys, want) {
		t.Errorf("jobs %v, want %v (main's alone)", sched.keys, want)
	}
	if c, ok := w.keeper.Get(ev.CheckKey("dev")); ok {
		t.Errorf("dev, whose if does not hold, has a check: %+v", c)
	}
	if c, _ := w.keeper.Get(ev.CheckKey("costly")); c.Status != "error" || !strings.Contains(c.Error, "workflow costly: if ") {
		t.Errorf("costly: %q %q, want an error check naming its if", c.Status, c.Error)
	}
}
