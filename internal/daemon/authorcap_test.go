package daemon

import (
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
)

func pullEvent(author, rkey, commit string) ingest.Event {
	return ingest.Event{Kind: forge.KindPull, URI: syntax.ATURI("at://" + author + "/" + forge.CollectionPull + "/" + rkey), Commit: commit}
}

func pushEvent(owner, rkey string) ingest.Event {
	return ingest.Event{Kind: forge.KindPush, URI: syntax.ATURI("at://" + owner + "/" + forge.CollectionRefUpdate + "/" + rkey), Commit: "c" + rkey, Trusted: true}
}

// TestOverAuthorCap is the cap's rule alone: pulls are counted by pull
// per author; a newer commit of a pull in hand is never held back (it
// supersedes the older one); trusted pushes are never capped.
func TestOverAuthorCap(t *testing.T) {
	t.Parallel()
	const spam, other, owner = "did:plc:spam", "did:plc:other", "did:plc:owner"
	jobs := func(evs ...ingest.Event) []*job {
		var js []*job
		for _, ev := range evs {
			js = append(js, &job{ev: ev})
		}
		return js
	}
	// Two workflows of one pull are one pull.
	twoPulls := jobs(pullEvent(spam, "p1", "a"), pullEvent(spam, "p1", "a"), pullEvent(spam, "p2", "b"), pullEvent(other, "q1", "c"), pushEvent(owner, "r1"))
	for _, tc := range []struct {
		name     string
		inHand   []*job
		ev       ingest.Event
		max      int
		wantOver bool
		wantHeld int
	}{
		{"under the cap", twoPulls, pullEvent(spam, "p3", "d"), 3, false, 2},
		{"at the cap", twoPulls, pullEvent(spam, "p3", "d"), 2, true, 2},
		{"newer commit of a pull in hand", twoPulls, pullEvent(spam, "p2", "e"), 2, false, 2},
		{"another author", twoPulls, pullEvent(other, "q2", "f"), 2, false, 1},
		{"the owner's push", twoPulls, pushEvent(owner, "r2"), 1, false, 0},
		{"no cap", twoPulls, pullEvent(spam, "p3", "d"), NoCap, false, 0},
		{"nothing in hand", nil, pullEvent(spam, "p1", "a"), 1, false, 0},
	} {
		over, held := overAuthorCap(tc.inHand, tc.ev, tc.max)
		if over != tc.wantOver || held != tc.wantHeld {
			t.Errorf("%s: got over %v held %d, want %v %d", tc.name, over, held, tc.wantOver, tc.wantHeld)
		}
	}
}

// TestClaimIndex: a worker takes the owner's push before strangers'
// pulls queued ahead of it, else the oldest job.
func TestClaimIndex(t *testing.T) {
	t.Parallel()
	q := []*job{{ev: pullEvent("did:plc:a", "p1", "a")}, {ev: pullEvent("did:plc:b", "p2", "b")}, {ev: pushEvent("did:plc:o", "r1")}, {ev: pushEvent("did:plc:o", "r2")}}
	if got := claimIndex(q); got != 2 {
		t.Errorf("claimIndex = %d, want 2 (the first push)", got)
	}
	if got := claimIndex(q[:2]); got != 0 {
		t.Errorf("pulls only: claimIndex = %d, want 0", got)
	}
}
