package runctl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// Run control alone, its ports faked: what it does with records and
// schedules it cannot act on, and with ports that fail.

// fake is every port of run control but the mirrors, in memory: the
// checks known, what is in hand, the state, and what intake was asked.
type fake struct {
	mu         sync.Mutex
	checks     map[string]forge.Check
	inHand     map[string]bool
	cancelOK   bool
	cancelled  []string
	considered []work.Event
	errors     []string // "workflow: text"
	// considerErr fails ConsiderControl; stateErr the state's writes.
	considerErr error
	stateErr    error
	last        map[string]time.Time
}

func newFake() *fake {
	return &fake{checks: map[string]forge.Check{}, inHand: map[string]bool{}, last: map[string]time.Time{}}
}

func (f *fake) HasCheck(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inHand[key]
}
func (f *fake) Waiting(key string) bool { return f.HasCheck(key) }
func (f *fake) CancelCheck(_ context.Context, key, _ string, _ work.Event, _ forge.Check) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cancelOK {
		f.cancelled = append(f.cancelled, key)
	}
	return f.cancelOK
}
func (f *fake) Get(key string) (forge.Check, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.checks[key]
	return c, ok
}
func (f *fake) Work(forge.Subject) []forge.Check { return nil }
func (f *fake) Unfinished() map[string]forge.Check {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]forge.Check{}
	for k, c := range f.checks {
		if c.Status == "queued" {
			out[k] = c
		}
	}
	return out
}
func (f *fake) Final(string) bool                                  { return false }
func (f *fake) Done(string) bool                                   { return false }
func (f *fake) ScheduleLast(repo, wf string) time.Time             { return f.last[repo+" "+wf] }
func (f *fake) KeepSchedules(string, []string) (int, error)        { return 1, f.stateErr }
func (f *fake) KeepScheduleRepos(served []string) (int, error)     { return 1, f.stateErr }
func (f *fake) SetScheduleLast(repo, wf string, t time.Time) error { return f.stateErr }
func (f *fake) ConsiderControl(_ context.Context, ev work.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.considered = append(f.considered, ev)
	return f.considerErr
}
func (f *fake) ControlError(_ context.Context, _ work.Event, wf, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errors = append(f.errors, wf+": "+msg)
}

// mirrors are mirrors whose open, branch or workflows fail as set.
type mirrors struct {
	open, branch, read error
	wfs                []*workflow.Workflow
	bad                []error
	// branches counts the Branch calls (a fetch of the source each).
	branches atomic.Int32
}

func (m *mirrors) Open(context.Context, string) (job.Repo, error) {
	if m.open != nil {
		return nil, m.open
	}
	return repo{m: m}, nil
}

type repo struct {
	job.Repo
	m *mirrors
}

func (r repo) Branch(context.Context, string, string) (string, error) {
	r.m.branches.Add(1)
	return rig.BaseCommit("main"), r.m.branch
}
func (r repo) Workflows(context.Context, string) ([]*workflow.Workflow, []error, error) {
	return r.m.wfs, r.m.bad, r.m.read
}

// part is run control on f and m, its log in buf.
func part(f *fake, m *mirrors, buf *syncbuf.Buffer) *Part {
	return New(Config{}, rig.Runner, Ports{Scheduler: f, Checks: f, State: f, Mirrors: m, Intake: f}, slog.New(slog.NewTextHandler(buf, nil)))
}

func oldTID() string { return syntax.NewTIDFromTime(time.Now().Add(-2*DefaultRetention), 0).String() }

