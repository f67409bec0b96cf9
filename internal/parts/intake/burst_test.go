package intake

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/work"
)

// push is a push numbered n to the repository named repo.
func burstPush(repo string, n int) work.Event {
	return work.Event{Kind: forge.KindPush,
		URI:  syntax.ATURI(fmt.Sprintf("at://did:plc:owner/%s/%s-%d", forge.CollectionRefUpdate, repo, n)),
		Repo: forge.Record[forge.Repo]{URI: syntax.ATURI("at://did:plc:owner/" + forge.CollectionRepo + "/" + repo)}}
}

func names(evs []work.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.URI.RecordKey().String())
	}
	return out
}

// The lanes are the repositories, in the order of their first event;
// each keeps its events in the listing's order.
func TestLanes(t *testing.T) {
	t.Parallel()
	evs := []work.Event{burstPush("a", 1), burstPush("b", 1), burstPush("a", 2), burstPush("c", 1), burstPush("b", 2)}
	var got [][]string
	for _, l := range lanes(evs) {
		got = append(got, names(l))
	}
	want := [][]string{{"a-1", "a-2"}, {"b-1", "b-2"}, {"c-1"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("lanes (-want +got):\n%s", diff)
	}
}

// A burst of events to N repositories is considered side by side: each
// call waits until all N have begun (a blocking fake), which only
// happens when they run at once; with more repositories than
// ConsiderAtOnce, no more than that go on together, and the events of
// one repository never overlap and keep their order.
func TestEachLaneConsidersRepositoriesAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		repos, perRep int
		want          int
	}{
		{"one each, as many as the bound", ConsiderAtOnce, 1, ConsiderAtOnce},
		{"more repositories than the bound", ConsiderAtOnce + 3, 2, ConsiderAtOnce},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				var evs []work.Event
				for n := range tc.perRep {
					for r := range tc.repos {
						evs = append(evs, burstPush(fmt.Sprintf("r%d", r), n))
					}
				}
				var mu sync.Mutex
				going, most, begun := 0, 0, 0
				inRepo := map[string]bool{}
				order := map[string][]string{}
				all := make(chan struct{})
				eachLane(t.Context(), evs, ConsiderAtOnce, nil, func(_ context.Context, ev work.Event) {
					repo := ev.Repo.URI.String()
					mu.Lock()
					if inRepo[repo] {
						t.Errorf("two events of %s at once", repo)
					}
					inRepo[repo] = true
					order[repo] = append(order[repo], ev.URI.RecordKey().String())
					going++
					most = max(most, going)
					if begun++; begun == tc.want {
						close(all)
					}
					mu.Unlock()
					// The fake waits for the others (a fake hour at most:
					// one after another, each waits it out alone).
					select {
					case <-all:
					case <-time.After(time.Hour):
					}
					mu.Lock()
					going--
					inRepo[repo] = false
					mu.Unlock()
				})
				if most != tc.want {
					t.Errorf("%d events considered at once at most, want %d", most, tc.want)
				}
				for repo, got := range order {
					for i, name := range got {
						if want := fmt.Sprintf("%s-%d", repo[len(repo)-2:], i); name != want && tc.perRep > 1 {
							t.Errorf("%s considered %v: out of the listing's order", repo, got)
							break
						}
					}
				}
			})
		})
	}
}

// The first lanes (as many as go at once) expect their check writes
// before any lane starts: a lane whose run's running check is written
// at once must find the others expecting theirs already, else it goes
// alone (a flake of TestBurstWritesItsChecksInOneCommit on a loaded
// machine). Each expectation here takes a (fake) millisecond to make,
// time in which a lane already started would consider its event. The
// lanes beyond the bound expect theirs as they start, and every
// expectation ends.
func TestEachLaneExpectsBeforeAnyLaneStarts(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const limit = 3
		var evs []work.Event
		for r := range limit + 2 {
			evs = append(evs, burstPush(fmt.Sprintf("r%d", r), 1))
		}
		var mu sync.Mutex
		expected, ended := 0, 0
		var atFirstCall []int
		expect := func(ctx context.Context) (context.Context, func()) {
			time.Sleep(time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			expected++
			var once sync.Once
			return ctx, func() { once.Do(func() { mu.Lock(); ended++; mu.Unlock() }) }
		}
		eachLane(t.Context(), evs, limit, expect, func(context.Context, work.Event) {
			mu.Lock()
			atFirstCall = append(atFirstCall, expected)
			mu.Unlock()
		})
		if atFirstCall[0] != limit {
			t.Errorf("%d lanes expected their writes when the first lane began, want %d", atFirstCall[0], limit)
		}
		if expected != len(evs) || ended != len(evs) {
			t.Errorf("%d expectations made and %d ended, want %d of each", expected, ended, len(evs))
		}
	})
}

