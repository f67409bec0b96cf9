package intake

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
)

// push is a push numbered n to the repository named repo.
func burstPush(repo string, n int) ingest.Event {
	return ingest.Event{Kind: forge.KindPush,
		URI:  syntax.ATURI(fmt.Sprintf("at://did:plc:owner/%s/%s-%d", forge.CollectionRefUpdate, repo, n)),
		Repo: forge.Record[forge.Repo]{URI: syntax.ATURI("at://did:plc:owner/" + forge.CollectionRepo + "/" + repo)}}
}

func names(evs []ingest.Event) []string {
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
	evs := []ingest.Event{burstPush("a", 1), burstPush("b", 1), burstPush("a", 2), burstPush("c", 1), burstPush("b", 2)}
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
				var evs []ingest.Event
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
				eachLane(t.Context(), evs, ConsiderAtOnce, func(ev ingest.Event) {
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

// A reconcile that ends starts no more lanes.
func TestEachLaneStopsWithItsContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	var mu sync.Mutex
	calls := 0
	evs := []ingest.Event{burstPush("a", 1), burstPush("b", 1), burstPush("c", 1)}
	eachLane(ctx, evs, 1, func(ingest.Event) {
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
	var evs []ingest.Event
	for r := range n {
		evs = append(evs, burstPush(fmt.Sprintf("r%d", r), 1))
	}
	for _, limit := range []int{1, ConsiderAtOnce} {
		b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) {
			for b.Loop() {
				eachLane(context.Background(), evs, limit, func(ingest.Event) { time.Sleep(time.Millisecond) })
			}
		})
	}
}