// Records run control does not act on: past the retention, of work
// not known, of a repository not served, of a pull no longer open, a
// dispatch of a ref that is no branch; each asks intake nothing, and
// says why only when the record's author should know.
func TestRecordsNotActedOn(t *testing.T) {
	t.Parallel()
	push := rig.Push("3k1", "c1")
	pull := rig.Pull("did:plc:author", "3p1", "h1")
	pushKey, pullKey := forge.CheckKey(push.Subject(), "ci"), forge.CheckKey(pull.Subject(), "ci")
	elsewhere := rig.Push("3k2", "c2")
	elsewhere.Repo = rig.OtherRepo("other")
	elsewhereKey := forge.CheckKey(elsewhere.Subject(), "ci")
	tag := rig.DispatchOf(tid(1), "refs/tags/v1", "deploy")
	unserved := rig.DispatchOf(tid(2), "refs/heads/main", "deploy")
	unserved.Value.Repo = elsewhere.Repo.URI.String()
	for _, tc := range []struct {
		name     string
		controls ingest.Controls
		said     string // in the log; "" says nothing
	}{
		{"a re-run past the retention", ingest.Controls{Reruns: []forge.Record[forge.Rerun]{rig.RerunOf(rig.Owner, oldTID(), pushKey, forge.Rerun{})}}, ""},
		{"a re-run of work not known", ingest.Controls{Reruns: []forge.Record[forge.Rerun]{rig.RerunOf(rig.Owner, tid(1), "nope", forge.Rerun{})}}, ""},
		{"a re-run of a repository not served", ingest.Controls{Reruns: []forge.Record[forge.Rerun]{rig.RerunOf(rig.Owner, tid(1), elsewhereKey, forge.Rerun{})}},
			"is not served by this runner now"},
		{"a re-run of a pull no longer open", ingest.Controls{Reruns: []forge.Record[forge.Rerun]{rig.RerunOf("did:plc:author", tid(1), pullKey, forge.Rerun{})}},
			"is not open"},
		{"a dispatch past the retention", ingest.Controls{Dispatches: []forge.Record[forge.Dispatch]{rig.DispatchOf(oldTID(), "refs/heads/main", "deploy")}}, ""},
		{"a dispatch of a tag", ingest.Controls{Dispatches: []forge.Record[forge.Dispatch]{tag}}, "is not a branch"},
		{"a dispatch of a repository not served", ingest.Controls{Dispatches: []forge.Record[forge.Dispatch]{unserved}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFake()
			for _, ev := range []work.Event{push, pull, elsewhere} {
				f.checks[forge.CheckKey(ev.Subject(), "ci")] = forge.Check{Subject: ev.Subject(), Workflow: "ci", Status: "failure"}
			}
			buf := &syncbuf.Buffer{}
			p := part(f, &mirrors{}, buf)
			snap := &ingest.Snapshot{Repos: []forge.Record[forge.Repo]{rig.RepoRecord()}, Controls: tc.controls}
			p.Act(t.Context(), snap)
			p.Act(t.Context(), snap)
			if len(f.considered) != 0 || len(f.errors) != 0 {
				t.Errorf("intake asked: %v, error checks %v", f.considered, f.errors)
			}
			if tc.said == "" && strings.Contains(buf.String(), "refused") || tc.said != "" && strings.Count(buf.String(), tc.said) != 1 {
				t.Errorf("logged:\n%s\nwant %q once", buf, tc.said)
			}
		})
	}
}

// A dispatch whose branch or workflows cannot be read is tried again at
// each reconcile, said once; one the source refuses is refused; an
// invalid workflow file is the dispatch's error check.
func TestDispatchFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		m      *mirrors
		said   string
		errors []string
	}{
		{"the mirror does not open", &mirrors{open: rig.ErrDown}, "dispatch not handled", nil},
		{"the branch is not read", &mirrors{branch: rig.ErrDown}, "dispatch not handled", nil},
		{"the workflows are not read", &mirrors{read: rig.ErrDown}, "dispatch not handled", nil},
		{"the source is refused", &mirrors{branch: fmt.Errorf("%w: no", mirror.ErrRefused)}, "run-control record refused", nil},
		{"the workflow file is invalid", &mirrors{bad: []error{workflow.Errors{{Position: workflow.Position{File: ".knotless/workflows/deploy.yaml", Line: 1}, Msg: "bad"}}}}, "",
			[]string{"deploy: invalid workflow file:\n.knotless/workflows/deploy.yaml:1:0: bad"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFake()
			buf := &syncbuf.Buffer{}
			p := part(f, tc.m, buf)
			snap := &ingest.Snapshot{Repos: []forge.Record[forge.Repo]{rig.RepoRecord()},
				Controls: ingest.Controls{Dispatches: []forge.Record[forge.Dispatch]{rig.DispatchOf(tid(1), "refs/heads/main", "deploy")}}}
			p.Act(t.Context(), snap)
			p.Act(t.Context(), snap)
			if tc.said != "" && strings.Count(buf.String(), tc.said) != 1 {
				t.Errorf("logged:\n%s\nwant %q once", buf, tc.said)
			}
			if len(f.considered) != 0 {
				t.Errorf("considered %v", f.considered)
			}
			if want := slices.Concat(tc.errors, tc.errors); tc.errors != nil && !slices.Equal(f.errors, want) {
				t.Errorf("error checks %q, want %q", f.errors, want)
			}
		})
	}
}