// A reconcile whose context ends before its lanes start ends the
// expectations made for them ahead: none holds the check writes back.
func TestEachLaneEndsExpectationsOfLanesNotStarted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var mu sync.Mutex
	made, ended := 0, 0
	expect := func(ctx context.Context) (context.Context, func()) {
		mu.Lock()
		defer mu.Unlock()
		made++
		return ctx, func() { mu.Lock(); ended++; mu.Unlock() }
	}
	evs := []work.Event{burstPush("a", 1), burstPush("b", 1), burstPush("c", 1)}
	eachLane(ctx, evs, 2, expect, func(context.Context, work.Event) { t.Error("an event considered after the context ended") })
	if ended < made {
		t.Errorf("%d expectations made, %d ended: want every one made ended", made, ended)
	}
}

// A reconcile that ends starts no more lanes.
func TestEachLaneStopsWithItsContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	var mu sync.Mutex
	calls := 0
	evs := []work.Event{burstPush("a", 1), burstPush("b", 1), burstPush("c", 1)}
	eachLane(ctx, evs, 1, nil, func(context.Context, work.Event) {
		mu.Lock()
		calls++
		mu.Unlock()
		cancel()
	})
	if calls != 1 {
		t.Errorf("%d events considered after the context ended, want 1", calls)
	}
}

// BenchmarkBurst: N events to N repositories, each taking about a
// millisecond to consider (a fetch and a workflow read); at once
// against one after another (limit 1). The ratio is what the bound
// buys a burst.
func BenchmarkBurst(b *testing.B) {
	const n = 8
	var evs []work.Event
	for r := range n {
		evs = append(evs, burstPush(fmt.Sprintf("r%d", r), 1))
	}
	for _, limit := range []int{1, ConsiderAtOnce} {
		b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) {
			for b.Loop() {
				eachLane(context.Background(), evs, limit, nil, func(context.Context, work.Event) { time.Sleep(time.Millisecond) })
			}
		})
	}
}

// A burst's check writes go as one commit: the lanes considered side by
// side expect their first check write, and a run a free worker takes at
// once its running record, so the first write waits for the others
// instead of going alone. Under synctest the linger's timer fires only
// when every goroutine waits: the writes meet because they expected
// each other, not because they were quick.
func TestBurstWritesItsChecksInOneCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		workers bool
		status  string
	}{
		{"no worker free: the queued checks", false, "queued"},
		{"workers free: the running checks", true, "running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := &world{pds: &rig.PDS{}, lister: &rig.Lister{}, git: &rig.Mirrors{}, lander: &offers{}, batches: &batchLog{}}
				store, err := state.Open(t.TempDir())
				if err != nil {
					t.Fatal(err)
				}
				w.store, w.facts, w.workers = store, Facts{Runner: rig.Runner}, ConsiderAtOnce
				w.build(t)
				w.git.SetWorkflows(rig.CI("ci", "make"))
				var evs []work.Event
				var want []string
				for i := range ConsiderAtOnce {
					ev := rig.Push(fmt.Sprintf("3k%d", i), "c1")
					ev.Repo = rig.OtherRepo(fmt.Sprintf("r%d", i))
					evs = append(evs, ev)
					want = append(want, forge.CheckKey(ev.Subject(), "ci")+" "+tc.status)
				}
				slices.Sort(want)
				w.lister.Set(evs...)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				if tc.workers {
					wait := w.sched.Start(ctx, ctx)
					defer wait()
				}
				w.reconcile(t)
				synctest.Wait()
				var got [][]string
				for _, b := range w.batches.all() {
					if strings.HasSuffix(b[0], " "+tc.status) {
						got = append(got, b)
					}
				}
				if diff := cmp.Diff([][]string{want}, got); diff != "" {
					t.Errorf("batches of %s checks (-want +got):\n%s\nall writes: %q", tc.status, diff, w.pds.Writes())
				}
				cancel()
			})
		})
	}
}
