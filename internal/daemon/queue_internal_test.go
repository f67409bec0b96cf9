package daemon

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/workflow"
)

// The queue's rules alone: no PDS, no git, no executor.

const testRepo = "at://did:plc:owner/" + forge.CollectionRepo + "/r"

func pushJob(rkey, ref, wf string) *job {
	ev := pushEvent("did:plc:owner", rkey)
	ev.Ref = "refs/heads/" + ref
	ev.Repo.URI = syntax.ATURI(testRepo)
	return &job{key: "k-" + rkey + "-" + wf, ev: ev, wf: &workflow.Workflow{Name: wf}}
}

func pullJob(author, rkey, commit, wf string) *job {
	ev := pullEvent(author, rkey, commit)
	ev.Pull = &forge.Pull{}
	ev.Repo.URI = syntax.ATURI(testRepo)
	return &job{key: "k-" + rkey + "-" + commit + "-" + wf, ev: ev, wf: &workflow.Workflow{Name: wf}}
}

func keys(jobs []*job) []string {
	var ks []string
	for _, j := range jobs {
		ks = append(ks, j.key)
	}
	return ks
}

func TestQueueSupersedesWaiting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		first, then *job
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
			if dropped, cancel := q.add(tc.first); dropped != nil || cancel != nil {
				t.Fatalf("first add: dropped %v, cancel %v", keys(dropped), keys(cancel))
			}
			dropped, cancel := q.add(tc.then)
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
	old := pushJob("3k1", "main", "ci")
	q.add(old)
	if got := q.claim(); got != old {
		t.Fatalf("claim = %v, want the only job", got)
	}
	_, cancel := q.add(pushJob("3k2", "main", "ci"))
	if diff := cmp.Diff([]string{"k-3k1-ci"}, keys(cancel)); diff != "" {
		t.Errorf("cancel (-want +got):\n%s", diff)
	}
	if want := string(pushJob("3k2", "main", "ci").ev.URI); old.superseded != want {
		t.Errorf("superseded = %q, want %q", old.superseded, want)
	}
	// A third push supersedes the waiting second; the running one is
	// already being cancelled and is not named again.
	dropped, cancel := q.add(pushJob("3k3", "main", "ci"))
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
	first := pushJob("3k1", "main", "ci")
	first.wf.Superseded = "finish"
	q.add(first)
	q.claim()
	second := pushJob("3k2", "main", "ci")
	second.wf.Superseded = "finish"
	q.add(second)
	third := pushJob("3k3", "main", "ci")
	third.wf.Superseded = "finish"
	dropped, cancel := q.add(third)
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
	q.add(pullJob("did:plc:a", "3p1", "c1", "ci"))
	q.add(pullJob("did:plc:b", "3p2", "c2", "ci"))
	q.add(pushJob("3k1", "main", "ci"))
	var got []string
	for j := q.claim(); j != nil; j = q.claim() {
		got = append(got, j.key)
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
	a, b := pushJob("3k1", "main", "ci"), pushJob("3k2", "dev", "ci")
	q.add(a)
	q.add(b)
	q.claim()
	for _, j := range []*job{a, b} {
		if !q.inHand(j.ev.Key()) {
			t.Errorf("%s not in hand", j.key)
		}
	}
	if got := len(q.jobs()); got != 2 {
		t.Errorf("jobs = %d, want 2", got)
	}
	q.end(a)
	if q.inHand(a.ev.Key()) {
		t.Errorf("%s in hand after it ended", a.key)
	}
	adopted := pushJob("3k9", "main", "deploy")
	q.start(adopted)
	if !q.inHand(adopted.ev.Key()) || q.running[adopted.key] != adopted {
		t.Errorf("adopted job not running")
	}
}

func TestQueueDrainReleases(t *testing.T) {
	t.Parallel()
	q := newQueue()
	going := pushJob("3k1", "main", "ci")
	q.add(going)
	q.claim()
	q.add(pushJob("3k2", "dev", "ci"))
	q.add(pushJob("3k3", "other", "ci"))
	released, running := q.drain()
	if released != 2 || running != 1 {
		t.Errorf("drain = %d released, %d running; want 2, 1", released, running)
	}
	if j := q.claim(); j != nil {
		t.Errorf("a draining queue gave out %s", j.key)
	}
	q.add(pushJob("3k4", "main", "lint"))
	if j := q.claim(); j != nil {
		t.Errorf("a draining queue gave out %s", j.key)
	}
	if n := q.releaseRunning(); n != 1 || !going.released {
		t.Errorf("releaseRunning = %d, released %v; want 1, true", n, going.released)
	}
}

// TestQueueDeferral: an event waiting for its author's caps is logged
// once per limit it waits for, and what it needs, once known, is kept
// for the next look (no second fetch to know it); admitted, it is
// forgotten.
func TestQueueDeferral(t *testing.T) {
	t.Parallel()
	q := newQueue()
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
		if got := q.hold("ev", tc.d, tc.n); got != tc.wantFirst {
			t.Errorf("call %d: hold(%s) first = %v, want %v", i, tc.d.flag, got, tc.wantFirst)
		}
		if got := q.need("ev"); got != tc.wantNeed {
			t.Errorf("call %d: need %+v, want %+v", i, got, tc.wantNeed)
		}
	}
	q.hold("gone", byRuns, need{})
	q.hold("listed", byRuns, need{})
	q.forgetDeferred(func(k string) bool { return k == "gone" })
	if _, ok := q.deferred["gone"]; ok || len(q.deferred) != 1 {
		t.Errorf("deferred %v after forgetting the event no longer listed", q.deferred)
	}
}

// TestNextWaitsForWork drives the workers' claim under synctest: a
// worker waits while the queue is empty, wakes when a job is added, and
// returns nil once the daemon drains.
func TestNextWaitsForWork(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d := &Daemon{q: newQueue()}
		ctx := t.Context()
		got := make(chan *job)
		go func() {
			for {
				j, jctx := d.next(ctx, context.Background())
				if j != nil && jctx == nil {
					t.Error("a claimed job has no context")
				}
				got <- j
				if j == nil {
					return
				}
			}
		}()
		synctest.Wait()
		select {
		case j := <-got:
			t.Fatalf("claimed %v from an empty queue", j)
		default:
		}
		want := pushJob("3k1", "main", "ci")
		d.mu.Lock()
		d.q.add(want)
		d.mu.Unlock()
		if j := <-got; j != want {
			t.Fatalf("claimed %v, want %s", j, want.key)
		}
		if want.cancel == nil {
			t.Error("claimed job has no cancel")
		}
		synctest.Wait()
		d.mu.Lock()
		d.q.drain()
		d.mu.Unlock()
		if j := <-got; j != nil {
			t.Fatalf("claimed %s while draining", j.key)
		}
	})
}
