package scheduler

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
)

// The queue's rules alone: no PDS, no git, no executor.

func tasks(jobs ...*job.Job) []*task {
	ts := make([]*task, len(jobs))
	for i, j := range jobs {
		ts[i] = &task{Job: j}
	}
	return ts
}

func one(j *job.Job) *task { return &task{Job: j} }

func keys(ts []*task) []string {
	var ks []string
	for _, t := range ts {
		ks = append(ks, t.Key)
	}
	return ks
}

func TestQueueSupersedesWaiting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		first, then *job.Job
		dropped     []string
		waiting     []string
	}{
		{"newer push, same ref and workflow", pushJob("3k1", "main", "ci"), pushJob("3k2", "main", "ci"),
			[]string{"k-3k1-ci"}, []string{"k-3k2-ci"}},
		{"other ref", pushJob("3k1", "main", "ci"), pushJob("3k2", "dev", "ci"),
			nil, []string{"k-3k1-ci", "k-3k2-ci"}},
		{"other workflow", pushJob("3k1", "main", "ci"), pushJob("3k2", "main", "lint"),
			nil, []string{"k-3k1-ci", "k-3k2-lint"}},
		{"older push comes late", pushJob("3k2", "main", "ci"), pushJob("3k1", "main", "ci"),
			nil, []string{"k-3k2-ci", "k-3k1-ci"}},
		{"new head of the same pull", pullJob("did:plc:a", "3p1", "c1", "ci"), pullJob("did:plc:a", "3p1", "c2", "ci"),
			[]string{"k-3p1-c1-ci"}, []string{"k-3p1-c2-ci"}},
		{"another pull", pullJob("did:plc:a", "3p1", "c1", "ci"), pullJob("did:plc:a", "3p2", "c2", "ci"),
			nil, []string{"k-3p1-c1-ci", "k-3p2-c2-ci"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q := newQueue()
			if dropped, cancel := q.add(one(tc.first)); dropped != nil || cancel != nil {
				t.Fatalf("first add: dropped %v, cancel %v", keys(dropped), keys(cancel))
			}
			dropped, cancel := q.add(one(tc.then))
			if diff := cmp.Diff(tc.dropped, keys(dropped)); diff != "" {
				t.Errorf("dropped (-want +got):\n%s", diff)
			}
			if len(cancel) != 0 {
				t.Errorf("cancel = %v, want none: nothing runs", keys(cancel))
			}
			if diff := cmp.Diff(tc.waiting, keys(q.waiting)); diff != "" {
				t.Errorf("waiting (-want +got):\n%s", diff)
			}
		})
	}
}

func TestQueueSupersedesRunningOnce(t *testing.T) {
	t.Parallel()
	q := newQueue()
	old := one(pushJob("3k1", "main", "ci"))
	q.add(old)
	if got := q.claim(); got != old {
		t.Fatalf("claim = %v, want the only task", got)
	}
	_, cancel := q.add(one(pushJob("3k2", "main", "ci")))
	if diff := cmp.Diff([]string{"k-3k1-ci"}, keys(cancel)); diff != "" {
		t.Errorf("cancel (-want +got):\n%s", diff)
	}
	if want := string(pushJob("3k2", "main", "ci").Event.URI); old.superseded != want {
		t.Errorf("superseded = %q, want %q", old.superseded, want)
	}
	// A third push supersedes the waiting second; the running one is
	// already being cancelled and is not named again.
	dropped, cancel := q.add(one(pushJob("3k3", "main", "ci")))
	if diff := cmp.Diff([]string{"k-3k2-ci"}, keys(dropped)); diff != "" {
		t.Errorf("dropped (-want +got):\n%s", diff)
	}
	if len(cancel) != 0 {
		t.Errorf("cancel = %v, want none", keys(cancel))
	}
}

func TestQueueFinishIsNotSuperseded(t *testing.T) {
	t.Parallel()
	q := newQueue()
	finish := func(j *job.Job) *task { j.Workflow.Superseded = "finish"; return one(j) }
	first := finish(pushJob("3k1", "main", "ci"))
	q.add(first)
	q.claim()
	q.add(finish(pushJob("3k2", "main", "ci")))
	dropped, cancel := q.add(finish(pushJob("3k3", "main", "ci")))
	if len(dropped) != 0 || len(cancel) != 0 || first.superseded != "" {
		t.Errorf("dropped %v, cancel %v, superseded %q: want nothing", keys(dropped), keys(cancel), first.superseded)
	}
	if diff := cmp.Diff([]string{"k-3k2-ci", "k-3k3-ci"}, keys(q.waiting)); diff != "" {
		t.Errorf("waiting (-want +got):\n%s", diff)
	}
}

func TestQueueClaimsPushesFirst(t *testing.T) {
	t.Parallel()
	q := newQueue()
	for _, tk := range tasks(pullJob("did:plc:a", "3p1", "c1", "ci"), pullJob("did:plc:b", "3p2", "c2", "ci"), pushJob("3k1", "main", "ci")) {
		q.add(tk)
	}
	var got []string
	for t := q.claim(); t != nil; t = q.claim() {
		got = append(got, t.Key)
	}
	if diff := cmp.Diff([]string{"k-3k1-ci", "k-3p1-c1-ci", "k-3p2-c2-ci"}, got); diff != "" {
		t.Errorf("claim order (-want +got):\n%s", diff)
	}
	if len(q.running) != 3 || len(q.waiting) != 0 {
		t.Errorf("running %d, waiting %d; want 3, 0", len(q.running), len(q.waiting))
	}
}