// A cancel of work being queued is tried again at the next reconcile,
// and acted on once.
func TestCancelWhileQueued(t *testing.T) {
	t.Parallel()
	f := newFake()
	push := rig.Push("3k1", "c1")
	key := forge.CheckKey(push.Subject(), "ci")
	f.checks[key] = forge.Check{Subject: push.Subject(), Workflow: "ci", Status: "queued"}
	p := part(f, &mirrors{}, &syncbuf.Buffer{})
	snap := &ingest.Snapshot{Controls: ingest.Controls{Cancels: []forge.Record[forge.Cancel]{rig.CancelOf(rig.Owner, "o1", key)}}}
	p.Cancel(t.Context(), snap)
	f.cancelOK = true
	p.Cancel(t.Context(), snap)
	p.Cancel(t.Context(), snap)
	if !slices.Equal(f.cancelled, []string{key}) {
		t.Errorf("cancelled %v, want %s once", f.cancelled, key)
	}
}

// Work an earlier process left unfinished is taken up when it is run
// control's (a re-run still listed, a tick) and not in hand; a failure
// to consider it is logged and tried again.
func TestResume(t *testing.T) {
	t.Parallel()
	push := rig.Push("3k1", "c1")
	rr := rig.RerunOf(rig.Owner, tid(1), forge.CheckKey(push.Subject(), "ci"), forge.Rerun{})
	tick := work.Event{Kind: forge.KindSchedule, URI: rig.RepoRecord().URI, Repo: rig.RepoRecord(), Ref: "refs/heads/main", Commit: rig.BaseCommit("main"),
		Control: work.Control{Tick: "2025-01-01T00:00:00Z"}}
	elsewhere := tick
	elsewhere.Repo = rig.OtherRepo("other")
	checks := map[string]forge.Check{
		"rerun":        {Subject: push.Subject(), Workflow: "ci", Status: "queued", Attempt: 2, Cause: rr.URI.String()},
		"rerun gone":   {Subject: push.Subject(), Workflow: "ci", Status: "queued", Attempt: 3, Cause: "at://" + rig.Owner + "/" + forge.CollectionRerun + "/gone"},
		"tick":         {Subject: tick.Subject(), Workflow: "nightly", Status: "queued"},
		"tick unknown": {Subject: elsewhere.Subject(), Workflow: "nightly", Status: "queued"},
		"push":         {Subject: push.Subject(), Workflow: "ci", Status: "queued"},
		"in hand":      {Subject: tick.Subject(), Workflow: "other", Status: "queued"},
	}
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprint("consider fails: ", fail), func(t *testing.T) {
			t.Parallel()
			f := newFake()
			maps.Copy(f.checks, checks)
			f.inHand["in hand"] = true
			if fail {
				f.considerErr = rig.ErrDown
			}
			buf := &syncbuf.Buffer{}
			p := part(f, &mirrors{}, buf)
			snap := &ingest.Snapshot{Repos: []forge.Record[forge.Repo]{rig.RepoRecord()}, Events: []work.Event{push},
				Controls: ingest.Controls{Reruns: []forge.Record[forge.Rerun]{rr}}}
			// Not acted on: the re-run record's own attempt 2 is
			// what resume takes up (the check of the record's
			// event is not known, so reruns skip it).
			p.resume(t.Context(), snap)
			var got []string
			for _, ev := range f.considered {
				for wf, n := range ev.Workflows {
					got = append(got, fmt.Sprintf("%s %s %d", ev.Kind, wf, n))
				}
			}
			slices.Sort(got)
			if want := []string{"push ci 2", "schedule nightly 1"}; !slices.Equal(got, want) {
				t.Errorf("taken up %v, want %v", got, want)
			}
			if said := strings.Contains(buf.String(), "tried again at the next reconcile"); said != fail {
				t.Errorf("logged:\n%s", buf)
			}
		})
	}
}

// Schedules that cannot be read are read again at the next reconcile;
// an unreadable cron is said; a tick intake fails to take is tried
// again; a state that fails to save is logged, not fatal.
func TestScheduleFailures(t *testing.T) {
	t.Parallel()
	bad := rig.CI("bad", "make")
	bad.On, bad.Schedule = []workflow.Trigger{workflow.Schedule}, []workflow.Cron{{Spec: "not a cron"}}
	every := rig.CI("every", "make")
	every.On, every.Schedule = []workflow.Trigger{workflow.Schedule}, []workflow.Cron{{Spec: "* * * * *"}}
	for _, tc := range []struct {
		name  string
		m     *mirrors
		setup func(*fake)
		said  []string
		retry bool
	}{
		{"the mirror does not open", &mirrors{open: rig.ErrDown}, nil, []string{"schedules not read"}, false},
		{"the branch is not read", &mirrors{branch: rig.ErrDown}, nil, []string{"schedules not read"}, false},
		{"the workflows are not read", &mirrors{read: rig.ErrDown}, nil, []string{"schedules not read"}, false},
		{"a cron is unreadable", &mirrors{wfs: []*workflow.Workflow{bad}}, nil, []string{"schedule unreadable"}, false},
		{"intake does not take the tick", &mirrors{wfs: []*workflow.Workflow{every}}, func(f *fake) {
			f.considerErr = rig.ErrDown
			f.last[rig.Repo+" every"] = time.Now().Add(-time.Hour)
		}, []string{"scheduled run not queued"}, true},
		{"the state is not saved", &mirrors{wfs: []*workflow.Workflow{every}}, func(f *fake) { f.stateErr = errors.New("disk full") },
			[]string{"save state"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFake()
			if tc.setup != nil {
				tc.setup(f)
			}
			buf := &syncbuf.Buffer{}
			p := part(f, tc.m, buf)
			p.Act(t.Context(), &ingest.Snapshot{Repos: []forge.Record[forge.Repo]{rig.RepoRecord()}, Complete: true})
			for _, want := range tc.said {
				if !strings.Contains(buf.String(), want) {
					t.Errorf("logged:\n%s\nwant %q", buf, want)
				}
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			if mem := p.schedules[rig.Repo]; tc.retry != (mem != nil && mem.retry) {
				t.Errorf("kept %+v, want retry %v", mem, tc.retry)
			}
		})
	}
}

// A repository whose default branch is not in its source has no
// schedules, said once: the branch is not fetched again at each
// reconcile, only once a push to it is seen.
func TestScheduleWithoutTheDefaultBranch(t *testing.T) {
	t.Parallel()
	f := newFake()
	m := &mirrors{branch: fmt.Errorf("%w main at file:///src", mirror.ErrNoBranch)}
	buf := &syncbuf.Buffer{}
	p := part(f, m, buf)
	snap := &ingest.Snapshot{Repos: []forge.Record[forge.Repo]{rig.RepoRecord()}, Complete: true}
	for range 3 {
		p.Act(t.Context(), snap)
	}
	if n := m.branches.Load(); n != 1 {
		t.Errorf("the source's branch read %d times in 3 reconciles, want 1", n)
	}
	if n := strings.Count(buf.String(), "no schedules: the default branch is not in the source"); n != 1 || strings.Contains(buf.String(), "schedules not read") {
		t.Errorf("said %d times, want once and no warning; logged:\n%s", n, buf)
	}
	// A push to the branch: read again.
	snap.Events = append(snap.Events, rig.Push("3k9", "c9"))
	p.Act(t.Context(), snap)
	if n := m.branches.Load(); n != 2 {
		t.Errorf("after a push to it the branch was read %d times in all, want 2", n)
	}
}

// A Config with no retention takes the default; run control with no
// schedule known has no next tick.
func TestNew(t *testing.T) {
	t.Parallel()
	p := New(Config{}, rig.Runner, Ports{}, nil)
	if p.cfg.Retention != DefaultRetention || !p.Next().IsZero() {
		t.Errorf("retention %s, next %s", p.cfg.Retention, p.Next())
	}
}

// Act stops with its context.
func TestActStopsWithItsContext(t *testing.T) {
	t.Parallel()
	f := newFake()
	p := part(f, &mirrors{}, &syncbuf.Buffer{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	key := forge.CheckKey(rig.Push("3k1", "c1").Subject(), "ci")
	f.checks["x"] = forge.Check{Status: "queued"}
	p.Act(ctx, &ingest.Snapshot{Repos: []forge.Record[forge.Repo]{rig.RepoRecord()},
		Controls: ingest.Controls{Reruns: []forge.Record[forge.Rerun]{rig.RerunOf(rig.Owner, tid(1), key, forge.Rerun{})},
			Dispatches: []forge.Record[forge.Dispatch]{rig.DispatchOf(tid(2), "refs/heads/main", "deploy")}}})
	if len(f.considered) != 0 {
		t.Errorf("considered %v after its context ended", f.considered)
	}
}