func TestQueueInHandAndEnd(t *testing.T) {
	t.Parallel()
	q := newQueue()
	a, b := one(pushJob("3k1", "main", "ci")), one(pushJob("3k2", "dev", "ci"))
	q.add(a)
	q.add(b)
	q.claim()
	for _, tk := range []*task{a, b} {
		if !q.inHand(tk.Event.Key()) || !q.has(tk.Key) {
			t.Errorf("%s not in hand", tk.Key)
		}
	}
	q.end(a)
	if q.inHand(a.Event.Key()) || q.has(a.Key) {
		t.Errorf("%s in hand after it ended", a.Key)
	}
	adopted := one(pushJob("3k9", "main", "deploy"))
	q.start(adopted)
	if !q.inHand(adopted.Event.Key()) || q.running[adopted.Key] != adopted {
		t.Errorf("adopted task not running")
	}
	q.reserved["k-being-queued"] = true
	if !q.has("k-being-queued") {
		t.Error("a check being queued is not in hand")
	}
	if got := q.remove(b.Key); got != b || q.remove(b.Key) != nil || q.has(b.Key) {
		t.Errorf("remove = %v; want the waiting task, once", got)
	}
}

func TestQueueDrainReleases(t *testing.T) {
	t.Parallel()
	q := newQueue()
	going := one(pushJob("3k1", "main", "ci"))
	q.add(going)
	q.claim()
	q.add(one(pushJob("3k2", "dev", "ci")))
	q.add(one(pushJob("3k3", "other", "ci")))
	released, running := q.drain()
	if released != 2 || running != 1 {
		t.Errorf("drain = %d released, %d running; want 2, 1", released, running)
	}
	if tk := q.claim(); tk != nil {
		t.Errorf("a draining queue gave out %s", tk.Key)
	}
	q.add(one(pushJob("3k4", "main", "lint")))
	if tk := q.claim(); tk != nil {
		t.Errorf("a draining queue gave out %s", tk.Key)
	}
	if n := q.releaseRunning(); n != 1 || !going.released {
		t.Errorf("releaseRunning = %d, released %v; want 1, true", n, going.released)
	}
}

// TestQueueLoad is what an author has in hand as the caps count it:
// runs, not pulls (each workflow of each commit is one), without the
// older commit's runs of the pull being considered (it supersedes them)
// unless they finish; and the writes they all still owe (2 a queued
// run, 1 a running one).
func TestQueueLoad(t *testing.T) {
	t.Parallel()
	const spam, other = "did:plc:spam", "did:plc:other"
	q := newQueue()
	for _, tk := range tasks(
		pullJob(spam, "p1", "a", "lint"), pullJob(spam, "p1", "a", "test"),
		pullJob(spam, "p2", "b", "lint"), pullJob(other, "q1", "c", "lint"),
		pushJob("r1", "main", "ci"),
	) {
		q.add(tk)
	}
	q.claim() // the push
	q.claim() // p1's lint
	finish := pullJob(spam, "p3", "d", "deploy")
	finish.Workflow.Superseded = "finish"
	q.add(one(finish))
	for _, tc := range []struct {
		name      string
		a         string
		all       bool
		ev        work.Event
		wantRuns  int
		wantOwing int
	}{
		{"a new pull", spam, false, pullEvent(spam, "p9", "z"), 4, 1 + 2 + 2 + 2},
		{"a newer commit of p1", spam, false, pullEvent(spam, "p1", "a2"), 2, 7},
		{"the same commit of p1", spam, false, pullEvent(spam, "p1", "a"), 4, 7},
		{"a newer commit of a pull whose runs finish", spam, false, pullEvent(spam, "p3", "d2"), 4, 7},
		{"another author", other, false, pullEvent(other, "q2", "y"), 1, 2},
		{"the owner's pushes, limits on all", "did:plc:owner", true, pushEvent("did:plc:owner", "r0"), 1, 1},
		{"the owner's newer push of main, limits on all", "did:plc:owner", true, pushJob("r2", "main", "ci").Event, 0, 1},
	} {
		runs, owing := q.load(tc.a, tc.all, tc.ev)
		if runs != tc.wantRuns || owing != tc.wantOwing {
			t.Errorf("%s: load %d runs, %d owed; want %d, %d", tc.name, runs, owing, tc.wantRuns, tc.wantOwing)
		}
	}
}

// TestClaimIndex: a worker takes the owner's push before strangers'
// pulls queued ahead of it, else the oldest job.
func TestClaimIndex(t *testing.T) {
	t.Parallel()
	q := []*task{{Job: &job.Job{Event: pullEvent("did:plc:a", "p1", "a")}}, {Job: &job.Job{Event: pullEvent("did:plc:b", "p2", "b")}},
		{Job: &job.Job{Event: pushEvent("did:plc:o", "r1")}}, {Job: &job.Job{Event: pushEvent("did:plc:o", "r2")}}}
	if got := claimIndex(q, nil); got != 2 {
		t.Errorf("claimIndex = %d, want 2 (the first push)", got)
	}
	if got := claimIndex(q[:2], nil); got != 0 {
		t.Errorf("pulls only: claimIndex = %d, want 0", got)
	}
}
